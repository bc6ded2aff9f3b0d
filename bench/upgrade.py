"""``cuzkd upgrade`` under a Curio-like load: what an upgrade in place costs Curio, against a
plain restart of cuzkd.

One ``cuzkd run`` supervises the cuzk stand-in (tests/support/cuzk_standin.py) as a ``type =
"cuzk"`` engine behind cuzkd's front door (callers dial the address in the stand-in's TOML, as
Curio does). cuzkd is started from a program of its own, a console script as pip writes one
whose content sets ``cuzkd.__version__`` (``install`` of
tests/supervisor/daemon/test_upgrade_e2e.py); each run replaces it atomically by one that says
it is the next version (as ``pip install -U`` does) and runs ``cuzkd upgrade --config CFG``
with the program now installed, as an operator would. The tree is the same before and after:
the upgrade of a build of this tree to itself under another version string.

Each of ``--runs`` runs: bench/door.py's Curio-like load (a new raw ``Prove`` every ``--every``
seconds whatever is in flight, cycling PoRep C2 carrying ``--payload-mb`` of C1 output,
SnapDeals, WindowPoSt and WinningPoSt with Curio's priorities), ``--warm`` seconds, ``cuzkd
upgrade``, ``--warm`` seconds more, then every call awaited. Reported per run:

- the calls, those that ended in a gRPC error (by code), the proofs completed and FAILED, the
  calls in flight through the whole supervision gap (sent before the old code's
  ``supervisor_upgrading``, answered after the new code's ``supervisor_upgraded``; PoRep C2
  and WinningPoSt among them) and those sent during it;
- the engine's, the door process's (``GET /v1/doors``) and the supervisor's pids before and
  after, and ``cuzkd_engine_restarts_total`` before and after;
- the supervision gap as cuzkd measures it (``GET /v1/upgrade``: the old code's last decision
  to the new code's first), the wall time from ``supervisor_upgrading``'s log timestamp to
  ``supervisor_upgraded``'s, and how long ``cuzkd upgrade`` took (request to its return: the
  new program's dry run included);
- a scraper thread GETs ``/metrics`` every 50 ms (a new connection each: one made while the
  listener is held waits in its backlog for the new code) and times each answer: the longest
  during the upgrade (the scrapes that overlap the request to the CLI's return) and outside it,
  and the failed scrapes; every ``_total`` series of every scrape is checked against the one
  before it (a series that went down), and the scrape before the upgrade against the one after
  the run (a series that went down or vanished).

``--breakdown``: the programs installed carry a few lines more (:data:`STAMPS`) that note when
the new program began after the hand-over and how long it took to import cuzkd's daemon: what
the gap is made of.

Then, for comparison, the same load through a plain restart of cuzkd (``--no-restart``: not
run): SIGTERM to the supervisor, and the same program started again on the same config once
it exited, what ``systemctl restart cuzkd`` does without ``cuzkd.socket``. Default timeouts
(``shutdown_grace`` 30 s, ``stop_timeout`` 10 s: a 20 s shutdown drain). Reported as
bench/door.py reports its stops: the calls failed, the proofs lost, whether the engine's pid
changed, and how long cuzkd was away.

Prints Markdown tables (docs/benchmarks.md, *cuzkd upgraded in place*).

    .venv/bin/python bench/upgrade.py [--runs 3] [--every 0.2] [--warm 6] [--no-restart]
        [--breakdown]
"""

from __future__ import annotations

import argparse
import asyncio
import http.client
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))  # door.py (which puts tests/ on the path)

from door import MIX, CurioLoad, counter, tally  # noqa: E402
from support.cuzk_harness import cuzk_engine  # noqa: E402
from support.door_under_test import Door  # noqa: E402
from support.ports import free_port  # noqa: E402
from support.supervisor_harness import start_supervisor, write_config  # noqa: E402


def _e2e() -> object:
    """tests/supervisor/daemon/test_upgrade_e2e.py: its ``install`` (a cuzkd of a version,
    put in place as pip does), ``counters`` (every ``_total`` series) and ``door_pid``."""
    path = REPO / "tests" / "supervisor" / "daemon" / "test_upgrade_e2e.py"
    spec = importlib.util.spec_from_file_location("upgrade_e2e", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


E2E = _e2e()
install: Callable[[Path, str, str], None] = E2E.install  # type: ignore[attr-defined]
counters: Callable[[Door], dict[str, float]] = E2E.counters  # type: ignore[attr-defined]
door_pid: Callable[[Door], int] = E2E.door_pid  # type: ignore[attr-defined]

#: seconds between two scrapes' starts
SCRAPE_EVERY = 0.05
_TOTAL = re.compile(r"[a-z_]+_total(\{|$)")


@dataclass
class Scrape:
    began: float
    ended: float
    #: every ``_total`` series (None: the scrape failed)
    totals: dict[str, float] | None


class Scraper:
    """GETs ``url`` every :data:`SCRAPE_EVERY` seconds on a thread of its own (a new
    connection each, as urllib makes one), each answer timed and its ``_total`` series kept."""

    def __init__(self, url: str) -> None:
        self._url = url
        self._stop = threading.Event()
        self.scrapes: list[Scrape] = []
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            began = time.monotonic()
            totals: dict[str, float] | None
            try:
                with urllib.request.urlopen(self._url, timeout=30) as resp:
                    text = resp.read().decode()
                ended = time.monotonic()
                totals = {series: float(value) for series, _, value in
                          (line.rpartition(" ") for line in text.splitlines()
                           if not line.startswith("#")) if _TOTAL.match(series)}
            except (OSError, http.client.HTTPException):
                ended, totals = time.monotonic(), None
            self.scrapes.append(Scrape(began, ended, totals))
            self._stop.wait(max(0.0, began + SCRAPE_EVERY - time.monotonic()))

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(60)

    def between(self, start: float, end: float) -> list[Scrape]:
        """The scrapes whose span overlaps [start, end]."""
        return [s for s in list(self.scrapes) if s.ended >= start and s.began <= end]

    def went_down(self, start: float, end: float) -> list[str]:
        """The ``_total`` series some scrape in [start, end] showed below the one before it
        (series, before -> after)."""
        down: dict[str, str] = {}
        last: dict[str, float] = {}
        for s in self.between(start, end):
            for series, value in (s.totals or {}).items():
                if series in last and value < last[series] and series not in down:
                    down[series] = f"{series} {last[series]:g} -> {value:g}"
                last[series] = value
        return list(down.values())


@dataclass
class Stand:
    """The supervised stand-in: the door (its supervisor, address, run directory), cuzkd's
    program file and the scraper of its metrics."""

    door: Door
    program: Path
    scraper: Scraper

    @property
    def pids(self) -> tuple[int, int, int]:
        """(engine, door process, supervisor)."""
        return self.door.running(), door_pid(self.door), int(self.door.sup.about()["pid"])

    def restarts(self) -> float:
        return sum(counter(self.door.sup, "cuzkd_engine_restarts_total").values())


@contextmanager
def stand(args: argparse.Namespace) -> Iterator[Stand]:
    tmp = Path(tempfile.mkdtemp(prefix="czu", dir="/tmp"))
    if args.keep:
        print(f"run directory: {tmp}", file=sys.stderr)
    env = {"CUZK_STANDIN_SYNTH_SECS": str(args.synth), "CUZK_STANDIN_GPU_SECS": str(args.gpu),
           "CUZK_STANDIN_POST_SECS": str(args.post)}
    program = tmp / "cuzkd"
    install(program, "1.0.0", "")
    engine, address = cuzk_engine(tmp, "cz", env=env, door="")  # "cz": Door's
    listen = f"127.0.0.1:{free_port()}"  # fixed: the restart binds it again
    config = write_config(tmp, [engine], metrics={"listen": listen})
    door = Door(tmp, start_supervisor(config, timeout=60, program=[str(program)]), address)
    scraper = None
    try:
        door.running()
        scraper = Scraper(f"http://{listen}/metrics")
        yield Stand(door, program, scraper)
    finally:
        if scraper is not None:
            scraper.stop()
        door.sup.stop(timeout=90)
        if not args.keep:
            shutil.rmtree(tmp, ignore_errors=True)


@dataclass
class Loaded:
    """What the callers saw of one run: each call's result, and when it was sent and ended."""

    results: list[tuple[str, bytes | None]]
    spans: list[tuple[float, float]]
    #: the action's start and end (monotonic)
    began: float
    ended: float

    def calls(self) -> Iterator[tuple[str, float, float, str]]:
        """(kind, sent, answered, gRPC code) of each call, in the order sent (the load
        sends the kinds of :data:`door.MIX` in turn; a call sent later ended later or not)."""
        for i, ((sent, answered), (code, _)) in enumerate(zip(sorted(self.spans),
                                                              self.results, strict=True)):
            yield MIX[i % len(MIX)][0], sent, answered, code

    def spanning(self, start: float, end: float) -> tuple[Counter[str], int]:
        """The calls sent before ``start`` and answered after ``end`` (by kind), and how
        many of them failed."""
        return self._kinds(lambda sent, answered: sent < start and answered > end)

    def sent_in(self, start: float, end: float) -> tuple[Counter[str], int]:
        """The calls sent in [start, end] (by kind), and how many of them failed."""
        return self._kinds(lambda sent, _: start <= sent <= end)

    def _kinds(self, chosen: Callable[[float, float], bool]) -> tuple[Counter[str], int]:
        calls = [(kind, code) for kind, sent, answered, code in self.calls()
                 if chosen(sent, answered)]
        return Counter(kind for kind, _ in calls), sum(code != "OK" for _, code in calls)


def under_load(args: argparse.Namespace, address: str, payload: bytes,
               action: Callable[[], object]) -> Loaded:
    """The Curio-like load, ``--warm`` s, ``action`` (on a thread), ``--warm`` s, every call
    awaited."""
    async def scenario() -> Loaded:
        load = CurioLoad(address, payload, args.every)
        runner = asyncio.create_task(load.run())
        await asyncio.sleep(args.warm)
        began = time.monotonic()
        await asyncio.to_thread(action)
        ended = time.monotonic()
        await asyncio.sleep(args.warm)
        results = await load.finish()
        await runner
        return Loaded(results, list(load.spans), began, ended)

    return asyncio.run(scenario())


#: a log timestamp (wall clock) less this is on the monotonic clock the bench times with
WALL = time.time() - time.monotonic()


def _logged_at(event: dict[str, object]) -> float:
    """The monotonic time of a log event (its ``timestamp``)."""
    return datetime.fromisoformat(str(event["timestamp"])).timestamp() - WALL


def _none() -> tuple[Counter[str], int]:
    return Counter(), 0


@dataclass
class Outcome:
    """What the callers saw of a run, and the pids (engine, door process, supervisor) before
    and after it."""

    calls: int = 0
    errors: Counter[str] = field(default_factory=Counter)
    completed: int = 0
    failed: int = 0
    pids_before: tuple[int, int, int] = (0, 0, 0)
    pids_after: tuple[int, int, int] = (0, 0, 0)

    def saw(self, loaded: Loaded) -> None:
        self.calls = len(loaded.results)
        self.errors, self.completed, self.failed = tally(loaded.results)


@dataclass
class UpgradeRun(Outcome):
    version: str = ""
    #: the calls in flight through the whole gap (by kind), and the failed among them
    spanning: tuple[Counter[str], int] = field(default_factory=_none)
    #: the calls sent during the gap (by kind), and the failed among them
    sent_in_gap: tuple[Counter[str], int] = field(default_factory=_none)
    restarts: tuple[float, float] = (0, 0)
    #: GET /v1/upgrade's gap_seconds, the log's upgrading -> upgraded, the CLI's whole
    gap: float = 0.0
    logged: float = 0.0
    took: float = 0.0
    cli: str = ""
    longest_during: float = 0.0
    longest_outside: float = 0.0
    scrapes_during: int = 0
    failed_scrapes: int = 0
    #: _total series that went down between two scrapes of the run, and from before to after
    down: list[str] = field(default_factory=list)
    down_overall: list[str] = field(default_factory=list)
    #: --breakdown: the exec to the new program's first line, and its imports of cuzkd
    breakdown: tuple[float, float] | None = None


#: --breakdown: lines the installed programs carry after setting their version, which note
#: when the new program began after the old one's hand-over and how long cuzkd's daemon
#: imports took it (the modules ``cuzkd run`` imports, then found imported)
STAMPS = """
if "--handover" in sys.argv:
    import json, os, time
    handover = int(sys.argv[sys.argv.index("--handover") + 1])
    began = time.monotonic() - json.loads(os.pread(handover, 1 << 24, 0))["handed_at"]
    imported = time.monotonic()
    import cuzkd.log.configure, cuzkd.supervisor.daemon.adoption, cuzkd.supervisor.daemon.root
    with open({path!r}, "a") as out:
        out.write(json.dumps([began, time.monotonic() - imported]) + "\\n")
"""


def measure_upgrade(s: Stand, args: argparse.Namespace, payload: bytes,
                    version: str) -> UpgradeRun:
    run = UpgradeRun(version=version)
    run.pids_before, run.restarts = s.pids, (s.restarts(), 0)
    before = counters(s.door)
    stamps = s.door.tmp / "stamps"
    install(s.program, version, STAMPS.format(path=str(stamps)) if args.breakdown else "")
    done: list[subprocess.CompletedProcess[str]] = []
    started = time.monotonic()

    def upgrade() -> None:
        done.append(subprocess.run([str(s.program), "upgrade", "--config",
                                    str(s.door.sup.config)], capture_output=True, text=True,
                                   timeout=180))

    loaded = under_load(args, s.door.address, payload, upgrade)
    finished = time.monotonic()
    [cli] = done
    if cli.returncode != 0:
        raise SystemExit(f"cuzkd upgrade failed ({cli.returncode}): {cli.stdout}{cli.stderr}")
    run.cli = cli.stdout.strip().splitlines()[-1]
    run.saw(loaded)
    run.pids_after, run.restarts = s.pids, (run.restarts[0], s.restarts())
    status, body = s.door.sup.request("GET", "/v1/upgrade")
    assert status == 200 and body["last"]["new"] == version, body
    last = body["last"]
    run.gap = float(last["gap_seconds"])
    [upgrading] = s.door.sup.events("supervisor_upgrading", upgrade_id=last["id"])
    [upgraded] = s.door.sup.events("supervisor_upgraded", upgrade_id=last["id"])
    gap_began, gap_ended = _logged_at(upgrading), _logged_at(upgraded)
    run.logged = gap_ended - gap_began
    run.spanning = loaded.spanning(gap_began, gap_ended)
    run.sent_in_gap = loaded.sent_in(gap_began, gap_ended)
    run.took = loaded.ended - loaded.began
    during = s.scraper.between(loaded.began, loaded.ended)
    outside = [x for x in s.scraper.between(started, finished) if x not in during]
    run.scrapes_during = len(during)
    run.longest_during = max((x.ended - x.began for x in during), default=0.0)
    run.longest_outside = max((x.ended - x.began for x in outside), default=0.0)
    run.failed_scrapes = sum(x.totals is None for x in s.scraper.between(started, finished))
    run.down = s.scraper.went_down(started, finished)
    after = counters(s.door)
    run.down_overall = [f"{k} {v:g} -> {after.get(k, 'gone')}" for k, v in before.items()
                        if after.get(k, -1.0) < v]
    if args.breakdown:
        began, imports = json.loads(stamps.read_text().splitlines()[-1])
        run.breakdown = (began, imports)
    return run


@dataclass
class RestartRun(Outcome):
    #: the calls in flight at the SIGTERM (by kind), and the failed among them
    in_flight: tuple[Counter[str], int] = field(default_factory=_none)
    #: the calls sent while cuzkd was away (by kind), and the failed among them
    sent_away: tuple[Counter[str], int] = field(default_factory=_none)
    #: SIGTERM to the old supervisor's exit, and to the new one's engine running
    stopped: float = 0.0
    away: float = 0.0
    failed_scrapes: int = 0
    exit_code: int | None = None


def measure_restart(s: Stand, args: argparse.Namespace, payload: bytes) -> RestartRun:
    """SIGTERM to the supervisor, and the same program started again on the same config."""
    run = RestartRun(pids_before=s.pids)

    def restart() -> None:
        began = time.monotonic()
        run.exit_code = s.door.sup.stop(timeout=120)
        run.stopped = time.monotonic() - began
        s.door.sup = start_supervisor(s.door.sup.config, timeout=60,
                                      program=[str(s.program)])
        s.door.running()
        run.away = time.monotonic() - began

    loaded = under_load(args, s.door.address, payload, restart)
    run.saw(loaded)
    run.in_flight = loaded.spanning(loaded.began, loaded.began)
    run.sent_away = loaded.sent_in(loaded.began, loaded.ended)
    run.pids_after = s.pids
    run.failed_scrapes = sum(x.totals is None
                             for x in s.scraper.between(loaded.began, loaded.ended))
    return run


def _errors(errors: Counter[str]) -> str:
    return ", ".join(f"{code} {n}" for code, n in errors.most_common()) or "0"


def _kinds(flight: Counter[str], failed: int) -> str:
    return (f"{sum(flight.values())}: {flight['porep-c2']} PoRep C2, "
            f"{flight['winning-post']} WinningPoSt ({failed} failed)")


def _pid(before: int, after: int) -> str:
    return f"{before} (same)" if before == after else f"{before} -> **{after}**"


def _pids(before: tuple[int, int, int], after: tuple[int, int, int]) -> str:
    return " | ".join(_pid(b, a) for b, a in zip(before, after, strict=True))


def report(runs: list[UpgradeRun], restart: RestartRun | None) -> None:
    print("| run | upgrade | calls | in flight through the gap | sent during the gap | "
          "gRPC errors | completed | FAILED | proofs lost |")
    print("|---|---|---:|---|---|---|---:|---:|---:|")
    for i, r in enumerate(runs, 1):
        print(f"| {i} | {r.cli.split('(')[0].removeprefix('upgraded: ').strip()} | {r.calls} "
              f"| {_kinds(*r.spanning)} | {_kinds(*r.sent_in_gap)} | {_errors(r.errors)} | "
              f"{r.completed} | {r.failed} "
              f"| {r.calls - r.completed} |")
    print("\n| run | engine pid | door process pid | supervisor pid | engine restarts before "
          "/ after | gap (`GET /v1/upgrade`) | `supervisor_upgrading` → `supervisor_upgraded` "
          "(log) | `cuzkd upgrade` took | longest `/metrics` answer during / outside the "
          "upgrade (scrapes during) | failed scrapes | `_total` series that went down |"
          + (" of the gap: to the new program's first line / its imports |"
             if runs and runs[0].breakdown else ""))
    print("|---|---|---|---|---|---:|---:|---:|---|---:|---|"
          + ("---|" if runs and runs[0].breakdown else ""))
    for i, r in enumerate(runs, 1):
        down = "; ".join(r.down + [f"{d} (before → after)" for d in r.down_overall])
        split = ("" if r.breakdown is None else
                 f" {r.breakdown[0] * 1e3:.0f} / {r.breakdown[1] * 1e3:.0f} ms |")
        print(f"| {i} | {_pids(r.pids_before, r.pids_after)} | {r.restarts[0]:g} / "
              f"{r.restarts[1]:g} | {r.gap * 1e3:.0f} ms | {r.logged * 1e3:.0f} ms | "
              f"{r.took:.2f} s | {r.longest_during * 1e3:.0f} / {r.longest_outside * 1e3:.0f} "
              f"ms ({r.scrapes_during}) | {r.failed_scrapes} | {down or 'none'} |{split}")
    if restart is None:
        return
    print("\n| plain restart (SIGTERM, started again) | calls | in flight at the SIGTERM | "
          "sent while cuzkd was away | gRPC errors | completed | FAILED | "
          "proofs lost | engine pid | door process pid | supervisor pid | old cuzkd exited "
          "after | cuzkd away (SIGTERM → engine running) | failed scrapes meanwhile |")
    print("|---|---:|---|---|---|---:|---:|---:|---|---|---|---:|---:|---:|")
    x = restart
    print(f"| exit {x.exit_code} | {x.calls} | {_kinds(*x.in_flight)} | "
          f"{_kinds(*x.sent_away)} | {_errors(x.errors)} | {x.completed} | "
          f"{x.failed} | {x.calls - x.completed} | {_pids(x.pids_before, x.pids_after)} | "
          f"{x.stopped:.1f} s | {x.away:.1f} s | {x.failed_scrapes} |")


#: the load's and the stand-in's knobs (those of bench/door.py's stops, ``--every`` 0.2: three
#: 51 MB PoReps in flight at a time)
KNOBS = (("--payload-mb", 51.0, "MB of C1 output a PoRep C2 request carries"),
         ("--every", 0.2, "s between Curio's calls"),
         ("--warm", 6.0, "s of load before and after each upgrade (and the restart)"),
         ("--synth", 0.2, "s per partition synthesis"), ("--gpu", 0.05, "GPU s per partition"),
         ("--post", 0.3, "s per PoSt proof"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3, help="upgrades, one after another")
    for flag, default, what in KNOBS:
        parser.add_argument(flag, type=float, default=default, help=what)
    parser.add_argument("--no-restart", action="store_true", help="skip the plain restart")
    parser.add_argument("--breakdown", action="store_true",
                        help="programs that note what the gap is made of (see STAMPS)")
    parser.add_argument("--json", metavar="PATH", help="also write the figures as JSON")
    parser.add_argument("--keep", action="store_true", help="keep the run's directory")
    args = parser.parse_args()
    payload = os.urandom(int(args.payload_mb * 1e6))
    began = time.monotonic()
    with stand(args) as s:
        runs = []
        for i in range(args.runs):
            runs.append(measure_upgrade(s, args, payload, f"1.{i + 1}.0"))
            print(f"run {i + 1}: {runs[-1].cli}", file=sys.stderr)
        restart = None if args.no_restart else measure_restart(s, args, payload)
    report(runs, restart)
    print(f"\n({time.monotonic() - began:.0f} s in all)")
    if args.json:
        Path(args.json).write_text(json.dumps(
            {"runs": [r.__dict__ for r in runs],
             "restart": None if restart is None else restart.__dict__}, default=str, indent=1))


if __name__ == "__main__":
    main()
