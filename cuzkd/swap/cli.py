"""``cuzkd swap PATH [--smoke ARGS [--smoke-timeout 30s]] [--settle 10s]``, ``--rollback``,
``--history [--json]``.

Talks to ``POST /v1/swap`` on the control socket and prints each step as it streams in.
Exit 0 when every affected engine ended healthy on the new release, 1 when the swap was refused
or rolled back, or the rollback refused or undone (the reason is printed), 69 when the
supervisor can't be reached, 78 for a bad config. ``--history`` reads ``GET /v1/swap/history``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from cuzkd.config import load_or_default
from cuzkd.control_client import BASE_URL, call, control_session


def register(sub: argparse._SubParsersAction[Any]) -> None:
    """Add ``swap`` to ``cuzkd``."""
    swap = sub.add_parser(
        "swap",
        help="atomically swap the engine binary, with rolling restart and automatic rollback",
    )
    swap.add_argument("path", metavar="PATH", nargs="?", help="the new engine binary")
    swap.add_argument("--rollback", action="store_true",
                      help="go back to the last accepted release before the active one")
    swap.add_argument("--history", action="store_true",
                      help="list the releases put into service and their verdicts")
    swap.add_argument("--json", action="store_true", help="with --history: print the JSON")
    swap.add_argument("--smoke", metavar="ARGS",
                      help="run the new binary with ARGS first (e.g. \"--version\"); "
                      "it must exit 0")
    swap.add_argument("--smoke-timeout", metavar="DURATION", default="30s",
                      help="how long the smoke run may take (default 30s)")
    swap.add_argument("--settle", metavar="DURATION", default="10s",
                      help="how long each restarted engine must stay healthy (default 10s)")
    swap.add_argument("--config", metavar="PATH", help="config naming the control socket")
    swap.set_defaults(handler=_swap)


def join_smoke_value(argv: Sequence[str]) -> list[str]:
    """``cuzkd swap ... --smoke ARGS`` → ``--smoke=ARGS``, for the top-level parser.

    argparse reads a lone word starting with ``-`` after an option as another option, so the
    documented ``--smoke "--version"`` would fail with "expected one argument"; glued with
    ``=`` it is the option's value.
    """
    words = list(argv)
    for i, word in enumerate(words[:-1]):
        if word == "--smoke" and "swap" in words[:i]:
            return [*words[:i], f"--smoke={words[i + 1]}", *words[i + 2:]]
    return words


def _swap(args: argparse.Namespace) -> int:
    if sum(map(bool, (args.path, args.rollback, args.history))) != 1:
        print("cuzkd swap: give a PATH, --rollback or --history", file=sys.stderr)
        return 2
    if args.json and not args.history:
        print("cuzkd swap: --json goes with --history", file=sys.stderr)
        return 2
    config = load_or_default(args.config, resolve_hosts=False)
    if args.history:
        return _history(config.control_socket, as_json=args.json)
    request: dict[str, Any] = {"settle": args.settle}
    if args.rollback:
        request["rollback"] = True
    else:
        # The supervisor resolves the path itself: make it absolute against our cwd.
        request["path"] = str(Path(args.path).absolute())
        if args.smoke is not None:
            request["smoke"] = args.smoke
            request["smoke_timeout"] = args.smoke_timeout
    operation = "rollback" if args.rollback else "swap"
    return asyncio.run(_stream(config.control_socket, request, operation))


def _history(socket_path: Path, *, as_json: bool) -> int:
    body = call(socket_path, "GET", "/v1/swap/history")
    if as_json:
        print(json.dumps(body, indent=2))
        return 0
    if not body["records"]:
        print("no release history yet (the first swap or initial_binary starts it)")
        return 0
    print(f"{'RELEASE':<16}  {'VERDICT':<8}  {'IN SERVICE SINCE':<20}  {'DECIDED':<20}  "
          f"{'ORIGIN':<14}  {'NOTE':<15}  REASON")
    for rec in body["records"]:
        note = ("active" if rec["release"] == body["active"] else
                "rollback target" if rec["release"] == body["rollback_target"] else "")
        print(f"{rec['release']:<16}  {rec['verdict']:<8}  {when(rec['activated_at']):<20}  "
              f"{when(rec['decided_at']):<20}  {rec['origin']:<14}  {note:<15}  "
              f"{rec['reason'] or '-'}")
    return 0


def when(timestamp: float | None) -> str:
    """A Unix time as the operator reads it, in UTC; ``-`` for none."""
    if timestamp is None:
        return "-"
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(timestamp))


def describe_active(release: dict[str, Any]) -> str | None:
    """One line on the active release and its verdict (``cuzkd status``); None without one."""
    if release.get("error"):
        return f"release store unusable: {release['error']}"
    if release["id"] is None:
        return None
    line = f"active release {release['id']}: {release['verdict'] or 'not in the history'}"
    if release["verdict"] == "pending":
        line += " (not yet healthy through the settle period)"
    elif release["verdict"] is not None:
        line += f" at {when(release['decided_at'])}"
    if release["verdict"] == "rejected":
        line += f": {release['reason']}"
    return line


async def _stream(socket_path: Path, request: dict[str, Any], operation: str) -> int:
    import aiohttp  # here, not at the top: registering `swap` must not cost every cuzkd call

    # No total timeout: a rolling restart takes as long as the engines need to become healthy.
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=10)
    async with (
        control_session(socket_path, timeout) as session,
        session.post(BASE_URL + "/v1/swap", json=request) as resp,
    ):
        if resp.status >= 400:
            body = await resp.json(content_type=None)
            print(f"cuzkd swap: refused: {body.get('error')}", file=sys.stderr)
            return 1
        result: dict[str, Any] = {}
        async for raw in resp.content:
            event = json.loads(raw)
            if event.get("event") == "result":
                result = event
            else:
                print(_describe(event), flush=True)
    return _report(result, operation)


def _describe(event: dict[str, Any]) -> str:
    step = event.pop("event", "?")
    details = " ".join(f"{k}={v}" for k, v in event.items() if v is not None)
    return f"  {step:<12} {details}"


def _report(result: dict[str, Any], operation: str) -> int:
    if not result:
        print("cuzkd swap: the supervisor closed the stream without a result", file=sys.stderr)
        return 1
    if result["result"] == "ok":
        print(f"{operation} ok: release {result['release']} active, engines: "
              f"{', '.join(result['engines']) or 'none use {binary}'}")
        return 0
    print(f"{operation} {result['result']}: {result['reason']} "
          f"(active release: {result['release']})", file=sys.stderr)
    return 1
