"""Wall time of the client commands against an idle supervisor: what a person typing waits.

Starts ``cuzkd run`` with one bundled engine and no load (state in a temporary directory,
metrics on a free port), waits until the engine runs, then times each command ``--runs``
times as a fresh process (``python -m cuzkd ...``, as the console script runs it): process
start, imports, the control request, the answer, the exit.

    .venv/bin/python bench/cli_latency.py [--runs 20]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def _time(argv: list[str], runs: int) -> list[float]:
    out = []
    for _ in range(runs):
        started = time.perf_counter()
        subprocess.run(argv, check=True, stdout=subprocess.DEVNULL)
        out.append(time.perf_counter() - started)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        config = Path(tmp) / "cuzkd.toml"
        config.write_text(f'[supervisor]\nstate_dir = "{tmp}/state"\n'
                          '[metrics]\nlisten = "127.0.0.1:0"\n[[engine]]\nname = "b0"\n')
        cli = [sys.executable, "-m", "cuzkd"]
        sup = subprocess.Popen([*cli, "run", "--config", str(config)],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            deadline = time.monotonic() + 60
            while True:
                probe = subprocess.run([*cli, "status", "--json", "--config", str(config)],
                                       capture_output=True, text=True)
                if probe.returncode == 0 and json.loads(probe.stdout)["engines"][0]["state"] \
                        == "running":
                    break
                if time.monotonic() > deadline:
                    raise SystemExit("the engine did not start within 60 s")
                time.sleep(0.2)
            time.sleep(2)  # let the engine's start-up settle: measure an idle supervisor
            print(f"load average {os.getloadavg()[0]:.2f}, {args.runs} runs each")
            print(f"{'command':<28} {'p50':>8} {'p90':>8} {'max':>8}")
            for name, argv in (
                ("python -c pass (baseline)", [sys.executable, "-c", "pass"]),
                ("cuzkd --version", [*cli, "--version"]),
                ("cuzkd status", [*cli, "status", "--config", str(config)]),
                ("cuzkd status b0", [*cli, "status", "b0", "--config", str(config)]),
            ):
                times = sorted(_time(argv, args.runs))
                p90 = times[max(0, int(0.9 * len(times)) - 1)]
                print(f"{name:<28} {statistics.median(times) * 1e3:6.0f}ms "
                      f"{p90 * 1e3:6.0f}ms {times[-1] * 1e3:6.0f}ms")
        finally:
            sup.send_signal(signal.SIGTERM)
            sup.wait(60)


if __name__ == "__main__":
    main()
