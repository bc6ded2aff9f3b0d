"""The door keeps deadlines, before and after: a real ``cuzkd run`` of the base commit and of
this working tree, each in front of this tree's cuzk stand-in (tests/support/cuzk_standin.py,
which loses a PoSt queued beside another as cuzk does), under a Curio-like caller.

    .venv/bin/python bench/door_deadlines.py [--scenario NAME ...] [--versions before after]
        [--cuzkd-src /tmp/cuzkd-base] [--json PATH] [--keep]

``after`` is this tree's cuzkd (``python -m cuzkd`` with the venv); ``before`` is the cuzkd at
``--cuzkd-src`` (a worktree of the base commit, made with ``git worktree add`` when missing),
run with ``PYTHONPATH`` naming it and from a directory of its own (``python -m`` puts the
working directory first on ``sys.path``). The engine is always this tree's stand-in, behind
release wrappers (``{binary}``) so that ``cuzkd swap`` can install another. Both versions get
the same config keys; ``after`` also gets ``[door] proving_allowance``, which the base refuses.

Durations are the real ones times ``--scale`` (1/10), except those said otherwise below:

================================  ==========  =========================================
what                              real        here (scale 1/10)
================================  ==========  =========================================
PoRep C2 (10 partitions)          ~150 s      ~15 s: synthesis 3.5 s a partition, 3 at a
                                              time (``max_parallel_synthesis``), GPU 0.3 s
WinningPoSt / WindowPoSt proof    ~0.8 s      0.08 s (``POST_SECS``; ``POST_SYNTH_SECS`` 0)
SRS load at start                 30-90 s     6 s (``CUZK_STANDIN_START_DELAY``)
deadline winning-post             20 s        2 s (``[metrics] proof_deadlines``)
deadline window-post              20 min      120 s
proving_allowance (after only)    5 s / 2 min 0.5 s / 12 s
drain_timeout                     180 s       18 s (``cuzkd-restart``: 180 s, see there)
backoff_max / backoff_reset_after 30 s / 60 s 3 s / 6 s
door hold_timeout                 300 s       30 s
Curio's WinningPoSt               1 / epoch   every 3 s
Curio's Prove timeout             30 min      180 s
swap --settle, release_settle     10 s        1 s
================================  ==========  =========================================

Not scaled: grpc's own 20 s connect (handshake) deadline, ``shutdown_grace`` 30 s and
``stop_timeout`` 10 s (shipped: they decide what a restart of cuzkd costs a connection),
``start_timeout`` 30 s (the stand-in binds ``/status`` only after its SRS load, unlike cuzk),
and cuzkd's watch cadence (``health_interval`` 1 s, ``unhealthy_after`` 15 s, the drain's
0.5 s status reads), which the issue does not measure.

Scenarios (``--scenario``; all by default), each before and after:

- ``stops``: one engine; WinningPoSt latency (sent -> answered) during a ``cuzkd restart``
  (``POST /v1/engines/cuzk/restart``), a ``cuzkd swap`` to another release and a reload that
  changes the engine's env, each with PoReps in flight; per stop: the WinningPoSts sent
  between the stop's request and the new process running, and those of the next
  ``--after-window`` seconds (a fresh process's first PoRep).
- ``never-answer``: a restart and a swap with a call the engine will never answer in flight
  (``CUZK_STANDIN_NEVER_ANSWER``) beside one real PoRep: the drain's length
  (``engine_drain_requested`` -> ``engine_drained``) and how long after the real work ended.
- ``poison``: a request that crashes the engine each time (``CUZK_STANDIN_CRASH_ON``) sent with
  three innocent PoReps, then re-sent 4 times by its caller: crashes, innocents lost, what its
  caller saw.
- ``cuzkd-restart``: cuzkd on a socket passed as ``cuzkd.socket`` does, stopped by SIGTERM
  under the Curio-like load and started again on the same socket: every call by outcome.
- ``same-id``: two engines behind one door; the same request id sent twice at once with the
  same bytes: how many times an engine was given it.
- ``fresh-burst`` (only when named): a fresh engine given 3 PoReps and a SnapDeals at once (as
  a restart's held calls are released), then a WinningPoSt every second: which are refused,
  and the order in which the engine started the jobs.

Prints Markdown tables; ``--json`` writes every figure (and every call) to a file.
"""

from __future__ import annotations

import argparse
import asyncio
import atexit
import concurrent.futures
import contextlib
import itertools
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import tomllib
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import grpc

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))  # support: the stand-in, activation, the harness

from support.activation import activated  # noqa: E402
from support.cuzk_standin import SCRIPT, write_cuzk_toml  # noqa: E402
from support.ports import free_port  # noqa: E402
from support.supervisor_harness import RunningSupervisor, to_toml  # noqa: E402
from support.waiting import wait_until  # noqa: E402

from cuzkd.cuzk import proving_pb2 as pb  # noqa: E402

BASE_COMMIT = "43744c2"
PROVE = "/cuzk.v1.ProvingEngine/Prove"
MIB = 1 << 20
#: Curio's client limits each way
LIMIT = 256 * MIB
MINER = 1000
SCENARIOS = ("stops", "never-answer", "poison", "cuzkd-restart", "same-id")
#: What the old cuzkd's door tells a call it held when it exits (after: docs/door.md)
RESTART_REFUSAL = "cuzkd stopped (a restart or a stop)"


# -- durations -----------------------------------------------------------------------------------

@dataclass(frozen=True)
class Scale:
    """Every duration of a run, from the real ones times ``factor``."""

    factor: float

    def s(self, real: float) -> float:
        return real * self.factor

    def d(self, real: float) -> str:
        """A duration as a config file spells it."""
        return f"{self.s(real):g}s"

    # the real figures
    @property
    def porep_synth(self) -> float:  # one partition; 3 at a time, 10 partitions: ~4 waves
        return self.s(35.0)

    @property
    def porep_gpu(self) -> float:
        return self.s(3.0)

    @property
    def post(self) -> float:
        return self.s(0.8)

    @property
    def srs_load(self) -> float:
        return self.s(60.0)

    @property
    def winning_deadline(self) -> float:
        return self.s(20.0)

    @property
    def epoch(self) -> float:
        return self.s(30.0)

    @property
    def prove_timeout(self) -> float:
        return self.s(1800.0)

    def knobs(self) -> dict[str, str]:
        return {"CUZK_STANDIN_SYNTH_SECS": f"{self.porep_synth:g}",
                "CUZK_STANDIN_GPU_SECS": f"{self.porep_gpu:g}",
                "CUZK_STANDIN_POST_SECS": f"{self.post:g}",
                "CUZK_STANDIN_POST_SYNTH_SECS": "0",
                "CUZK_STANDIN_START_DELAY": f"{self.srs_load:g}"}

    def deadlines(self) -> dict[str, str]:
        return {"winning-post": self.d(20), "window-post": self.d(1200)}

    def allowances(self) -> dict[str, str]:
        return {"winning-post": self.d(5), "window-post": self.d(120)}

    def describe(self) -> str:
        return (f"scale {self.factor:g}: PoRep ~{self.porep_synth * 4 + self.porep_gpu:.1f} s "
                f"(synthesis {self.porep_synth:g} s x 4 waves of 3 partitions, GPU "
                f"{self.porep_gpu:g} s a partition), PoSt {self.post:g} s, SRS load "
                f"{self.srs_load:g} s, deadlines winning-post {self.d(20)} window-post "
                f"{self.d(1200)}, allowance (after) {self.d(5)} / {self.d(120)}, drain_timeout "
                f"{self.d(180)}, WinningPoSt every {self.epoch:g} s, Prove timeout "
                f"{self.prove_timeout:g} s; not scaled: grpc's 20 s connect deadline, "
                "shutdown_grace 30 s, stop_timeout 10 s, start_timeout 30 s, health cadence")


# -- processes: every one started here is ended on exit ---------------------------------------

_PROCS: list[subprocess.Popen[bytes]] = []
_ENGINE_PIDS: set[int] = set()


def _cleanup() -> None:
    """End every cuzkd this bench started (SIGTERM, then SIGKILL), then any engine pid seen
    that outlived it (each by its pid)."""
    for proc in _PROCS:
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + 40
    for proc in _PROCS:
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(max(0.1, deadline - time.monotonic()))
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    for pid in _ENGINE_PIDS:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)


atexit.register(_cleanup)


_INTERRUPTED = threading.Event()


def _interrupt(signum: int, frame: Any) -> None:
    """Ctrl-C or SIGTERM: unwind (each run stops its cuzkd), calls in flight cancelled at
    once."""
    _INTERRUPTED.set()
    raise KeyboardInterrupt


# -- the two versions ------------------------------------------------------------------------

@dataclass(frozen=True)
class Version:
    name: str
    #: the source tree whose ``cuzkd`` package runs (None: this tree, through the venv)
    src: Path | None

    @property
    def after(self) -> bool:
        return self.src is None

    def environ(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("LISTEN_")}
        env.pop("PYTHONPATH", None)
        if self.src is not None:
            env["PYTHONPATH"] = str(self.src)
        return env

    def cli(self, cwd: Path, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[
            str]:
        return subprocess.run([sys.executable, "-m", "cuzkd", *args], cwd=cwd,
                              env=self.environ(), capture_output=True, text=True,
                              timeout=timeout)


def base_worktree(path: Path) -> Path:
    if not (path / "cuzkd" / "__init__.py").exists():
        subprocess.run(["git", "-C", str(REPO), "worktree", "add", str(path), BASE_COMMIT],
                       check=True, stdout=subprocess.DEVNULL)
    return path


def start_cuzkd(version: Version, config: Path, log_path: Path, *,
                prefix: tuple[str, ...] = (), pass_fds: tuple[int, ...] = (),
                timeout: float = 60) -> RunningSupervisor:
    """``cuzkd run --config CONFIG`` of ``version`` (in its own session: a Ctrl-C reaches
    this bench only, which stops it), its JSON log in ``log_path``; returns once its control
    socket answers."""
    raw = tomllib.loads(config.read_text())
    state_dir = Path(raw["supervisor"]["state_dir"])
    log_fh = log_path.open("ab")
    proc = subprocess.Popen([*prefix, sys.executable, "-m", "cuzkd", "run", "--config",
                             str(config)], cwd=config.parent, stdin=subprocess.DEVNULL,
                            stdout=log_fh, stderr=subprocess.STDOUT, env=version.environ(),
                            pass_fds=pass_fds, start_new_session=True)
    _PROCS.append(proc)
    sup = RunningSupervisor(proc, config, state_dir, log_path, state_dir / "control.sock",
                            log_fh)

    def ready() -> bool:
        if proc.poll() is not None:
            raise RuntimeError(f"cuzkd exited {proc.returncode}:\n{log_path.read_text()[-3000:]}")
        try:
            return sup.request("GET", "/v1/supervisor", timeout=2)[0] == 200
        except OSError:
            return False

    wait_until(ready, timeout, "cuzkd's control socket", interval=0.1)
    return sup


def running(sup: RunningSupervisor, name: str, timeout: float = 90, not_pid: int | None = None
            ) -> int:
    """The engine's pid once it runs (another than ``not_pid``)."""
    engine = sup.wait_engine(name, lambda e: e["state"] == "running" and e["pid"] not in (
        None, not_pid), timeout=timeout)
    _ENGINE_PIDS.add(int(engine["pid"]))
    return int(engine["pid"])


def release(tmp: Path, name: str) -> Path:
    """A release of the stand-in ``cuzkd swap`` can install (this tree's stand-in whichever
    cuzkd runs it)."""
    path = tmp / name
    path.write_text(f"#!/bin/sh\n# release {name}\nexport PYTHONPATH={REPO}\n"
                    f"exec {sys.executable} {SCRIPT} \"$@\"\n")
    path.chmod(0o755)
    return path


def engine_table(tmp: Path, name: str, scale: Scale, env: dict[str, str], *,
                 listen: str | None = None, **keys: Any) -> tuple[dict[str, Any], str]:
    """(the ``[[engine]]`` table of a stand-in cuzk behind its door, the door's address: the
    cuzk TOML's ``[daemon] listen``, as Curio dials it)."""
    listen = listen or f"unix://{tmp}/{name}-grpc.sock"
    toml = write_cuzk_toml(tmp / f"{name}.toml", listen, f"127.0.0.1:{free_port()}",
                           '[memory]\ntotal_budget = "140GiB"\n'
                           "[pipeline]\nmax_parallel_synthesis = 3\n")
    table = {"name": name, "type": "cuzk", "command": ["{binary}", "-c", str(toml)],
             "env": {**scale.knobs(), **env}, "drain_timeout": scale.d(180),
             "backoff_max": scale.d(30), "backoff_reset_after": scale.d(60), **keys}
    return table, listen


def write_cuzkd_config(tmp: Path, version: Version, scale: Scale, engines: list[dict[str, Any]],
                       **supervisor: Any) -> Path:
    """cuzkd's config: keys both versions know, and ``[door] proving_allowance`` for after."""
    door: dict[str, Any] = {"hold_timeout": scale.d(300)}
    if version.after:
        door["proving_allowance"] = scale.allowances()
    tables = {
        "supervisor": {"state_dir": str(tmp / "state"), "shutdown_grace": "30s",
                       "initial_binary": str(release(tmp, "cuzk-a")),
                       "release_settle": scale.d(10), **supervisor},
        "metrics": {"listen": "127.0.0.1:0", "proof_deadlines": scale.deadlines()},
        "door": door,
        "engine": engines,
    }
    path = tmp / "cuzkd.toml"
    path.write_text(to_toml(tables))
    return path


@dataclass
class Run:
    version: Version
    tmp: Path
    sup: RunningSupervisor
    address: str
    scale: Scale

    def cli(self, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        return self.version.cli(self.tmp, *args, "--config", str(self.sup.config),
                                timeout=timeout)

    def events(self, event: str, **match: Any) -> list[dict[str, Any]]:
        return self.sup.events(event, **match)


@contextlib.contextmanager
def tmpdir(keep: bool, label: str) -> Iterator[Path]:
    tmp = Path(tempfile.mkdtemp(prefix=f"czdl-{label}-", dir="/tmp"))
    try:
        yield tmp
    finally:
        if keep:
            print(f"  kept {tmp}", file=sys.stderr)
        else:
            shutil.rmtree(tmp, ignore_errors=True)


@contextlib.contextmanager
def cuzkd_with(version: Version, scale: Scale, keep: bool, label: str,
               env: dict[str, str] | None = None, names: tuple[str, ...] = ("cuzk",),
               shared: bool = False, **engine_keys: Any) -> Iterator[Run]:
    """cuzkd of ``version`` with stand-ins ``names`` behind a door (``shared``: one door, every
    TOML naming the same listen), each engine running."""
    with tmpdir(keep, f"{label}-{version.name}") as tmp:
        listen = f"unix://{tmp}/curio.sock" if shared else None
        tables, address = [], ""
        for name in names:
            table, address = engine_table(tmp, name, scale, env or {}, listen=listen,
                                          **engine_keys)
            tables.append(table)
        config = write_cuzkd_config(tmp, version, scale, tables)
        sup = start_cuzkd(version, config, tmp / "cuzkd.log")
        try:
            for name in names:
                running(sup, name)
            yield Run(version, tmp, sup, address, scale)
        finally:
            sup.stop(timeout=60)


# -- log events ----------------------------------------------------------------------------------

def wall(record: dict[str, Any]) -> float:
    return datetime.fromisoformat(record["timestamp"].replace("Z", "+00:00")).timestamp()


#: monotonic = wall - this (the bench's calls are timed on the monotonic clock)
WALL_OFFSET = time.time() - time.monotonic()


def mono(record: dict[str, Any]) -> float:
    return wall(record) - WALL_OFFSET


def signal_exits(run: Run) -> list[dict[str, Any]]:
    return [e for e in run.events("engine_exited")
            if "signal" in str(e.get("cause", "")) + str(e.get("process_cause", ""))]


def brief_events(run: Run, names: tuple[str, ...]) -> list[str]:
    """The named events of the run, each in a line: seconds since the first, the event and
    its main fields."""
    out = []
    records = [r for name in names for r in run.events(name)]
    records.sort(key=wall)
    start = wall(records[0]) if records else 0.0
    for r in records:
        fields = {k: v for k, v in r.items() if k not in ("timestamp", "event", "level",
                                                          "logger", "stderr_tail")}
        out.append(f"+{wall(r) - start:6.2f}s {r['event']} {json.dumps(fields)[:240]}")
    return out


# -- a Curio-like caller ------------------------------------------------------------------------

KIND = {"winning-post": pb.WINNING_POST, "window-post": pb.WINDOW_POST_PARTITION,
        "porep-c2": pb.POREP_SEAL_COMMIT, "snap-update": pb.SNAP_DEALS_UPDATE}
PRIORITY = {"winning-post": pb.CRITICAL, "window-post": pb.HIGH}


def request_bytes(kind: str, request_id: str) -> bytes:
    """A Prove as Curio sends it: WinningPoSt CRITICAL, WindowPoSt HIGH, the rest NORMAL."""
    return pb.ProveRequest(submit=pb.SubmitProofRequest(
        request_id=request_id, proof_kind=KIND[kind],
        priority=PRIORITY.get(kind, pb.NORMAL), sector_size=32 << 30)).SerializeToString()


@dataclass
class Call:
    kind: str
    request_id: str
    sent: float
    ended: float | None = None
    #: the result's status (COMPLETED, FAILED), a gRPC code, or UNANSWERED (cancelled at the
    #: end of the run: its caller was still waiting)
    outcome: str = ""
    details: str = ""

    @property
    def latency(self) -> float | None:
        return None if self.ended is None else self.ended - self.sent

    @property
    def proved(self) -> bool:
        return self.outcome == "COMPLETED"


@dataclass
class Lanes:
    """What the caller keeps sending: a WinningPoSt every ``winning_every`` seconds (0: none),
    ``wdpost`` WindowPoSt partitions at a time every ``wdpost_every`` seconds, ``porep`` PoReps
    and ``snap`` SnapDeals in flight."""

    winning_every: float = 0.0
    wdpost: int = 0
    wdpost_every: float = 0.0
    porep: int = 0
    snap: int = 0


class Curio:
    """One grpc connection (insecure, 256 MiB, no ``wait_for_ready``), calls as Curio sends
    them, every call recorded."""

    def __init__(self, address: str, timeout: float) -> None:
        self.channel = grpc.aio.insecure_channel(address, options=[
            ("grpc.max_send_message_length", LIMIT), ("grpc.max_receive_message_length", LIMIT)])
        self.prove_rpc: Any = self.channel.unary_unary(PROVE)
        self.timeout = timeout
        self.calls: list[Call] = []
        self.tasks: set[asyncio.Task[Call]] = set()
        self.lanes: list[asyncio.Task[None]] = []
        self.stopping = asyncio.Event()
        self._sectors = itertools.count(1)
        self._epochs = itertools.count(4_000_000)
        self._deadline_index = itertools.count(3)

    async def prove(self, kind: str, request_id: str, data: bytes | None = None,
                    timeout: float | None = None) -> Call:
        call = Call(kind, request_id, time.monotonic())
        self.calls.append(call)
        try:
            reply = await self.prove_rpc(data or request_bytes(kind, request_id),
                                         timeout=timeout or self.timeout)
            result = pb.ProveResponse.FromString(reply).result
            call.outcome = pb.AwaitProofResponse.Status.Name(result.status)
            call.details = result.error_message
        except grpc.aio.AioRpcError as exc:
            call.outcome, call.details = exc.code().name, exc.details() or ""
        except asyncio.CancelledError:
            call.outcome = "UNANSWERED"
        call.ended = time.monotonic()
        return call

    def spawn(self, kind: str, request_id: str, data: bytes | None = None,
              timeout: float | None = None) -> asyncio.Task[Call]:
        task = asyncio.create_task(self.prove(kind, request_id, data, timeout))
        self.tasks.add(task)
        return task

    def start(self, lanes: Lanes) -> None:
        if lanes.winning_every:
            self.lanes.append(asyncio.create_task(self._winning(lanes.winning_every)))
        if lanes.wdpost:
            self.lanes.append(asyncio.create_task(self._wdpost(lanes.wdpost,
                                                               lanes.wdpost_every)))
        for _ in range(lanes.porep):
            self.lanes.append(asyncio.create_task(self._sealing("porep-c2", "porep")))
        for _ in range(lanes.snap):
            self.lanes.append(asyncio.create_task(self._sealing("snap-update", "snap")))

    async def _pause(self, seconds: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.stopping.wait(), seconds)

    async def _winning(self, every: float) -> None:
        while not self.stopping.is_set():
            self.spawn("winning-post", f"winpost-{MINER}-{next(self._epochs)}")
            await self._pause(every)

    async def _wdpost(self, partitions: int, every: float) -> None:
        while not self.stopping.is_set():
            deadline = next(self._deadline_index) % 48
            batch = [self.spawn("window-post", f"wdpost-{MINER}-[{p} 0] dl {deadline}")
                     for p in range(partitions)]
            await asyncio.wait(batch)
            await self._pause(every)

    async def _sealing(self, kind: str, prefix: str) -> None:
        while not self.stopping.is_set():
            call = await self.spawn(kind, f"{prefix}-{MINER}-{next(self._sectors)}")
            if not call.proved:  # Curio's task fails and is tried again later
                await self._pause(1.0)

    async def finish(self, grace: float) -> list[Call]:
        """Send nothing more; give the calls in flight ``grace`` seconds, then cancel them
        (UNANSWERED)."""
        self.stopping.set()
        pending = [t for t in self.tasks if not t.done()]
        if pending:
            await asyncio.wait(pending, timeout=grace)
        for task in self.tasks:
            task.cancel()
        await asyncio.gather(*self.tasks, *self.lanes, return_exceptions=True)
        await self.channel.close()
        return self.calls


class CurioThread:
    """A :class:`Curio` on its own event loop in a thread, driven from synchronous code."""

    def __init__(self, address: str, timeout: float, lanes: Lanes | None = None) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

        async def make() -> Curio:
            curio = Curio(address, timeout)
            if lanes is not None:
                curio.start(lanes)
            return curio

        self.curio: Curio = self.run(make())
        self.calls: list[Call] = self.curio.calls

    def run(self, coroutine: Any, timeout: float | None = 60) -> Any:
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(timeout)

    def send(self, kind: str, request_id: str, data: bytes | None = None,
             timeout: float | None = None) -> concurrent.futures.Future[Call]:
        """One call now; its :class:`Call` when it ends."""
        async def go() -> Call:
            return await self.curio.spawn(kind, request_id, data, timeout)

        return asyncio.run_coroutine_threadsafe(go(), self.loop)

    def finish(self, grace: float) -> list[Call]:
        grace = 0.0 if _INTERRUPTED.is_set() else grace
        try:
            return list(self.run(self.curio.finish(grace), timeout=grace + 30))
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(10)

    def in_flight(self, kind: str, older_than: float = 0.0) -> list[Call]:
        now = time.monotonic()
        return [c for c in list(self.calls) if c.kind == kind and c.ended is None
                and now - c.sent >= older_than]


#: a table's rows: (label, the cell of one version's results)
Rows = list[tuple[str, Callable[[dict[str, Any]], str]]]


# -- figures -------------------------------------------------------------------------------------

def pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def ms(value: float | None) -> str:
    return "-" if value is None else f"{value * 1e3:.0f} ms"


def sec(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f} s"


def winning_summary(calls: list[Call], deadline: float) -> dict[str, Any]:
    """WinningPoSts: how many, proved in time, their p50/max latency, and every other end."""
    proved = [c.latency for c in calls if c.proved and c.latency is not None]
    outcomes = Counter(c.outcome for c in calls)
    late = sum(1 for c in calls if c.proved and (c.latency or 0) > deadline)
    refused = [c for c in calls if c.outcome == "DEADLINE_EXCEEDED"]
    return {
        "n": len(calls), "proved": len(proved), "proved_late": late,
        "in_time": len(proved) - late,
        "p50": pct(proved, 0.5), "max": max(proved) if proved else None,
        "refused_deadline": len(refused),
        "refused_after": [round(c.latency or 0, 2) for c in refused],
        "failed_other": sum(n for o, n in outcomes.items()
                            if o not in ("COMPLETED", "DEADLINE_EXCEEDED", "UNANSWERED")),
        "unanswered": outcomes.get("UNANSWERED", 0),
        "unanswered_waited_min": min((c.latency or 0 for c in calls
                                      if c.outcome == "UNANSWERED"), default=None),
        "outcomes": dict(outcomes),
        "missed": len(calls) - (len(proved) - late),
    }


def winning_cell(s: dict[str, Any]) -> str:
    return (f"{s['n']} sent: {s['in_time']} in time, {s['proved_late']} late, "
            f"{s['refused_deadline']} refused, {s['failed_other']} failed, "
            f"{s['unanswered']} unanswered" + (
                f" (still waiting after >= {s['unanswered_waited_min']:.0f} s)"
                if s["unanswered"] else "") + f"; p50 {ms(s['p50'])}, max {ms(s['max'])}")


def outcomes_by_kind(calls: list[Call]) -> dict[str, dict[str, int]]:
    out: dict[str, Counter[str]] = {}
    for c in calls:
        out.setdefault(c.kind, Counter())[c.outcome] += 1
    return {k: dict(v) for k, v in sorted(out.items())}


def loadavg() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


# -- scenario: stops ---------------------------------------------------------------------------

CURIO = Lanes(winning_every=3.0, wdpost=2, wdpost_every=10.0, porep=3, snap=1)


def _wait_porep_on_engine(run: Run, curio: CurioThread, name: str = "cuzk") -> int:
    """Wait (up to 60 s) for a PoRep call sent at least 1 s ago still in flight whose job the
    engine started; how many PoReps are in flight."""
    def started() -> bool:
        ids = {c.request_id for c in curio.in_flight("porep-c2", 1.0)}
        return any(e.get("job_id") in ids for e in run.events("proof job started",
                                                              engine=name))

    with contextlib.suppress(AssertionError):
        wait_until(started, 60, "a PoRep on the engine", interval=0.2)
    return len(curio.in_flight("porep-c2"))


def scenario_stops(version: Version, scale: Scale, args: argparse.Namespace) -> dict[str, Any]:
    with cuzkd_with(version, scale, args.keep, "stops") as run:
        swap_to = release(run.tmp, "cuzk-b")
        curio = CurioThread(run.address, scale.prove_timeout, CURIO)
        stops: list[dict[str, Any]] = []
        try:
            time.sleep(args.warm)
            steady_until = time.monotonic()
            for kind in ("restart", "swap", "reload"):
                in_flight = _wait_porep_on_engine(run, curio)
                pid = int(run.sup.engine("cuzk")["pid"])
                asked = time.monotonic()
                if kind == "restart":
                    status, body = run.sup.request("POST", "/v1/engines/cuzk/restart",
                                                   timeout=300)
                    ok, said = status == 200, json.dumps(body)[:200]
                elif kind == "swap":
                    done = run.cli("swap", "--settle", scale.d(10), str(swap_to))
                    ok, said = done.returncode == 0, (done.stdout + done.stderr)[-300:]
                else:  # a reload that changes the engine: an env knob
                    raw = tomllib.loads(run.sup.config.read_text())
                    raw["engine"][0]["env"]["CUZK_STANDIN_BENCH_GENERATION"] = "2"
                    run.sup.config.write_text(to_toml(raw))
                    done = run.cli("reload")
                    ok, said = done.returncode == 0, (done.stdout + done.stderr)[-300:]
                answered = time.monotonic()
                new_pid = running(run.sup, "cuzk", timeout=120, not_pid=pid)
                ready = time.monotonic()
                drained = run.events("engine_drained", pid=pid)
                requested = run.events("engine_drain_requested", pid=pid)
                stops.append({"kind": kind, "ok": ok, "said": said, "porep_in_flight": in_flight,
                              "asked": asked, "answered": answered, "ready": ready,
                              "drained_at": mono(drained[0]) if drained else None,
                              "old_pid": pid, "new_pid": new_pid,
                              "drain_s": (wall(drained[0]) - wall(requested[0])
                                          if drained and requested else None),
                              "drain_result": drained[0].get("result") if drained else None})
                time.sleep(args.after_window)
        finally:
            calls = curio.finish(grace=args.grace)
        result: dict[str, Any] = {"stops": [], "calls": [asdict(c) for c in calls],
                                  "outcomes": outcomes_by_kind(calls)}
        winning = [c for c in calls if c.kind == "winning-post"]
        deadline = scale.winning_deadline
        result["steady"] = winning_summary([c for c in winning if c.sent < steady_until],
                                           deadline)
        for stop in stops:
            during = [c for c in winning if stop["asked"] <= c.sent < stop["ready"]]
            after = [c for c in winning
                     if stop["ready"] <= c.sent < stop["ready"] + args.after_window]
            drained_at = stop["drained_at"] or stop["ready"]
            result["stops"].append({
                **{k: v for k, v in stop.items() if k not in ("asked", "answered", "ready",
                                                              "drained_at")},
                "stop_s": stop["answered"] - stop["asked"],
                "until_running_s": stop["ready"] - stop["asked"],
                "during": winning_summary(during, deadline),
                "during_drain": winning_summary([c for c in during if c.sent < drained_at],
                                                deadline),
                "during_start": winning_summary([c for c in during if c.sent >= drained_at],
                                                deadline),
                "after": winning_summary(after, deadline)})
        result["refusals"] = Counter(e.get("reason") for e in run.events("door_call_refused"))
        result["events"] = brief_events(run, ("engine_drain_requested", "engine_drained",
                                              "door_drain_abandoned", "door_call_refused",
                                              "engine_jobs_lost", "engine_exited"))
        return result


def print_stops(results: dict[str, dict[str, Any]]) -> None:
    names = list(results)
    print("\n### stops: WinningPoSts during each stop of the one engine\n")
    print("| | " + " | ".join(names) + " |")
    print("|---|" + "---|" * len(names))
    print("| steady (before the stops) | " + " | ".join(
        winning_cell(results[n]["steady"]) for n in names) + " |")
    kinds = [s["kind"] for s in results[names[0]]["stops"]]
    for i, kind in enumerate(kinds):
        def cell(n: str, part: str, i: int = i) -> str:
            stops = results[n]["stops"]
            return winning_cell(stops[i][part]) if i < len(stops) else "-"

        print(f"| {kind}: stop request -> new process running | " + " | ".join(
            f"{sec(results[n]['stops'][i]['until_running_s'])} (drain "
            f"{sec(results[n]['stops'][i]['drain_s'])}, "
            f"{results[n]['stops'][i]['drain_result']}, PoReps in flight "
            f"{results[n]['stops'][i]['porep_in_flight']})" for n in names) + " |")
        print(f"| {kind}: WinningPoSts sent meanwhile | " + " | ".join(
            cell(n, "during") for n in names) + " |")
        print(f"| {kind}: of which sent before the drain ended | " + " | ".join(
            cell(n, "during_drain") for n in names) + " |")
        print(f"| {kind}: of which sent after it (old process gone, new one loading) | "
              + " | ".join(cell(n, "during_start") for n in names) + " |")
        print(f"| {kind}: in the next window | " + " | ".join(
            cell(n, "after") for n in names) + " |")
    print("| every call by kind and outcome | " + " | ".join(
        json.dumps(results[n]["outcomes"]) for n in names) + " |")
    print("| door refusals (door_call_refused) | " + " | ".join(
        json.dumps(dict(results[n]["refusals"])) or "-" for n in names) + " |")


# -- scenario: never-answer -------------------------------------------------------------------

NEVER = f"porep-{MINER}-900001"
#: (the stop, a real PoRep in flight beside the call never answered)
NEVER_CASES = (("restart", True), ("swap", True), ("restart", False))


def scenario_never(version: Version, scale: Scale, args: argparse.Namespace) -> dict[str, Any]:
    env = {"CUZK_STANDIN_NEVER_ANSWER": NEVER}
    with cuzkd_with(version, scale, args.keep, "never", env) as run:
        swap_to = release(run.tmp, "cuzk-b")
        curio = CurioThread(run.address, scale.prove_timeout)
        cases = []
        try:
            for n, (kind, with_real) in enumerate(NEVER_CASES):
                real_id = f"porep-{MINER}-{800001 + n}"
                queued = len(run.events("proof request queued", job_id=NEVER))
                never = curio.send("porep-c2", NEVER)
                real = curio.send("porep-c2", real_id) if with_real else None

                def on_engine(real_id: str = real_id, with_real: bool = with_real,
                              queued: int = queued) -> bool:
                    return len(run.events("proof request queued", job_id=NEVER)) > queued and (
                        not with_real or bool(run.events("proof job started", job_id=real_id)))

                wait_until(on_engine, 30, "the calls on the engine", interval=0.1)
                pid = int(run.sup.engine("cuzk")["pid"])
                asked = time.monotonic()
                if kind == "restart":
                    status, _ = run.sup.request("POST", "/v1/engines/cuzk/restart", timeout=300)
                    ok = status == 200
                else:
                    ok = run.cli("swap", "--settle", scale.d(10), str(swap_to)).returncode == 0
                answered = time.monotonic()
                running(run.sup, "cuzk", timeout=120, not_pid=pid)
                [requested] = run.events("engine_drain_requested", pid=pid)
                drained = run.events("engine_drained", pid=pid)
                if real is not None:
                    real_call = real.result(120)
                    completed = run.events("proof completed", job_id=real_id)
                    work_end = mono(completed[0]) if completed else real_call.ended
                else:  # no real work in flight: the drain's own length
                    real_call, work_end = Call("-", "-", 0.0, 0.0, "none"), mono(requested)
                drain_end = mono(drained[0]) if drained else None
                cases.append({
                    "kind": kind + (" beside a real PoRep" if with_real else ", nothing else"),
                    "ok": ok, "stop_request_s": answered - asked,
                    "drain_s": None if drain_end is None else drain_end - mono(requested),
                    "drain_result": drained[0].get("result") if drained else None,
                    "real_work_ended_after_s": (None if work_end is None
                                                else work_end - mono(requested)),
                    "drain_end_after_real_work_s": (None if drain_end is None or work_end is None
                                                    else drain_end - work_end),
                    "real_call": real_call.outcome, "real_call_s": real_call.latency,
                    "abandoned": [(a.get("reason"), a.get("request_id")) for a in
                                  run.events("door_drain_abandoned")
                                  if asked <= mono(a) <= answered],
                })
                # the caller gives up on the call that will never be answered (Curio's would
                # at its ProveTimeout); the door forgets it
                never.cancel()
                for task in list(curio.curio.tasks):
                    if not task.done():
                        curio.loop.call_soon_threadsafe(task.cancel)
                time.sleep(1.0)
        finally:
            calls = curio.finish(grace=1)
        return {"cases": cases, "calls": [asdict(c) for c in calls],
                "events": brief_events(run, ("engine_drain_requested", "engine_drained",
                                             "door_drain_abandoned", "engine_jobs_lost"))}


def print_never(results: dict[str, dict[str, Any]]) -> None:
    names = list(results)
    print("\n### never-answer: a drain with a call cuzk will never answer in flight "
          "(and one real PoRep)\n")
    print("| | " + " | ".join(names) + " |")
    print("|---|" + "---|" * len(names))
    for i, kind in enumerate(c["kind"] for c in results[names[0]]["cases"]):
        rows: Rows = [("drain (engine_drain_requested -> engine_drained)",
                 lambda c: f"{sec(c['drain_s'])} ({c['drain_result']})"),
                ("the real PoRep ended, after the drain request",
                 lambda c: f"{sec(c['real_work_ended_after_s'])} ({c['real_call']})"),
                ("drain end after the real work", lambda c: sec(c["drain_end_after_real_work_s"])),
                ("stop request took", lambda c: sec(c["stop_request_s"])),
                ("door_drain_abandoned", lambda c: str(c["abandoned"]) or "-")]
        for label, cell in rows:
            print(f"| {kind}: {label} | " + " | ".join(
                cell(results[n]["cases"][i]) for n in names) + " |")


# -- scenario: poison ---------------------------------------------------------------------------

POISON = "porep-poison"


def scenario_poison(version: Version, scale: Scale, args: argparse.Namespace) -> dict[str, Any]:
    env = {"CUZK_STANDIN_CRASH_ON": POISON}
    with cuzkd_with(version, scale, args.keep, "poison", env) as run:
        curio = CurioThread(run.address, scale.prove_timeout)
        began = time.monotonic()
        try:
            poison = [curio.send("porep-c2", POISON)]
            innocent = [curio.send("porep-c2", f"porep-{MINER}-{700 + i}") for i in range(3)]
            attempts = [poison[0].result(scale.prove_timeout + 10)]
            for _ in range(4):  # its caller sends it again after each failure
                if attempts[-1].proved:
                    break
                time.sleep(1.0)
                attempts.append(curio.send("porep-c2", POISON).result(scale.prove_timeout + 10))
            for f in innocent:  # what is still waiting after 4 minutes is cancelled below
                with contextlib.suppress(concurrent.futures.TimeoutError):
                    f.result(max(1.0, began + 240 - time.monotonic()))
        finally:
            calls = curio.finish(grace=1)
        innocent_calls = [c for c in calls if c.request_id != POISON]
        return {
            "crashes": len(signal_exits(run)),
            "crash_causes": [e.get("cause") for e in signal_exits(run)],
            "innocent": [(c.request_id, c.outcome, round(c.latency or 0, 1), c.details[:120])
                         for c in innocent_calls],
            "innocent_lost": sum(not c.proved for c in innocent_calls),
            "poison_seen": [(a.outcome, round(a.latency or 0, 1), a.details[:160])
                            for a in attempts],
            "quarantined": [e.get("request_id") for e in run.events("door_request_quarantined")],
            "wall_s": time.monotonic() - began,
            "events": brief_events(run, ("engine_exited", "engine_exit_unexpected",
                                         "door_request_quarantined", "door_call_retried",
                                         "door_call_refused")),
        }


def print_poison(results: dict[str, dict[str, Any]]) -> None:
    names = list(results)
    print("\n### poison: a request that crashes the engine, with 3 innocent PoReps; its "
          "caller sends it 4 more times\n")
    print("| | " + " | ".join(names) + " |")
    print("|---|" + "---|" * len(names))
    rows: Rows = [("engine crashes (engine_exited, signal)",
             lambda r: f"{r['crashes']} {r['crash_causes']}"),
            ("innocent calls lost (of 3)", lambda r: str(r["innocent_lost"])),
            ("innocent calls", lambda r: "; ".join(f"{i[0]} {i[1]} {i[2]} s" + (
                f" ({i[3]})" if i[3] else "") for i in r["innocent"])),
            ("what the poison's caller saw (each send)", lambda r: "; ".join(
                f"{o} after {t} s" + (f" ({d})" if d else "") for o, t, d in r["poison_seen"])),
            ("quarantined", lambda r: str(r["quarantined"]) or "-"),
            ("scenario wall time", lambda r: sec(r["wall_s"]))]
    for label, cell in rows:
        print(f"| {label} | " + " | ".join(cell(results[n]) for n in names) + " |")


# -- scenario: a restart of cuzkd on a passed socket ------------------------------------------

def classify(call: Call) -> str:
    if call.proved:
        return "proved"
    if call.outcome == "UNANSWERED":
        return "in flight when the run ended"
    details = call.details.lower()
    if call.outcome == "UNAVAILABLE" and (RESTART_REFUSAL in call.details
                                          or "cuzkd is shutting down" in call.details):
        return "failed naming the restart"
    # grpc gave up on a connection that got no HTTP/2 SETTINGS in its 20 s; every call waiting
    # on that connection fails with it, whenever it was sent
    if call.outcome == "UNAVAILABLE" and ("before receiving settings" in details or (
            (call.latency or 0) >= 19.0 and any(w in details for w in (
                "connect", "deadline", "timed out", "timeout", "handshake")))):
        return "failed for want of a handshake"
    return "other"


def scenario_cuzkd_restart(version: Version, scale: Scale, args: argparse.Namespace
                           ) -> dict[str, Any]:
    with tmpdir(args.keep, f"cuzkdrestart-{version.name}") as tmp:
        # drain_timeout 180 s as shipped: shutdown_grace (30 s, less stop_timeout 10 s) is what
        # bounds the drain at a shutdown, as on a real host
        table, address = engine_table(tmp, "cuzk", scale, {}, drain_timeout="180s")
        config = write_cuzkd_config(tmp, version, scale, [table])
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as held:
            held.bind(address.removeprefix("unix://"))
            held.listen(256)
            held.set_inheritable(True)
            prefix, fds = tuple(activated(held.fileno(), "door")), (held.fileno(),)
            first = start_cuzkd(version, config, tmp / "cuzkd-1.log", prefix=prefix,
                                pass_fds=fds)
            second: RunningSupervisor | None = None
            try:
                running(first, "cuzk")
                curio = CurioThread(address, scale.prove_timeout, CURIO)
                try:
                    time.sleep(args.warm)
                    in_flight = _wait_porep_on_engine(Run(version, tmp, first, address, scale),
                                                      curio)
                    term = time.monotonic()
                    first.proc.send_signal(signal.SIGTERM)
                    code = first.proc.wait(90)
                    exited = time.monotonic()
                    second = start_cuzkd(version, config, tmp / "cuzkd-2.log", prefix=prefix,
                                         pass_fds=fds)
                    door_up = time.monotonic()
                    running(second, "cuzk")
                    ready = time.monotonic()
                    time.sleep(args.warm)
                finally:
                    calls = curio.finish(grace=args.grace)
            finally:
                first.close()
                if second is not None:
                    second.stop(timeout=60)
        old = Run(version, tmp, first, address, scale)
        drained = old.events("engine_drained")
        requested = old.events("engine_drain_requested")
        across = [c for c in calls if c.sent < ready and (c.ended or 1e18) > term]
        winning = [c for c in calls if c.kind == "winning-post"]
        return {
            "exit_code": code, "porep_in_flight": in_flight,
            "sigterm_to_exit_s": exited - term, "exit_to_new_door_s": door_up - exited,
            "sigterm_to_engine_running_s": ready - term,
            "drain_s": (wall(drained[-1]) - wall(requested[-1])
                        if drained and requested else None),
            "drain_result": drained[-1].get("result") if drained else None,
            "by_outcome": dict(Counter(classify(c) for c in calls)),
            "across_by_outcome": dict(Counter(classify(c) for c in across)),
            "by_kind": {k: dict(Counter(classify(c) for c in calls if c.kind == k))
                        for k in sorted({c.kind for c in calls})},
            "others": sorted(Counter(f"{c.kind} {c.outcome}: {c.details[:110]}"
                                     for c in calls if classify(c) == "other").items()),
            "handshake_failures": [(c.kind, round(c.latency or 0, 1), c.details[:160])
                                   for c in calls
                                   if classify(c) == "failed for want of a handshake"],
            "named_restart": sorted(Counter(c.kind for c in calls if classify(c)
                                            == "failed naming the restart").items()),
            "winning_across": winning_summary([c for c in winning if term <= c.sent < ready],
                                              scale.winning_deadline),
            "winning_after": winning_summary([c for c in winning if c.sent >= ready],
                                             scale.winning_deadline),
            "winning_all": winning_summary(winning, scale.winning_deadline),
            "calls": [asdict(c) for c in calls],
            "events_new": brief_events(Run(version, tmp, second, address, scale), (
                "door_engine_admitted", "proof job started", "door_call_refused")) if second
            else [],
            "events_old": brief_events(old, ("engine_drain_requested", "engine_drained",
                                             "engine_jobs_lost", "door_call_refused",
                                             "shutdown_started", "shutdown_complete")),
        }


def print_cuzkd_restart(results: dict[str, dict[str, Any]]) -> None:
    names = list(results)
    print("\n### cuzkd-restart: SIGTERM to cuzkd on a passed socket (shutdown_grace 30 s), "
          "the next cuzkd on the same socket\n")
    print("| | " + " | ".join(names) + " |")
    print("|---|" + "---|" * len(names))
    rows: Rows = [("SIGTERM -> old cuzkd exited", lambda r: f"{sec(r['sigterm_to_exit_s'])} "
             f"(exit {r['exit_code']}; drain {sec(r['drain_s'])}, {r['drain_result']}; PoReps "
             f"in flight {r['porep_in_flight']})"),
            ("old exit -> new door's control socket", lambda r: sec(r["exit_to_new_door_s"])),
            ("SIGTERM -> new engine running", lambda r: sec(r["sigterm_to_engine_running_s"])),
            ("every call by outcome", lambda r: json.dumps(r["by_outcome"])),
            ("calls spanning the restart", lambda r: json.dumps(r["across_by_outcome"])),
            ("by kind", lambda r: json.dumps(r["by_kind"])),
            ("failed for want of a handshake", lambda r: "; ".join(
                f"{k} after {t} s ({d})" for k, t, d in r["handshake_failures"]) or "0"),
            ("failed naming the restart, by kind", lambda r: str(r["named_restart"])),
            ("other failures", lambda r: "; ".join(f"{n} x {what}" for what, n in r["others"])
             or "0"),
            ("WinningPoSts sent SIGTERM -> new engine running",
             lambda r: winning_cell(r["winning_across"])),
            ("WinningPoSts sent after the new engine was running",
             lambda r: winning_cell(r["winning_after"])),
            ("all WinningPoSts", lambda r: winning_cell(r["winning_all"]))]
    for label, cell in rows:
        print(f"| {label} | " + " | ".join(cell(results[n]) for n in names) + " |")


# -- scenario: one request id twice at once, two engines behind one door -----------------------

def scenario_same_id(version: Version, scale: Scale, args: argparse.Namespace
                     ) -> dict[str, Any]:
    with cuzkd_with(version, scale, args.keep, "sameid", names=("c0", "c1"),
                    shared=True) as run:
        curio = CurioThread(run.address, scale.prove_timeout)
        pairs = [("porep-c2", f"porep-{MINER}-77{i}") for i in range(3)] + [
            ("winning-post", f"winpost-{MINER}-{4_100_000 + i}") for i in range(2)]
        try:
            futures = []
            for kind, request_id in pairs:
                data = request_bytes(kind, request_id)
                futures.append([curio.send(kind, request_id, data) for _ in range(2)])
                time.sleep(1.0)
            for pair in futures:
                for f in pair:
                    with contextlib.suppress(concurrent.futures.TimeoutError):
                        f.result(90)
        finally:
            calls = curio.finish(grace=1)
        out = []
        for kind, request_id in pairs:
            queued = run.events("proof request queued", job_id=request_id)
            out.append({"request_id": request_id, "kind": kind,
                        "given_to_an_engine": len(queued),
                        "engines": [e.get("engine") for e in queued],
                        "answers": [(c.outcome, round(c.latency or 0, 2)) for c in calls
                                    if c.request_id == request_id]})
        return {"pairs": out, "calls": [asdict(c) for c in calls]}


def print_same_id(results: dict[str, dict[str, Any]]) -> None:
    names = list(results)
    print("\n### same-id: one request id sent twice at once (the same bytes), two engines "
          "behind one door\n")
    print("| request id | " + " | ".join(f"{n}: times given to an engine (which); answers"
                                         for n in names) + " |")
    print("|---|" + "---|" * len(names))
    for i, pair in enumerate(results[names[0]]["pairs"]):
        print(f"| {pair['request_id']} | " + " | ".join(
            f"{results[n]['pairs'][i]['given_to_an_engine']} ({results[n]['pairs'][i]['engines']}"
            f"); {results[n]['pairs'][i]['answers']}" for n in names) + " |")


# -- scenario (opt-in): a fresh process given several PoReps at once -----------------------

def scenario_fresh_burst(version: Version, scale: Scale, args: argparse.Namespace
                         ) -> dict[str, Any]:
    """What a restart's held calls look like to a fresh engine: 3 PoReps and a SnapDeals sent
    at once, then a WinningPoSt every second for 20 s (``--trials`` fresh cuzkds): the
    WinningPoSts refused or lost, and the order in which the engine started the jobs."""
    trials = []
    for trial in range(args.trials):
        with cuzkd_with(version, scale, args.keep, f"burst{trial}") as run:
            curio = CurioThread(run.address, scale.prove_timeout)
            began = time.monotonic()
            try:
                sent = [f"porep-{MINER}-{600 + 10 * trial + i}" for i in range(3)]
                for request_id in sent:
                    curio.send("porep-c2", request_id)
                curio.send("snap-update", f"snap-{MINER}-{609 + 10 * trial}")
                for k in range(20):
                    curio.send("winning-post", f"winpost-{MINER}-{4_200_000 + 100 * trial + k}")
                    time.sleep(1.0)
            finally:
                calls = curio.finish(grace=3)
            winning = [c for c in calls if c.kind == "winning-post"]
            first_ok = next((c.sent - began for c in winning if c.proved), None)
            trials.append({
                "engine_started": [(round(mono(e) - began, 1), e["job_id"])
                                   for e in run.events("proof job started")
                                   if not str(e.get("job_id", "")).startswith("winpost")],
                "winning": winning_summary(winning, scale.winning_deadline),
                "first_proved_sent_at_s": first_ok,
                "timeline": " ".join(f"{c.sent - began:.0f}:{'ok' if c.proved else c.outcome}"
                                     for c in winning),
            })
    return {"trials": trials}


def print_fresh_burst(results: dict[str, dict[str, Any]]) -> None:
    names = list(results)
    print("\n### fresh-burst: a fresh engine given 3 PoReps and a SnapDeals at once, then a "
          "WinningPoSt every second\n")
    print("| trial | " + " | ".join(names) + " |")
    print("|---|" + "---|" * len(names))
    for i in range(len(results[names[0]]["trials"])):
        def cell(n: str, i: int = i) -> str:
            t = results[n]["trials"][i]
            return (f"{winning_cell(t['winning'])}; first proved: sent at "
                    f"{sec(t['first_proved_sent_at_s'])}; engine started (s, job): "
                    f"{t['engine_started']}")
        print(f"| {i} | " + " | ".join(cell(n) for n in names) + " |")


# -- main ------------------------------------------------------------------------------------

RUNNERS: dict[str, tuple[Callable[[Version, Scale, argparse.Namespace], dict[str, Any]],
                         Callable[[dict[str, dict[str, Any]]], None]]] = {
    "stops": (scenario_stops, print_stops),
    "never-answer": (scenario_never, print_never),
    "poison": (scenario_poison, print_poison),
    "cuzkd-restart": (scenario_cuzkd_restart, print_cuzkd_restart),
    "same-id": (scenario_same_id, print_same_id),
    "fresh-burst": (scenario_fresh_burst, print_fresh_burst),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scenario", nargs="+", choices=(*SCENARIOS, "fresh-burst"),
                        default=list(SCENARIOS), help="fresh-burst is run only when named")
    parser.add_argument("--trials", type=int, default=2, help="fresh-burst: fresh cuzkds")
    parser.add_argument("--versions", nargs="+", choices=("before", "after"),
                        default=["before", "after"])
    parser.add_argument("--cuzkd-src", type=Path, default=Path("/tmp/cuzkd-base"),
                        help=f"the before tree (a worktree of {BASE_COMMIT} is made there if "
                        "missing)")
    parser.add_argument("--scale", type=float, default=0.1, help="times the real durations")
    parser.add_argument("--warm", type=float, default=12.0,
                        help="s of load before the first stop (the steady WinningPoSts)")
    parser.add_argument("--after-window", type=float, default=15.0,
                        help="s of load after each stop (its WinningPoSts reported apart)")
    parser.add_argument("--grace", type=float, default=20.0,
                        help="s the calls still in flight at the end get, then cancelled")
    parser.add_argument("--json", type=Path, help="write every figure here")
    parser.add_argument("--keep", action="store_true", help="keep each run's directory")
    args = parser.parse_args()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, _interrupt)
    scale = Scale(args.scale)
    versions = {"before": Version("before", base_worktree(args.cuzkd_src)),
                "after": Version("after", None)}
    tree = subprocess.run(["git", "-C", str(REPO), "status", "--short", "cuzkd"],
                          capture_output=True, text=True).stdout.split("\n")
    head = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"],
                          capture_output=True, text=True).stdout.strip()
    edited = " ".join(filter(None, tree))
    print(f"# The door keeps deadlines: before ({BASE_COMMIT}, {args.cuzkd_src}) and after "
          f"(this tree, HEAD {head}{', cuzkd/ edited: ' + edited if edited else ''})")
    print(f"\n{scale.describe()}\n\nload average at start: {loadavg()} ({os.cpu_count()} CPUs)")
    report: dict[str, Any] = {"scale": scale.factor, "describe": scale.describe(),
                              "head": head, "base": BASE_COMMIT, "scenarios": {}}
    try:
        for name in args.scenario:
            run_one, show = RUNNERS[name]
            results: dict[str, dict[str, Any]] = {}
            for version_name in args.versions:
                began, load = time.monotonic(), loadavg()
                print(f"\n[{name} / {version_name}] running (load {load}) ...", file=sys.stderr,
                      flush=True)
                result = run_one(versions[version_name], scale, args)
                result["wall_s"] = time.monotonic() - began
                result["load_at_start"], result["load_at_end"] = load, loadavg()
                results[version_name] = result
                print(f"[{name} / {version_name}] {result['wall_s']:.0f} s", file=sys.stderr,
                      flush=True)
            show(results)
            print("\nwall time: " + ", ".join(
                f"{n} {r['wall_s']:.0f} s (load {r['load_at_start']} -> {r['load_at_end']})"
                for n, r in results.items()))
            report["scenarios"][name] = results
            if args.json:
                args.json.write_text(json.dumps(report, indent=1, default=str))
    except KeyboardInterrupt:
        print("\ninterrupted: stopping every cuzkd started", file=sys.stderr)
        _cleanup()
        raise SystemExit(130) from None
    finally:
        if args.json:
            args.json.write_text(json.dumps(report, indent=1, default=str))


if __name__ == "__main__":
    main()
