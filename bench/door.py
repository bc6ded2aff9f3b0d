"""The front door under a Curio-like load: what it costs per call, and what a stop costs Curio.

One ``cuzkd run`` per mode supervises the cuzk stand-in (tests/support/cuzk_standin.py) as a
``type = "cuzk"`` engine. The callers always dial the address in the stand-in's TOML (``[daemon]
listen``, as Curio does): with ``door = "off"`` that is the engine itself (``direct``), with the
door on (``door``) it is cuzkd's front door and the engine listens on its private socket. Each
call is a raw ``Prove`` (bytes built once, sent as they are), so the caller costs the same in
both modes.

- ``latency``: one call at a time to a stand-in that proves in no time (``*_SECS`` 0): small
  (a WinningPoSt request of ~100 bytes) and large (a PoRep C2 request carrying ``--payload-mb``
  of C1 output, 51 MB as a real one); p50/p99 of each, and the door's added latency (the
  difference of the two modes' percentiles).
- ``throughput``: ``--callers`` concurrent callers sending large requests for ``--seconds``:
  MB/s relayed, the CPU seconds (``/proc/PID/stat``: every thread) of the supervisor and
  of its door process per GB of requests, and the latency of small calls sent one after
  another meanwhile (what a 51 MB relay's stalls of the door cost an honest small call).
- reading a large request's kind and priority: ``proving_pb2`` against
  :mod:`cuzkd.cuzk.wire`.
- ``stops`` (``--stops``): a Curio-like load (a new call every ``--every`` seconds whatever is
  in flight, a mix of PoRep C2 carrying the large payload, SnapDeals, WindowPoSt and
  WinningPoSt, each with Curio's priority; more offered than the stand-in proves) through a
  ``cuzkd restart``, a ``cuzkd swap`` and a stall kill (a release that stalls its GPU runs
  once: the watchdog kills it), then every call waited for. Reports the calls that ended in a
  gRPC error (by code), the proofs lost (calls that never got a COMPLETED reply) and what
  cuzkd counted (jobs lost at stops, the door's retries, refusals and proofs by result).

- ``shared`` (``--shared``): ``--engines`` stand-ins (2) behind one door (one cuzk per GPU),
  the same Curio-like load, and a ``cuzkd swap`` that rolls them one at a time: the calls'
  errors and lost proofs, and the p99 latency of the calls sent during the swap against that
  of the calls sent in the ``--warm`` seconds before it (the swap's added p99).

Prints Markdown tables (docs/benchmarks.md, *Front door*).

    .venv/bin/python bench/door.py [--modes direct door passed] [--calls 200] [--stops]
        [--shared]

``passed``: the door on a socket passed as systemd's ``cuzkd.socket`` does (fd 3,
``LISTEN_*``); the door process serves it as it serves a socket cuzkd bound.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import itertools
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))  # support: the stand-in and the harness

from support.activation import activated  # noqa: E402
from support.cuzk_harness import cuzk_engine  # noqa: E402
from support.cuzk_standin import SCRIPT  # noqa: E402
from support.protowire import length_delimited, tag, varint  # noqa: E402
from support.supervisor_harness import (  # noqa: E402
    RunningSupervisor,
    start_supervisor,
    write_config,
)
from support.waiting import wait_until  # noqa: E402

from cuzkd.cuzk import proving_pb2 as pb  # noqa: E402
from cuzkd.cuzk.wire import read_call  # noqa: E402

PROVE = "/cuzk.v1.ProvingEngine/Prove"
MIB = 1 << 20
#: cuzk's message limit each way, which Curio's client exceeds (256 MiB)
LIMIT = 128 * MIB
#: Curio's kinds and priorities; PoRep C2 carries the large payload
MIX = (("porep-c2", pb.POREP_SEAL_COMMIT, pb.NORMAL), ("snap-update", pb.SNAP_DEALS_UPDATE,
       pb.NORMAL), ("window-post", pb.WINDOW_POST_PARTITION, pb.HIGH),
       ("winning-post", pb.WINNING_POST, pb.CRITICAL))
_ids = itertools.count(1)


@functools.lru_cache(maxsize=2)
def _proof_field(payload: bytes) -> bytes:
    """``vanilla_proof`` (field 10) as on the wire: built once per payload."""
    return length_delimited(10, payload) if payload else b""


def request(kind: int, priority: int, payload: bytes = b"") -> bytes:
    """A ProveRequest with a request id of its own: its small fields by protobuf, the payload
    field appended (the same bytes protobuf writes, for one copy of the payload, not two)."""
    head = pb.SubmitProofRequest(request_id=f"bench-{next(_ids)}", proof_kind=kind,
                                 priority=priority, sector_size=32 << 30).SerializeToString()
    proof = _proof_field(payload)
    return b"".join((tag(1, 2), varint(len(head) + len(proof)), head, proof))


def channel(address: str) -> grpc.aio.Channel:
    return grpc.aio.insecure_channel(address, options=[
        ("grpc.max_receive_message_length", LIMIT), ("grpc.max_send_message_length", LIMIT)])


async def call(chan: grpc.aio.Channel, data: bytes) -> tuple[str, bytes | None]:
    """One raw Prove: (gRPC code name, reply bytes or None)."""
    try:
        reply = await chan.unary_unary(PROVE, None, None)(data, timeout=1800)
    except grpc.aio.AioRpcError as exc:
        return exc.code().name, None
    return "OK", reply


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def door_process(supervisor: int) -> int | None:
    """The pid of ``supervisor``'s door process (None: it has none)."""
    children = Path(f"/proc/{supervisor}/task/{supervisor}/children").read_text().split()
    for child in map(int, children):
        try:
            argv = Path(f"/proc/{child}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"cuzkd.supervisor.door.process" in argv:
            return child
    return None


def cuzkd_cpu(supervisor: int) -> tuple[float, float]:
    """CPU seconds of the supervisor and of its door process (0 without one)."""
    door = door_process(supervisor)
    return cpu_seconds(supervisor), 0.0 if door is None else cpu_seconds(door)


def counter(sup: RunningSupervisor, name: str) -> dict[str, float]:
    """Every series of ``name`` (label text -> value) from cuzkd's /metrics."""
    with urllib.request.urlopen(f"http://{sup.about()['metrics_listen']}/metrics",
                                timeout=10) as resp:
        lines = resp.read().decode().splitlines()
    return {line.split()[0][len(name):]: float(line.split()[-1]) for line in lines
            if line.startswith(name + "{")}


def release(tmp: Path, name: str, stall_flag: Path) -> Path:
    """A release of the stand-in ``cuzkd swap`` can install; while ``stall_flag`` exists its
    next process makes no progress at all, synthesis, GPU and PoSt (and removes the flag: the
    one after is well)."""
    path = tmp / name
    path.write_text(f"#!/bin/sh\nif [ -e {stall_flag} ]; then rm -f {stall_flag}; "
                    "export CUZK_STANDIN_SYNTH_SECS=3600 CUZK_STANDIN_GPU_SECS=3600 "
                    "CUZK_STANDIN_POST_SECS=3600; fi\n"
                    f"exec {sys.executable} {SCRIPT} \"$@\"\n")
    path.chmod(0o755)
    return path


@contextmanager
def supervised(mode: str, keep: bool, env: dict[str, str], **keys: Any) -> Iterator[
        tuple[RunningSupervisor, str, Path]]:
    """cuzkd with the stand-in behind a door (``door``; ``passed``: on a socket passed as
    systemd's cuzkd.socket does) or not (``direct``): (the supervisor, the address callers
    dial, the stall flag of its releases). ``keep``: leave the run's directory (configs,
    ``cuzkd.log``) in place."""
    tmp = Path(tempfile.mkdtemp(prefix="czd", dir="/tmp"))
    if keep:
        print(f"{mode}: {tmp}", file=sys.stderr)
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as passed:
            engine, address = cuzk_engine(tmp, env=env, door="off" if mode == "direct" else "",
                                          **keys)
            flag = tmp / "stall-once"
            engine["command"][:2] = ["{binary}"]
            supervisor = {"initial_binary": str(release(tmp, "cuzk-a", flag)),
                          "release_settle": "1s", "shutdown_grace": "60s"}
            activation: dict[str, Any] = {}
            if mode == "passed":
                passed.bind(address.removeprefix("unix://"))
                passed.listen(256)
                passed.set_inheritable(True)
                activation = {"prefix": activated(passed.fileno()),
                              "pass_fds": (passed.fileno(),)}
            sup = start_supervisor(write_config(tmp, [engine], supervisor=supervisor),
                                   timeout=60, **activation)
            try:
                sup.wait_engine("cuzk", lambda e: e["state"] == "running", timeout=60)
                yield sup, address, flag
            finally:
                sup.stop(timeout=90)
    finally:
        if not keep:
            shutil.rmtree(tmp, ignore_errors=True)


# -- reading a large request -------------------------------------------------------------------

def read_costs(data: bytes, rounds: int = 7) -> tuple[float, float, float]:
    """Median seconds to read a request's kind and priority: parsed whole by ``proving_pb2``
    (which copies the payload), and walked by :mod:`cuzkd.cuzk.wire` (which jumps over it);
    and of one copy of the request (a fresh buffer: the yardstick of the door's goal, at
    most two copies' worth of added latency)."""
    def median(read: Any) -> float:
        times = []
        for _ in range(rounds):
            began = time.perf_counter()
            read(data)
            times.append(time.perf_counter() - began)
        return statistics.median(times)

    return median(pb.ProveRequest.FromString), median(read_call), median(bytearray)


# -- latency and throughput ------------------------------------------------------------------

INSTANT = {"CUZK_STANDIN_SYNTH_SECS": "0", "CUZK_STANDIN_GPU_SECS": "0",
           "CUZK_STANDIN_POST_SECS": "0", "CUZK_STANDIN_POST_SYNTH_SECS": "0"}


async def latencies(address: str, make: Callable[[], bytes], n: int) -> list[float]:
    chan = channel(address)
    try:
        for _ in range(3):  # the connection and the first calls' warm-up
            await call(chan, make())
        out = []
        for _ in range(n):
            data = make()
            began = time.perf_counter()
            code, _reply = await call(chan, data)
            assert code == "OK", code
            out.append(time.perf_counter() - began)
        return out
    finally:
        await chan.close()


async def throughput(address: str, make: Callable[[], bytes], callers: int,
                     seconds: float, probe: Callable[[], bytes]
                     ) -> tuple[int, float, list[float]]:
    """(bytes of requests answered, seconds, the latencies of ``probe`` calls sent one after
    another on a channel of their own meanwhile) with ``callers`` calls in flight at all
    times: a small call's latency beside large relays bounds the relay's stalls of the door."""
    chan = channel(address)
    sent = 0
    deadline = time.monotonic() + seconds
    probed: list[float] = []

    async def prober() -> None:
        probe_chan = channel(address)
        while time.monotonic() < deadline:
            began = time.monotonic()
            code, _ = await call(probe_chan, probe())
            assert code == "OK", code
            probed.append(time.monotonic() - began)
            await asyncio.sleep(0.01)
        await probe_chan.close()

    async def caller() -> None:
        nonlocal sent
        while time.monotonic() < deadline:
            data = make()
            code, _ = await call(chan, data)
            assert code == "OK", code
            sent += len(data)

    began = time.monotonic()
    await asyncio.gather(prober(), *(caller() for _ in range(callers)))
    elapsed = time.monotonic() - began
    await chan.close()
    return sent, elapsed, probed


@dataclass
class Costs:
    mode: str
    small: list[float]
    large: list[float]
    mb_per_s: float
    #: CPU seconds per GB relayed: the supervisor's, and the door process's
    cpu_per_gb: float
    door_cpu_per_gb: float
    #: small calls' latencies meanwhile
    beside: list[float]


def measure_costs(mode: str, args: argparse.Namespace, payload: bytes) -> Costs:
    with supervised(mode, args.keep, INSTANT) as (sup, address, _):
        def small() -> bytes:
            return request(pb.WINNING_POST, pb.CRITICAL)

        def large() -> bytes:
            return request(pb.POREP_SEAL_COMMIT, pb.NORMAL, payload)

        small_s = asyncio.run(latencies(address, small, args.calls))
        large_s = asyncio.run(latencies(address, large, max(10, args.calls // 10)))
        cpu, door_cpu = cuzkd_cpu(sup.proc.pid)
        sent, elapsed, beside = asyncio.run(throughput(address, large, args.callers,
                                                       args.seconds, small))
        cpu_after, door_cpu_after = cuzkd_cpu(sup.proc.pid)
    gb = sent / 2**30
    return Costs(mode, small_s, large_s, sent / MIB / elapsed, (cpu_after - cpu) / gb,
                 (door_cpu_after - door_cpu) / gb, beside)


# -- stops under a Curio-like load --------------------------------------------------------------

@dataclass
class StopRun:
    mode: str
    calls: int = 0
    completed: int = 0
    failed: int = 0
    errors: Counter[str] = field(default_factory=Counter)
    jobs_lost: float = 0
    retries: float = 0
    refusals: dict[str, float] = field(default_factory=dict)
    #: cuzkd_door_proofs_total by result (what the door's metrics counted)
    counted: Counter[str] = field(default_factory=Counter)


class CurioLoad:
    """A new Prove every ``every`` seconds, whatever is in flight, cycling through :data:`MIX`;
    each call's outcome kept."""

    def __init__(self, address: str, payload: bytes, every: float) -> None:
        self._chan = channel(address)
        self._mix = itertools.cycle(MIX)
        self._payload = payload
        self._every = every
        self._calls: list[asyncio.Task[tuple[str, bytes | None]]] = []
        self._stop = asyncio.Event()
        #: (sent, answered) of each call that ended, monotonic seconds
        self.spans: list[tuple[float, float]] = []

    async def run(self) -> None:
        while not self._stop.is_set():
            name, kind, priority = next(self._mix)  # each call its own request id
            data = request(kind, priority, self._payload if name == "porep-c2" else b"")
            self._calls.append(asyncio.create_task(self._timed(data)))
            await asyncio.sleep(self._every)

    async def _timed(self, data: bytes) -> tuple[str, bytes | None]:
        sent = time.monotonic()
        result = await call(self._chan, data)
        self.spans.append((sent, time.monotonic()))
        return result

    async def finish(self) -> list[tuple[str, bytes | None]]:
        self._stop.set()
        results = await asyncio.gather(*self._calls)
        await self._chan.close()
        return results


def _stop(sup: RunningSupervisor, what: str, tmp_release: Path, flag: Path) -> None:
    if what == "restart":
        sup.request("POST", "/v1/engines/cuzk/restart", timeout=600)
    elif what == "swap":
        subprocess.run([sys.executable, "-m", "cuzkd", "swap", "--config", str(sup.config),
                        "--settle", "1s", str(tmp_release)], check=True,
                       stdout=subprocess.DEVNULL)
    else:  # stall: the next process stalls its GPU runs; the watchdog kills it
        pid = sup.engine("cuzk")["pid"]
        flag.touch()
        sup.request("POST", "/v1/engines/cuzk/restart", timeout=600)
        wait_until(lambda: sup.events("engine_stalled"), 120, "the stall kill")
        wait_until(lambda: sup.engine("cuzk")["pid"] not in (None, pid)
                   and sup.engine("cuzk")["state"] == "running", 120, "a well engine")


def tally(results: list[tuple[str, bytes | None]]) -> tuple[Counter[str], int, int]:
    """(gRPC errors by code, proofs completed, proofs FAILED) of the calls' results."""
    errors: Counter[str] = Counter()
    completed = failed = 0
    for code, reply in results:
        if reply is None:
            errors[code] += 1
        elif (pb.ProveResponse.FromString(reply).result.status
              == pb.AwaitProofResponse.COMPLETED):
            completed += 1
        else:
            failed += 1
    return errors, completed, failed


def measure_stops(mode: str, args: argparse.Namespace, payload: bytes) -> StopRun:
    env = {"CUZK_STANDIN_SYNTH_SECS": str(args.synth), "CUZK_STANDIN_GPU_SECS": str(args.gpu),
           "CUZK_STANDIN_POST_SECS": str(args.post)}
    with supervised(mode, args.keep, env, stall_after="5s",
                    drain_timeout="60s") as (sup, address, flag):
        swap_to = release(Path(str(sup.config)).parent, "cuzk-b", flag)

        async def scenario() -> list[tuple[str, bytes | None]]:
            load = CurioLoad(address, payload, args.every)
            runner = asyncio.create_task(load.run())
            for what in ("restart", "swap", "stall"):
                await asyncio.sleep(args.warm)
                await asyncio.to_thread(_stop, sup, what, swap_to, flag)
            await asyncio.sleep(args.warm)
            results = await load.finish()
            await runner
            return results

        results = asyncio.run(scenario())
        run = StopRun(mode, calls=len(results))
        run.errors, run.completed, run.failed = tally(results)
        run.jobs_lost = sum(counter(sup, "cuzkd_engine_jobs_lost_total").values())
        if mode == "door":
            run.retries = sum(counter(sup, "cuzkd_door_retries_total").values())
            run.refusals = {k: v for k, v in counter(sup, "cuzkd_door_refusals_total").items()
                            if v}
            for labels, n in counter(sup, "cuzkd_door_proofs_total").items():
                run.counted[labels.split('result="')[1].split('"')[0]] += int(n)
    return run


@dataclass
class SharedRun:
    calls: int = 0
    completed: int = 0
    errors: Counter[str] = field(default_factory=Counter)
    during: list[float] = field(default_factory=list)
    before: list[float] = field(default_factory=list)
    held: float = 0.0


def measure_shared(args: argparse.Namespace, payload: bytes) -> SharedRun:
    """``--engines`` stand-ins behind one door through a rolling ``cuzkd swap`` under the
    load (one: the pause a shared door removes)."""
    env = {"CUZK_STANDIN_SYNTH_SECS": str(args.synth), "CUZK_STANDIN_GPU_SECS": str(args.gpu),
           "CUZK_STANDIN_POST_SECS": str(args.post)}
    with tempfile.TemporaryDirectory(prefix="czd", dir="/tmp") as name:
        tmp = Path(name)
        address = f"unix://{tmp}/curio.sock"
        engines = []
        names = [f"cuzk{i}" for i in range(args.engines)]
        for engine_name in names:
            engine, _ = cuzk_engine(tmp, engine_name, env=env, door=address,
                                    drain_timeout="60s")
            engine["command"][:2] = ["{binary}"]
            engines.append(engine)
        flag = tmp / "stall-never"
        supervisor = {"initial_binary": str(release(tmp, "cuzk-a", flag)),
                      "release_settle": "1s", "shutdown_grace": "60s"}
        sup = start_supervisor(write_config(tmp, engines, supervisor=supervisor), timeout=60)
        try:
            for engine_name in names:
                sup.wait_engine(engine_name, lambda e: e["state"] == "running", timeout=60)
            swap_to = release(tmp, "cuzk-b", flag)

            async def scenario() -> tuple[list[tuple[str, bytes | None]], CurioLoad, float,
                                          float]:
                load = CurioLoad(address, payload, args.every)
                runner = asyncio.create_task(load.run())
                await asyncio.sleep(args.warm)
                began = time.monotonic()
                await asyncio.to_thread(_stop, sup, "swap", swap_to, flag)
                ended = time.monotonic()
                await asyncio.sleep(args.warm)
                results = await load.finish()
                await runner
                return results, load, began, ended

            results, load, began, ended = asyncio.run(scenario())
            run = SharedRun(calls=len(results))
            run.errors, run.completed, _ = tally(results)
            run.during = [end - sent for sent, end in load.spans if began <= sent <= ended]
            run.before = [end - sent for sent, end in load.spans
                          if began - args.warm <= sent < began]
            run.held = sum(counter(sup, "cuzkd_door_hold_duration_seconds_count").values())
        finally:
            sup.stop(timeout=90)
    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--modes", nargs="+", default=["direct", "door"],
                        choices=["direct", "door", "passed"])
    parser.add_argument("--payload-mb", type=float, default=51.0)
    parser.add_argument("--calls", type=int, default=200, help="small calls per latency run")
    parser.add_argument("--callers", type=int, default=4, help="concurrent throughput callers")
    parser.add_argument("--seconds", type=float, default=10.0, help="throughput run length")
    parser.add_argument("--stops", action="store_true", help="also the restart/swap/stall run")
    parser.add_argument("--shared", action="store_true",
                        help="also engines behind one door through a rolling swap")
    parser.add_argument("--engines", type=int, default=2, help="engines behind the door")
    parser.add_argument("--no-costs", action="store_true", help="skip latency and throughput")
    parser.add_argument("--every", type=float, default=0.25, help="s between Curio's calls")
    parser.add_argument("--synth", type=float, default=0.2, help="s per partition synthesis")
    parser.add_argument("--gpu", type=float, default=0.05, help="GPU s per partition")
    parser.add_argument("--post", type=float, default=0.3, help="s per PoSt proof")
    parser.add_argument("--warm", type=float, default=8.0, help="s of load between stops")
    parser.add_argument("--keep", action="store_true", help="keep each run's directory")
    args = parser.parse_args()
    payload = os.urandom(int(args.payload_mb * 1e6))
    parsed, walked, copied = read_costs(request(pb.POREP_SEAL_COMMIT, pb.NORMAL, payload))
    print(f"reading kind and priority of a {args.payload_mb:g} MB request: proving_pb2 "
          f"{parsed * 1e3:.1f} ms, cuzkd.cuzk.wire {walked * 1e6:.1f} µs; one copy of it "
          f"{copied * 1e3:.1f} ms\n")
    costs = [] if args.no_costs else [measure_costs(mode, args, payload) for mode in args.modes]
    print("| mode | small p50 | small p99 | large p50 | large p99 | MB/s "
          "| supervisor CPU s per GB | door process CPU s per GB "
          "| small p99 / max beside the large |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for c in costs:
        print(f"| {c.mode} | {percentile(c.small, .5) * 1e3:.2f} ms | "
              f"{percentile(c.small, .99) * 1e3:.2f} ms | {percentile(c.large, .5) * 1e3:.1f} ms "
              f"| {percentile(c.large, .99) * 1e3:.1f} ms | {c.mb_per_s:.0f} | "
              f"{c.cpu_per_gb:.2f} | {c.door_cpu_per_gb:.2f} | "
              f"{percentile(c.beside, .99) * 1e3:.1f} / {max(c.beside) * 1e3:.1f} ms |")
    if len(costs) == 2:
        direct, door = costs
        print(f"\nadded by the door: small p50 "
              f"{(percentile(door.small, .5) - percentile(direct.small, .5)) * 1e3:+.2f} ms, p99 "
              f"{(percentile(door.small, .99) - percentile(direct.small, .99)) * 1e3:+.2f} ms; "
              f"large p50 {(percentile(door.large, .5) - percentile(direct.large, .5)) * 1e3:+.1f}"
              f" ms, p99 {(percentile(door.large, .99) - percentile(direct.large, .99)) * 1e3:+.1f}"
              f" ms (median of small: {statistics.median(door.small) * 1e3:.2f} ms)")
    if args.stops:
        runs = [measure_stops(mode, args, payload) for mode in args.modes]
        print("\n| mode | calls | completed | failed | gRPC errors | proofs lost | "
              "cuzkd: jobs lost at stops | door retries | door refusals | door counted |")
        print("|---|---:|---:|---:|---|---:|---:|---:|---|---|")
        for r in runs:
            errors = ", ".join(f"{code} {n}" for code, n in r.errors.most_common()) or "0"
            print(f"| {r.mode} | {r.calls} | {r.completed} | {r.failed} | {errors} | "
                  f"{r.calls - r.completed} | {r.jobs_lost:g} | {r.retries:g} | "
                  f"{r.refusals or 0} | {dict(r.counted) or '-'} |")
    if args.shared:
        s = measure_shared(args, payload)
        errors = ", ".join(f"{code} {n}" for code, n in s.errors.most_common()) or "0"
        before, during = percentile(s.before, .99), percentile(s.during, .99)
        print(f"\n| {args.engines} engine(s), one door | calls | completed | gRPC errors | "
              "proofs lost | calls held | p99 before the swap | p99 during it | added p99 |")
        print("|---|---:|---:|---|---:|---:|---:|---:|---:|")
        print(f"| rolling swap | {s.calls} | {s.completed} | {errors} | "
              f"{s.calls - s.completed} | {s.held:g} | {before * 1e3:.0f} ms "
              f"({len(s.before)}) | {during * 1e3:.0f} ms ({len(s.during)}) | "
              f"{(during - before) * 1e3:+.0f} ms |")


if __name__ == "__main__":
    main()
