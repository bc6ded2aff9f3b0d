"""Pipeline throughput and GPU-busy fraction: ``python bench/pipeline_busy.py [--jobs 10]``.

Starts ``cuzkd engine`` on a free port once per ``workers_per_gpu`` setting, runs the same load
as ``cuzkd bench`` (snap-update jobs at the engine's default size) and prints throughput, phase
percentiles and the busy fraction Σ worker busy / (wall × workers). With split proving the
second worker per device picks up the next partition while the first one's proof is being
finalized, which is what keeps the device busy.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from cuzkd.bundled.loadgen import run_bench


def start_engine(config: Path, log: Path) -> tuple[subprocess.Popen[bytes], str]:
    with log.open("wb") as sink:
        proc = subprocess.Popen([sys.executable, "-m", "cuzkd", "engine", "--config",
                                 str(config), "--listen", "127.0.0.1:0"], stderr=sink)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        for line in log.read_text().splitlines():
            event = json.loads(line) if line.startswith("{") else {}
            if event.get("event") == "engine_listening":
                return proc, str(event["address"])
        time.sleep(0.05)
    proc.kill()
    raise RuntimeError(f"engine did not start:\n{log.read_text()}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--jobs", type=int, default=10)
    parser.add_argument("--kind", default="snap-update")
    parser.add_argument("--size-log2", type=int)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        for workers in (1, 2):
            config = Path(tmp) / f"w{workers}.toml"
            config.write_text(f"workers_per_gpu = {workers}\n")
            proc, address = start_engine(config, Path(tmp) / f"w{workers}.log")
            try:
                report = asyncio.run(run_bench(address, jobs=args.jobs, kind=args.kind,
                                               size_log2=args.size_log2, progress=None))
            finally:
                proc.terminate()
                proc.wait(60)
            print(f"== workers_per_gpu = {workers}")
            print(report.to_text())


if __name__ == "__main__":
    main()
