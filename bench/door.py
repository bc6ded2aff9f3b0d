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
  MB/s relayed, and cuzkd's CPU seconds (``/proc/PID/stat``: every thread, grpc's included)
  per GB of requests.
- reading a large request's kind and priority: ``proving_pb2`` against
  :mod:`cuzkd.cuzk.wire`.
- ``stops`` (``--stops``): a Curio-like load (a new call every ``--every`` seconds whatever is
  in flight, a mix of PoRep C2 carrying the large payload, SnapDeals, WindowPoSt and
  WinningPoSt, each with Curio's priority; more offered than the stand-in proves) through a
  ``cuzkd restart``, a ``cuzkd swap`` and a stall kill (a release that stalls its GPU runs
  once: the watchdog kills it), then every call waited for. Reports the calls that ended in a
  gRPC error (by code), the proofs lost (calls that never got a COMPLETED reply) and what
  cuzkd counted (jobs lost at stops, door retries and refusals).

Prints Markdown tables (docs/benchmarks.md, *Front door*).

    .venv/bin/python bench/door.py [--modes direct door passed] [--calls 200] [--stops]

``passed``: the door on a socket passed as systemd's ``cuzkd.socket`` does (fd 3,
``LISTEN_*``), so every byte also crosses the door's forwarder to its private socket.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections import Counter
from collections.abc import Iterator
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


def request(kind: int, priority: int, payload: bytes = b"") -> bytes:
    return pb.ProveRequest(submit=pb.SubmitProofRequest(
        request_id=f"bench-{next(_ids)}", proof_kind=kind, priority=priority,
        sector_size=32 << 30, vanilla_proof=payload)).SerializeToString()


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


def counter(sup: RunningSupervisor, name: str) -> dict[str, float]:
    """Every series of ``name`` (label text -> value) from cuzkd's /metrics."""
    with urllib.request.urlopen(f"http://{sup.about()['metrics_listen']}/metrics",
                                timeout=10) as resp:
        lines = resp.read().decode().splitlines()
    return {line.split()[0][len(name):]: float(line.split()[-1]) for line in lines
            if line.startswith(name + "{")}


def release(tmp: Path, name: str, stall_flag: Path) -> Path:
    """A release of the stand-in ``cuzkd swap`` can install; while ``stall_flag`` exists its
    next process stalls every GPU run (and removes the flag: the one after is well)."""
    path = tmp / name
    path.write_text(f"#!/bin/sh\nif [ -e {stall_flag} ]; then rm -f {stall_flag}; "
                    "export CUZK_STANDIN_GPU_SECS=3600; fi\n"
                    f"exec {sys.executable} {SCRIPT} \"$@\"\n")
    path.chmod(0o755)
    return path


@contextmanager
def supervised(mode: str, env: dict[str, str], **keys: Any) -> Iterator[
        tuple[RunningSupervisor, str, Path]]:
    """cuzkd with the stand-in behind a door (``door``; ``passed``: on a socket passed as
    systemd's cuzkd.socket does) or not (``direct``): (the supervisor, the address callers
    dial, the stall flag of its releases)."""
    with tempfile.TemporaryDirectory(prefix="czd", dir="/tmp") as name, \
            socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as passed:
        tmp = Path(name)
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
            activation = {"prefix": activated(passed.fileno()), "pass_fds": (passed.fileno(),)}
        sup = start_supervisor(write_config(tmp, [engine], supervisor=supervisor), timeout=60,
                               **activation)
        try:
            sup.wait_engine("cuzk", lambda e: e["state"] == "running", timeout=60)
            yield sup, address, flag
        finally:
            sup.stop(timeout=90)


# -- reading a large request -------------------------------------------------------------------

def read_costs(data: bytes, rounds: int = 7) -> tuple[float, float]:
    """Median seconds to read a request's kind and priority: parsed whole by ``proving_pb2``
    (which copies the payload), and walked by :mod:`cuzkd.cuzk.wire` (which jumps over it)."""
    def median(read: Any) -> float:
        times = []
        for _ in range(rounds):
            began = time.perf_counter()
            read(data)
            times.append(time.perf_counter() - began)
        return statistics.median(times)

    return median(pb.ProveRequest.FromString), median(read_call)


# -- latency and throughput ------------------------------------------------------------------

INSTANT = {"CUZK_STANDIN_SYNTH_SECS": "0", "CUZK_STANDIN_GPU_SECS": "0",
           "CUZK_STANDIN_POST_SECS": "0"}


async def latencies(address: str, data: bytes, n: int) -> list[float]:
    chan = channel(address)
    try:
        for _ in range(3):  # the connection and the first calls' warm-up
            await call(chan, data)
        out = []
        for _ in range(n):
            began = time.perf_counter()
            code, _reply = await call(chan, data)
            assert code == "OK", code
            out.append(time.perf_counter() - began)
        return out
    finally:
        await chan.close()


async def throughput(address: str, data: bytes, callers: int, seconds: float) -> tuple[int, float]:
    """(bytes of requests answered, seconds) with ``callers`` calls in flight at all times."""
    chan = channel(address)
    sent = 0
    deadline = time.monotonic() + seconds

    async def caller() -> None:
        nonlocal sent
        while time.monotonic() < deadline:
            code, _ = await call(chan, data)
            assert code == "OK", code
            sent += len(data)

    began = time.monotonic()
    await asyncio.gather(*(caller() for _ in range(callers)))
    elapsed = time.monotonic() - began
    await chan.close()
    return sent, elapsed


@dataclass
class Costs:
    mode: str
    small: list[float]
    large: list[float]
    mb_per_s: float
    cpu_per_gb: float


def measure_costs(mode: str, args: argparse.Namespace, payload: bytes) -> Costs:
    with supervised(mode, INSTANT) as (sup, address, _):
        small = request(pb.WINNING_POST, pb.CRITICAL)
        large = request(pb.POREP_SEAL_COMMIT, pb.NORMAL, payload)
        small_s = asyncio.run(latencies(address, small, args.calls))
        large_s = asyncio.run(latencies(address, large, max(10, args.calls // 10)))
        cpu = cpu_seconds(sup.proc.pid)
        sent, elapsed = asyncio.run(throughput(address, large, args.callers, args.seconds))
        cpu = cpu_seconds(sup.proc.pid) - cpu
    return Costs(mode, small_s, large_s, sent / MIB / elapsed, cpu / (sent / 2**30))


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


class CurioLoad:
    """A new Prove every ``every`` seconds, whatever is in flight, cycling through :data:`MIX`;
    each call's outcome kept."""

    def __init__(self, address: str, payload: bytes, every: float) -> None:
        self._chan = channel(address)
        self._requests = itertools.cycle(
            [request(kind, priority, payload if name == "porep-c2" else b"")
             for name, kind, priority in MIX])
        self._every = every
        self._calls: list[asyncio.Task[tuple[str, bytes | None]]] = []
        self._stop = asyncio.Event()

    async def run(self) -> None:
        while not self._stop.is_set():
            data = next(self._requests)
            # a fresh request id for every call (bytes rebuilt only for the small ones)
            self._calls.append(asyncio.create_task(call(self._chan, data)))
            await asyncio.sleep(self._every)

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


def measure_stops(mode: str, args: argparse.Namespace, payload: bytes) -> StopRun:
    env = {"CUZK_STANDIN_SYNTH_SECS": str(args.synth), "CUZK_STANDIN_GPU_SECS": str(args.gpu),
           "CUZK_STANDIN_POST_SECS": str(args.post)}
    with supervised(mode, env, stall_after="5s", drain_timeout="60s") as (sup, address, flag):
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
        for code, reply in results:
            if reply is None:
                run.errors[code] += 1
            elif (pb.ProveResponse.FromString(reply).result.status
                  == pb.AwaitProofResponse.COMPLETED):
                run.completed += 1
            else:
                run.failed += 1
        run.jobs_lost = sum(counter(sup, "cuzkd_engine_jobs_lost_total").values())
        if mode == "door":
            run.retries = sum(counter(sup, "cuzkd_door_retries_total").values())
            run.refusals = {k: v for k, v in counter(sup, "cuzkd_door_refusals_total").items()
                            if v}
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
    parser.add_argument("--no-costs", action="store_true", help="skip latency and throughput")
    parser.add_argument("--every", type=float, default=0.25, help="s between Curio's calls")
    parser.add_argument("--synth", type=float, default=0.2, help="s per partition synthesis")
    parser.add_argument("--gpu", type=float, default=0.05, help="GPU s per partition")
    parser.add_argument("--post", type=float, default=0.3, help="s per PoSt proof")
    parser.add_argument("--warm", type=float, default=8.0, help="s of load between stops")
    args = parser.parse_args()
    payload = os.urandom(int(args.payload_mb * 1e6))
    parsed, walked = read_costs(request(pb.POREP_SEAL_COMMIT, pb.NORMAL, payload))
    print(f"reading kind and priority of a {args.payload_mb:g} MB request: proving_pb2 "
          f"{parsed * 1e3:.1f} ms, cuzkd.cuzk.wire {walked * 1e6:.1f} µs\n")
    costs = [] if args.no_costs else [measure_costs(mode, args, payload) for mode in args.modes]
    print("| mode | small p50 | small p99 | large p50 | large p99 | MB/s | cuzkd CPU s per GB |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for c in costs:
        print(f"| {c.mode} | {percentile(c.small, .5) * 1e3:.2f} ms | "
              f"{percentile(c.small, .99) * 1e3:.2f} ms | {percentile(c.large, .5) * 1e3:.1f} ms "
              f"| {percentile(c.large, .99) * 1e3:.1f} ms | {c.mb_per_s:.0f} | "
              f"{c.cpu_per_gb:.2f} |")
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
              "cuzkd: jobs lost at stops | door retries | door refusals |")
        print("|---|---:|---:|---:|---|---:|---:|---:|---|")
        for r in runs:
            errors = ", ".join(f"{code} {n}" for code, n in r.errors.most_common()) or "0"
            print(f"| {r.mode} | {r.calls} | {r.completed} | {r.failed} | {errors} | "
                  f"{r.calls - r.completed} | {r.jobs_lost:g} | {r.retries:g} | "
                  f"{r.refusals or 0} |")


if __name__ == "__main__":
    main()
