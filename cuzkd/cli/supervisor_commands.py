"""Subcommands of the supervisor: ``run``, ``check-config``, ``status``, ``reload``,
``start|stop|restart``, ``upgrade``.

Config and control-socket errors propagate to :func:`cuzkd.cli.dispatch.main`, which maps them to
exit codes (78, 69, 1).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import http.client
import json
import sys
import time
from typing import Any
from urllib.parse import quote

import msgspec

from cuzkd.cli.control_client import call, get_status
from cuzkd.cli.engine_status import render_engine
from cuzkd.cli.swap_commands import describe_active
from cuzkd.config import (
    START_WAIT_SLACK,
    control_socket,
    control_socket_despite_errors,
    describe_deadlines,
    load_config,
    load_or_default,
    plan_doors,
)
from cuzkd.errors import ConfigError, ControlRequestFailed, ControlUnavailable, UpgradeRefused
from cuzkd.errortext import error_text
from cuzkd.log.configure import LogFormat
from cuzkd.states import ALIVE, UpgradeResult
from cuzkd.status.document import StatusDecoder, StatusDocument
from cuzkd.supervisor.engines.info import EngineInfo
from cuzkd.units import format_bytes, format_duration

#: Seconds a control request may take (start/stop/restart: more, from the engine's timeouts).
DEFAULT_TIMEOUT = 120.0
#: How long ``cuzkd upgrade`` waits for the outcome once the exec is under way.
UPGRADE_WAIT = 60.0
#: How long the supervisor's answer to an upgrade may take: the new program's dry run.
DRY_RUN_WAIT = 90.0
#: Beyond the longest wait the supervisor bounds its answer by (an engine's stop sequence, its
#: start_timeout + START_WAIT_SLACK), how long a control request still waits for that answer:
#: the supervisor's bound decides the outcome, never the client's timeout.
ANSWER_SLACK = 5.0


def register(sub: argparse._SubParsersAction[Any]) -> None:
    """Add this package's subcommands to ``cuzkd``."""
    run = sub.add_parser("run", help="run the supervisor daemon (systemd service, container PID 1)")
    run.add_argument("--config", metavar="PATH", help="TOML config (default: one bundled engine "
                                                      "per GPU, or one CPU engine)")
    run.add_argument("--demo", action="store_true",
                     help="drive bursts of jobs of every proof kind, with idle gaps, into the "
                          "bundled engines (run as demo engines)")
    run.add_argument("--log-format", choices=[f.value for f in LogFormat],
                     help="console lines, JSON lines, or auto: console on a terminal, else "
                          "JSON (default: the config's supervisor.log_format, auto)")
    # cuzkd upgrade's own: the new program's dry run, and its exec (see cuzkd.supervisor.proc
    # .reexec); never typed by a person
    run.add_argument("--handover", metavar="FD", type=int, help=argparse.SUPPRESS)
    run.add_argument("--handover-check", metavar="FD:FD", help=argparse.SUPPRESS)
    run.set_defaults(handler=_run)

    upgrade = sub.add_parser("upgrade", help="re-execute the supervisor as the cuzkd now "
                                             "installed, keeping its engines and door running")
    upgrade.add_argument("--check", action="store_true",
                         help="only ask the new program whether it can take over (dry run)")
    upgrade.add_argument("--config", metavar="PATH", help="config naming the control socket")
    upgrade.add_argument("--timeout", metavar="SECONDS", type=float, default=UPGRADE_WAIT,
                         help=f"how long to wait for the outcome (default {UPGRADE_WAIT:g})")
    upgrade.set_defaults(handler=_upgrade)

    check = sub.add_parser("check-config", help="validate a config file without starting")
    check.add_argument("path", metavar="PATH")
    check.set_defaults(handler=_check_config)

    status = sub.add_parser("status", help="show the supervised engines, or one engine's "
                                           "workers, jobs, budget and trouble")
    status.add_argument("name", metavar="NAME", nargs="?",
                        help="one engine: its GPU workers, jobs, memory budget, exit causes, "
                             "stalls and last stderr lines")
    status.add_argument("--config", metavar="PATH", help="config naming the control socket")
    status.add_argument("--json", action="store_true", help="print the control API's JSON")
    status.add_argument("--watch", metavar="SECONDS", nargs="?", type=float, const=1.0,
                        help="with NAME: redraw every SECONDS (default 1) until Ctrl-C")
    status.set_defaults(handler=_status)

    reload = sub.add_parser("reload", help="apply the config file again and wait for the "
                                           "outcome (what systemctl reload runs)")
    reload.add_argument("--config", metavar="PATH", help="config naming the control socket")
    reload.set_defaults(handler=_reload)

    for verb in ("start", "stop", "restart"):
        cmd = sub.add_parser(verb, help=f"{verb} one engine")
        cmd.add_argument("name", metavar="NAME")
        cmd.add_argument("--config", metavar="PATH", help="config naming the control socket")
        cmd.set_defaults(handler=_engine_action, verb=verb)

    door = sub.add_parser("door", help="the front doors: their held calls and quarantined "
                                       "request ids; release one")
    door.add_argument("--config", metavar="PATH", help="config naming the control socket")
    door.add_argument("--json", action="store_true", help="print the control API's JSON")
    door_verbs = door.add_subparsers(dest="door_verb", metavar="VERB")
    release = door_verbs.add_parser("release", help="end a request id's quarantine: the door "
                                                    "relays it again")
    release.add_argument("request_id", metavar="REQUEST_ID")
    release.add_argument("--config", metavar="PATH", default=argparse.SUPPRESS,
                         help="config naming the control socket")
    door.set_defaults(handler=_door)


def _run(args: argparse.Namespace) -> int:
    from cuzkd.log.configure import configure_queued_logging  # the daemon's imports: `run` only
    from cuzkd.supervisor.daemon.adoption import check_handover, take_handover
    from cuzkd.supervisor.daemon.root import Supervisor

    if args.handover_check is not None:
        return check_handover(args.handover_check)
    handover = None if args.handover is None else take_handover(args.handover)
    config = load_or_default(args.config) if handover is None else handover.config
    sink = configure_queued_logging(level=config.supervisor.log_level,
                                    log_format=args.log_format or config.supervisor.log_format)
    try:
        return asyncio.run(Supervisor(
            config, demo=args.demo or (handover is not None and handover.handed.demo),
            log_drops=sink.dropped, log_flush=sink.flush, log_format=args.log_format,
            handover=None if handover is None else handover.handed).run())
    finally:
        sink.close()


def _upgrade(args: argparse.Namespace) -> int:
    """``cuzkd upgrade [--check]``: exit 0 once the new code runs (or, with --check, would
    take over); 1 when refused or failed, with why (the supervisor runs on as it was, unless
    the new code failed after the exec: then it stopped the engines and exited 1)."""
    config = load_or_default(args.config, resolve_hosts=False)
    socket = control_socket(config)
    accepted = call(socket, "POST", "/v1/upgrade", timeout=DRY_RUN_WAIT,
                    body={"check": bool(args.check)})
    if args.check:
        print(f"upgrade possible: cuzkd {accepted['old']} -> {accepted['new']} "
              f"({accepted['program']})")
        return 0
    print(f"upgrading: cuzkd {accepted['old']} -> {accepted['new']} ...", flush=True)
    deadline = time.monotonic() + args.timeout
    while time.monotonic() < deadline:
        try:
            last = call(socket, "GET", "/v1/upgrade", timeout=args.timeout)["last"]
        except ControlUnavailable:
            raise UpgradeRefused("the supervisor exited during the upgrade (the new code "
                                 "failed after the exec): see its log") from None
        if last is not None and last["id"] == accepted["id"]:
            if last["outcome"] != UpgradeResult.UPGRADED:
                raise UpgradeRefused(f"upgrade {last['outcome']}: {last['error']}")
            print(f"upgraded: cuzkd {last['old']} -> {last['new']} (same pid; supervision "
                  f"gap {last['gap_seconds']:.3f} s)")
            return 0
        time.sleep(0.05)
    raise UpgradeRefused(f"no outcome within {args.timeout:g} s: see the supervisor's log")


def _check_config(args: argparse.Namespace) -> int:
    config = load_config(args.path)
    for notice in config.notices:
        print(f"warning: {notice}", file=sys.stderr)
    names = ", ".join(e.name for e in config.engine)
    print(f"{args.path}: OK ({len(config.engine)} engine(s): {names})")
    for door in plan_doors(config):
        print(f"door {door.address} -> {', '.join(door.engines)} "
              f"(hold_timeout {door.hold_timeout:g}s)")
        print(f"  deadlines ([metrics] proof_deadlines, [door] proving_allowance): "
              f"{describe_deadlines(door)}")
        if door.one_post:
            print(f"  one PoSt at a time: {', '.join(sorted(door.one_post))}")
    return 0


def _control(args: argparse.Namespace, method: str, path: str,
             timeout: float = DEFAULT_TIMEOUT, body: Any = None) -> Any:
    config = load_or_default(args.config, resolve_hosts=False)
    return call(control_socket(config), method, path, timeout=timeout, body=body)


def _door(args: argparse.Namespace) -> int:
    if getattr(args, "door_verb", None) == "release":
        body = _control(args, "POST", "/v1/doors/release", body={"request_id": args.request_id})
        print(f"released {body['released']!r} ({', '.join(body['doors'])})")
        return 0
    body = _control(args, "GET", "/v1/doors")
    if args.json:
        print(json.dumps(body, indent=2))
        return 0
    for door in body["doors"]:
        print(f"door {door['address']} -> {', '.join(door['engines'])}: "
              f"{door['held_calls']} held")
    _print_doors(body)
    return 0


def _print_doors(body: dict[str, Any]) -> None:
    """The door process in one line, then one line per quarantined request id: which door
    and engine, for how long yet."""
    process = body.get("process")
    if process is not None:
        pid = process["pid"] if process["pid"] is not None else "-"
        rss = process["resident_memory_bytes"]
        memory = f", RSS {format_bytes(rss)}" if rss is not None else ""
        exits = ", ".join(f"{cause} {n}" for cause, n in sorted(process["exits"].items()))
        bounds = ", ".join(f"{bound} {n}" for bound, n in process["bounds_hit"].items())
        print(f"door process: pid {pid}{memory}, restarts {process['restarts']}"
              f"{'; exits: ' + exits if exits else ''}"
              f"{'; bounds hit: ' + bounds if bounds else ''}")
    for door in body["doors"]:
        for q in door["quarantined"]:
            left = format_duration(max(0.0, q["until"] - time.time()))
            print(f"quarantined: {q['request_id']!r} (door {door['name']}, crashed engine "
                  f"{q['engine']}; {left} left; `cuzkd door release ID` ends it)")


def _status(args: argparse.Namespace) -> int:
    if args.name is not None or args.watch is not None:
        return _engine_status(args)
    body = _control(args, "GET", "/v1/engines")
    if args.json:
        print(json.dumps(body, indent=2))
        return 0
    print(f"{'ENGINE':<16} {'STATE':<9} {'PID':>7} {'UPTIME':>9} {'RESTARTS':>8}  "
          f"{'RELEASE':<16}  LAST EXIT")
    for eng in msgspec.convert(body["engines"], list[EngineInfo]):
        print(f"{eng.name:<16} {eng.state:<9} {eng.pid or '-':>7} "
              f"{_uptime(eng.started_at):>9} {eng.restarts:>8}  "
              f"{eng.release or '-':<16}  {_last_exit(eng)}")
    active = describe_active(body["release"]) if "release" in body else None
    if active is not None:
        print(active)
    with contextlib.suppress(ControlRequestFailed):  # no door process answering now
        _print_doors(_control(args, "GET", "/v1/doors"))
    return 0


def _uptime(started_at: float | None) -> str:
    return "-" if started_at is None else format_duration(time.time() - started_at)


def _engine_status(args: argparse.Namespace) -> int:
    """``cuzkd status NAME [--watch [SECONDS]]``: see :mod:`cuzkd.cli.engine_status`."""
    if args.name is None or (args.watch is not None and args.watch <= 0):
        print("cuzkd status: --watch needs an engine NAME and a positive number of seconds",
              file=sys.stderr)
        return 2
    redraw = args.watch is not None and sys.stdout.isatty() and not args.json
    try:
        while True:
            frame = _engine_frame(args)
            # On a terminal, home the cursor and clear: the view is redrawn in place.
            sys.stdout.write(("\x1b[H\x1b[2J" if redraw else "") + frame)
            sys.stdout.flush()
            if args.watch is None:
                return 0
            if not redraw:
                sys.stdout.write("\n")  # frames of a piped --watch, one blank line apart
            time.sleep(args.watch)
    except KeyboardInterrupt:
        return 0


def _engine_frame(args: argparse.Namespace) -> str:
    body = _control(args, "GET", "/v1/engines")
    engines = msgspec.convert(body["engines"], list[EngineInfo])
    info = next((e for e in engines if e.name == args.name), None)
    if info is None:
        raise ControlRequestFailed(f"no engine named {args.name!r}")
    doc: StatusDocument | None = None
    error: str | None = None
    if info.status_address is None:  # supervised by its process alone: no document
        error = "no status_url: supervised by its process alone"
    elif info.state in ALIVE:
        try:
            decoded = StatusDecoder().decode(get_status(info.status_address))
        except (OSError, http.client.HTTPException, ValueError) as exc:  # incl. decode errors
            error = error_text(exc)
        else:  # what this view shows: the document fetched here, not the supervisor's last
            doc = decoded.document
            info = msgspec.structs.replace(info, status_field_errors=decoded.left_out())
    if args.json:
        status = None if doc is None else msgspec.to_builtins(doc)
        return json.dumps({"engine": info.as_json(), "status": status, "error": error},
                          indent=2) + "\n"
    return render_engine(info, doc, error, time.time())


def _last_exit(eng: EngineInfo) -> str:
    text = eng.last_exit_cause or "-"
    if eng.next_restart_at:
        text += f" (restart in {max(0.0, eng.next_restart_at - time.time()):.1f}s)"
    if eng.last_error:
        text += f" error: {eng.last_error}"
    if eng.status_field_errors:
        text += f" status fields {eng.status_field_errors}"
    return text


def _reload(args: argparse.Namespace) -> int:
    """Exit 0 once the supervisor applied its config file again (removed and changed engines
    stopped, new ones started); 78 with the supervisor's reason (file and key) when it refused
    the file and kept the running config.

    A file that does not validate here is sent to the supervisor all the same: it must refuse
    it itself, so that its metrics and the reload alert show it.
    """
    refused: ConfigError | None = None
    try:
        config = load_or_default(args.config, resolve_hosts=False)
    except ConfigError as exc:
        refused, socket, timeout = exc, control_socket_despite_errors(args.config), DEFAULT_TIMEOUT
    else:
        # The reload waits for the stop sequences of changed engines, as they run them now.
        socket = control_socket(config)
        timeout = max([DEFAULT_TIMEOUT,
                       *(e.stop_budget + ANSWER_SLACK for e in config.engine)])
    try:
        body = call(socket, "POST", "/v1/reload", timeout=timeout)
    except ControlRequestFailed as exc:
        if exc.status == 422:  # refused: a config error, exit 78
            raise ConfigError(str(exc)) from None
        raise
    except ControlUnavailable:
        if refused is not None:  # the file's own error says more than a missing socket
            raise refused from None
        raise
    print(f"reloaded: {len(body['engines'])} engine(s): {', '.join(body['engines'])}")
    return 0


def _engine_action(args: argparse.Namespace) -> int:
    """start/restart answer once the engine is ``running``, stop once it is stopped; the
    supervisor bounds each wait by the engine's own timeouts, and exit 1 says why it failed."""
    config = load_or_default(args.config, resolve_hosts=False)
    spec = next((e for e in config.engine if e.name == args.name), None)
    # The supervisor's waits are bounded by the engine's timeouts (as it runs them: the file
    # may have changed since), so wait for its answer at least that long.
    timeout = DEFAULT_TIMEOUT if spec is None else max(
        DEFAULT_TIMEOUT, spec.stop_budget + spec.start_timeout + START_WAIT_SLACK + ANSWER_SLACK)
    # Quoted: a name with '/', '?' or '#' must reach the API as a name ("no engine named").
    info = msgspec.convert(call(control_socket(config), "POST",
                                f"/v1/engines/{quote(args.name, safe='')}/{args.verb}",
                                timeout=timeout), EngineInfo)
    print(f"{info.name}: {info.state} (pid {info.pid or '-'})")
    return 0
