"""``cuzkd swap PATH [--smoke ARGS [--smoke-timeout 30s]] [--settle 10s]``, ``--rollback``.

Talks to ``POST /v1/swap`` on the control socket and prints each step as it streams in.
Exit 0 when every affected engine ended healthy on the new release, 1 when the swap was refused
or rolled back (the reason is printed), 69 when the supervisor can't be reached, 78 for a bad
config.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from cuzkd.config import load_or_default
from cuzkd.control_client import BASE_URL, control_session


def register(sub: argparse._SubParsersAction[Any]) -> None:
    """Add ``swap`` to ``cuzkd``."""
    swap = sub.add_parser(
        "swap",
        help="atomically swap the engine binary, with rolling restart and automatic rollback",
    )
    swap.add_argument("path", metavar="PATH", nargs="?", help="the new engine binary")
    swap.add_argument("--rollback", action="store_true",
                      help="go back to the previous release instead")
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
    if bool(args.path) == bool(args.rollback):
        print("cuzkd swap: give a PATH or --rollback", file=sys.stderr)
        return 2
    config = load_or_default(args.config)
    request: dict[str, Any] = {"settle": args.settle}
    if args.rollback:
        request["rollback"] = True
    else:
        # The supervisor resolves the path itself: make it absolute against our cwd.
        request["path"] = str(Path(args.path).absolute())
        if args.smoke is not None:
            request["smoke"] = args.smoke
            request["smoke_timeout"] = args.smoke_timeout
    return asyncio.run(_stream(config.control_socket, request))


async def _stream(socket_path: Path, request: dict[str, Any]) -> int:
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
    return _report(result)


def _describe(event: dict[str, Any]) -> str:
    step = event.pop("event", "?")
    details = " ".join(f"{k}={v}" for k, v in event.items() if v is not None)
    return f"  {step:<12} {details}"


def _report(result: dict[str, Any]) -> int:
    if not result:
        print("cuzkd swap: the supervisor closed the stream without a result", file=sys.stderr)
        return 1
    if result["result"] == "ok":
        print(f"swap ok: release {result['release']} active, engines: "
              f"{', '.join(result['engines']) or 'none use {binary}'}")
        return 0
    print(f"swap {result['result']}: {result['reason']} (active release: {result['release']})",
          file=sys.stderr)
    return 1
