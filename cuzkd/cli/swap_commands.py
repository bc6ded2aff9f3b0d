"""``cuzkd swap PATH [--smoke ARGS [--smoke-timeout 30s]] [--settle 10s] [--analysis DURATION
[--canary N] ...]``, ``--rollback``, ``--history [--json]``.

Talks to ``POST /v1/swap`` on the control socket and prints each step as it streams in.
Exit 0 when every affected engine ended healthy on the new release, 1 when the swap was refused
or rolled back, or the rollback refused or undone (the reason is printed), 75 (EX_TEMPFAIL: try
again later) when the supervisor shut down meanwhile and cancelled it, 69 when the
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

from cuzkd.cli.control_client import BASE_URL, call, control_session
from cuzkd.config import control_socket, load_or_default
from cuzkd.errors import EX_TEMPFAIL
from cuzkd.states import OnInconclusive, SwapResult
from cuzkd.swap.history import ReleaseVerdict


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
    canary = swap.add_argument_group(
        "canary analysis", "move --canary engines first, compare them with the engines still "
        "on the old release (one engine: with its own window before the swap) for --analysis, "
        "then move the rest or roll back (docs/swap.md)")
    canary.add_argument("--analysis", metavar="DURATION",
                        help="compare the canaries this long (e.g. 10m); without it, no analysis")
    canary.add_argument("--canary", metavar="N", type=int,
                        help="engines moved first (default 1)")
    canary.add_argument("--min-throughput-ratio", metavar="R", type=float,
                        help="partitions per busy GPU second of the canary against the old "
                             "engines, per proof kind (default 0.8)")
    canary.add_argument("--min-partitions", metavar="N", type=int,
                        help="partitions of a kind each side needs for it to count (default 20)")
    canary.add_argument("--max-failed-jobs", metavar="N", type=int,
                        help="failed jobs allowed on the canary (default 0)")
    canary.add_argument("--check", metavar="CMD",
                        help="your own check, run (no shell) with CUZKD_CANARY_ENGINE and "
                             "CUZKD_CANARY_STATUS_URL set and --analysis as timeout; exit 0 "
                             "passes")
    canary.add_argument("--on-inconclusive", choices=[o.value for o in OnInconclusive],
                        help="too little work to decide: go on or roll back (default rollback)")
    swap.add_argument("--config", metavar="PATH", help="config naming the control socket")
    swap.set_defaults(handler=_swap)


#: ``--analysis`` companions: request field -> argparse dest (all None unless given).
ANALYSIS_OPTIONS = ("canary", "min_throughput_ratio", "min_partitions", "max_failed_jobs",
                    "check", "on_inconclusive")


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
    given = [name for name in ANALYSIS_OPTIONS if getattr(args, name) is not None]
    if (given or args.analysis) and not args.path:
        print("cuzkd swap: --analysis and its options go with a swap to PATH", file=sys.stderr)
        return 2
    if given and args.analysis is None:
        print(f"cuzkd swap: --{given[0].replace('_', '-')} goes with --analysis",
              file=sys.stderr)
        return 2
    config = load_or_default(args.config, resolve_hosts=False)
    if args.history:
        return _history(control_socket(config), as_json=args.json)
    request: dict[str, Any] = {"settle": args.settle}
    if args.rollback:
        request["rollback"] = True
    else:
        # The supervisor resolves the path itself: make it absolute against our cwd.
        request["path"] = str(Path(args.path).absolute())
        if args.smoke is not None:
            request["smoke"] = args.smoke
            request["smoke_timeout"] = args.smoke_timeout
        if args.analysis is not None:
            request["analysis"] = args.analysis
            request.update({name: getattr(args, name) for name in given})
    operation = "rollback" if args.rollback else "swap"
    return asyncio.run(_stream(control_socket(config), request, operation))


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
    if release["verdict"] == ReleaseVerdict.PENDING:
        line += " (not yet healthy through the settle period)"
    elif release["verdict"] is not None:
        line += f" at {when(release['decided_at'])}"
    if release["verdict"] == ReleaseVerdict.REJECTED:
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
            return EX_TEMPFAIL if resp.status == 503 else 1  # 503: shutting down
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
    if step == "analysis":
        return describe_analysis(event["analysis"])
    details = " ".join(f"{k}={v}" for k, v in event.items() if v is not None)
    return f"  {step:<12} {details}"


def describe_analysis(verdict: dict[str, Any]) -> str:
    """The verdict and its numbers: one line, then one per proof kind."""
    lines = [f"  {'analysis':<12} {verdict['result']} (baseline: {verdict['baseline']}): "
             f"{'; '.join(verdict['reasons'])}"]
    for kind in verdict["kinds"]:
        ratio = "-" if kind["ratio"] is None else f"{kind['ratio']:.2f}"
        rates = [("-" if r is None else f"{r:.2f}/s")
                 for r in (kind["canary_rate"], kind["baseline_rate"])]
        lines.append(f"  {'':<12} {kind['proof_kind']:<12} canary {kind['canary_partitions']} "
                     f"partitions at {rates[0]}, baseline {kind['baseline_partitions']} at "
                     f"{rates[1]}: ratio {ratio}")
    lines.append(f"  {'':<12} failed jobs on the canary: {verdict['canary_failed_jobs']}"
                 + ("" if verdict["check"] is None else f"; check: {verdict['check']}"))
    return "\n".join(lines)


def _report(result: dict[str, Any], operation: str) -> int:
    if not result:
        print("cuzkd swap: the supervisor closed the stream without a result", file=sys.stderr)
        return 1
    if result["result"] == SwapResult.OK:
        print(f"{operation} ok: release {result['release']} active, engines: "
              f"{', '.join(result['engines']) or 'none use {binary}'}")
        return 0
    print(f"{operation} {result['result']}: {result['reason']} "
          f"(active release: {result['release']})", file=sys.stderr)
    return EX_TEMPFAIL if result["result"] == SwapResult.CANCELLED else 1
