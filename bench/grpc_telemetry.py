"""What the gRPC telemetry of cuzk engines costs: the supervisor, and the engines themselves.

One ``cuzkd run`` per cadence supervises ``--engines`` cuzk stand-ins
(tests/support/cuzk_standin.py) as ``type = "cuzk"`` engines, idle, ``health_interval`` 1 s. Each
stand-in burns ``CUZK_STANDIN_NVIDIA_SMI_SECS`` (30 ms) of CPU per ``GetStatus``, as the real
cuzk's ``nvidia-smi`` run does. For each ``grpc_telemetry_interval`` (``0s`` = telemetry off):

* the supervisor's CPU between scrapes (ms per second over ``--idle`` seconds), and per scrape
  (``--scrapes`` scrapes ``--gap`` seconds apart, the idle rate subtracted);
* each engine's CPU (ms per second, the mean over the engines) over the same idle window, and
  its difference to telemetry off: what the cadence costs the engine.

CPU from ``/proc/PID/stat`` (psutil, 10 ms ticks: windows of tens of seconds make that
negligible). Prints a Markdown table (docs/benchmarks.md, *gRPC telemetry*).

    .venv/bin/python bench/grpc_telemetry.py [--engines 8] [--intervals 0s 10s 1s]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))  # support: the stand-in and the harness

from support.cuzk_harness import cuzk_engine  # noqa: E402
from support.supervisor_harness import start_supervisor, write_config  # noqa: E402


@dataclass
class Row:
    interval: str
    supervisor_idle_ms_per_s: float
    supervisor_ms_per_scrape: float
    engine_ms_per_s: float


def cpu_seconds(pids: list[int]) -> float:
    """User + system CPU of these processes (not their children)."""
    total = 0.0
    for pid in pids:
        times = psutil.Process(pid).cpu_times()
        total += times.user + times.system
    return total


def measure(interval: str, args: argparse.Namespace) -> Row:
    with tempfile.TemporaryDirectory(prefix="cuzkd-grpc-bench-") as tmp_dir:
        tmp = Path(tmp_dir)
        tables = [cuzk_engine(tmp, f"c{n}", health_interval="1s",
                              grpc_telemetry_interval=interval)[0]
                  for n in range(args.engines)]
        sup = start_supervisor(write_config(tmp, tables), timeout=60)
        try:
            for n in range(args.engines):
                sup.wait_engine(f"c{n}", lambda e: e["state"] == "running", timeout=60)
            engines = [int(sup.engine(f"c{n}")["pid"]) for n in range(args.engines)]
            url = f"http://{sup.about()['metrics_listen']}/metrics"
            time.sleep(args.settle)  # first polls, imports, caches
            began, sup_before, eng_before = (time.monotonic(), cpu_seconds([sup.proc.pid]),
                                             cpu_seconds(engines))
            time.sleep(args.idle)
            idle = time.monotonic() - began
            sup_idle = (cpu_seconds([sup.proc.pid]) - sup_before) / idle
            engine_rate = (cpu_seconds(engines) - eng_before) / idle / len(engines)
            began, sup_before = time.monotonic(), cpu_seconds([sup.proc.pid])
            for _ in range(args.scrapes):
                with urllib.request.urlopen(url, timeout=30) as resp:
                    resp.read()
                time.sleep(args.gap)
            spent = time.monotonic() - began
            per_scrape = (cpu_seconds([sup.proc.pid]) - sup_before - sup_idle * spent) \
                / args.scrapes
        finally:
            sup.stop()
    return Row(interval, 1000 * sup_idle, 1000 * per_scrape, 1000 * engine_rate)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--engines", type=int, default=8)
    parser.add_argument("--intervals", nargs="+", default=["0s", "10s", "1s"])
    parser.add_argument("--settle", type=float, default=5.0)
    parser.add_argument("--idle", type=float, default=30.0)
    parser.add_argument("--scrapes", type=int, default=100)
    parser.add_argument("--gap", type=float, default=0.1)
    args = parser.parse_args()
    rows = [measure(interval, args) for interval in args.intervals]
    off = next((r.engine_ms_per_s for r in rows if r.interval == "0s"), None)
    print(f"{args.engines} cuzk engines, load average {os.getloadavg()[0]:.2f}\n")
    print("| grpc_telemetry_interval | supervisor CPU between scrapes | supervisor CPU / "
          "scrape | engine CPU (mean) | engine CPU for telemetry |")
    print("|---|---|---|---|---|")
    for r in rows:
        extra = "" if off is None else f"{r.engine_ms_per_s - off:+.1f} ms/s"
        print(f"| {r.interval} | {r.supervisor_idle_ms_per_s:.1f} ms/s | "
              f"{r.supervisor_ms_per_scrape:.1f} ms | {r.engine_ms_per_s:.1f} ms/s | {extra} |")


if __name__ == "__main__":
    main()
