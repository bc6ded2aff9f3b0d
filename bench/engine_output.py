"""Engine output flood: what an engine writing flat out costs the supervisor.

``cuzkd run`` supervises one engine that writes as fast as its pipe takes (or at ``--rate``)
-- ``lines``: 39-byte lines (the issue's flood), ``endless``: one line that never ends -- with
the default output limits, its log going to a file. After a warm-up, for ``--seconds``, it
reads the supervisor's CPU time (``/proc/PID/stat``), the log file's growth and the engine's
writes (``wchar`` of ``/proc/PID/io``): supervisor CPU %, log bytes/s and engine bytes/s -- and
the engine's longest single write (what a paced flood stalls a writer for; the engine notes
its longest write each half second in a file).

    .venv/bin/python bench/engine_output.py [--mode lines|endless] [--seconds 10]
        [--rate MB/s]        # the engine's writes (default: as fast as the pipe takes them)
        [--stream stderr]    # write to stderr (its tail looks for a panic in what it drops)
        [--pythonpath DIR]   # run the supervisor from another checkout (before/after)
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

#: What the engine writes, in 64 KiB blocks: 38 characters and a newline (the issue's flood),
#: or one line that never ends.
BLOCKS = {"lines": "b'flood line of thirty-nine bytes, x1234\\n' * 1680", "endless": "b'x' * 65536"}
#: The engine: writes BLOCK as fast as the pipe takes it, or at RATE bytes/s (argv[1], 0: flat
#: out) to fd argv[3]; each half second it appends "<monotonic time> <its longest write since>"
#: to argv[2].
ENGINE = """\
import os, sys, time
block, rate, stats = {block}, float(sys.argv[1]), open(sys.argv[2], "a", buffering=1)
fd, start, sent = int(sys.argv[3]), time.monotonic(), 0
noted, longest = start, 0.0
while True:
    before = time.monotonic()
    sent += os.write(fd, block)
    after = time.monotonic()
    longest = max(longest, after - before)
    if after - noted >= 0.5:
        stats.write(f"{{after}} {{longest}}\\n")
        noted, longest = after, 0.0
    if rate and (ahead := sent / rate - (after - start)) > 0:
        time.sleep(ahead)
"""


#: The engine's file descriptor for each stream.
STREAMS = {"stdout": 1, "stderr": 2}


def _cpu_seconds(pid: int) -> tuple[float, float]:
    """User and system CPU seconds of ``pid``."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    tick = os.sysconf("SC_CLK_TCK")
    return int(fields[11]) / tick, int(fields[12]) / tick


def _written(pid: int) -> int:
    for line in Path(f"/proc/{pid}/io").read_text().splitlines():
        if line.startswith("wchar:"):
            return int(line.split()[1])
    raise RuntimeError(f"no wchar for {pid}")


def _engine_pid(supervisor: int, timeout: float = 20.0) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for task in Path(f"/proc/{supervisor}/task").iterdir():
            children = (task / "children").read_text().split()
            if children:
                return int(children[0])
        time.sleep(0.05)  # polling /proc: there is nothing to wait on
    raise RuntimeError("the engine did not start")


def run(mode: str, seconds: float, rate: float, pythonpath: str | None,
        stream: str = "stdout") -> dict[str, float]:
    with tempfile.TemporaryDirectory() as tmp:
        config = Path(tmp) / "cuzkd.toml"
        stats = Path(tmp) / "engine-writes"
        command = json.dumps([sys.executable, "-c", ENGINE.format(block=BLOCKS[mode]),
                              str(rate), str(stats), str(STREAMS[stream])])  # TOML strings
        config.write_text(f'[supervisor]\nstate_dir = {json.dumps(tmp + "/state")}\n'
                          f'log_format = "json"\n[metrics]\nlisten = "127.0.0.1:0"\n'
                          f'[[engine]]\nname = "flood"\ncommand = {command}\n'
                          f'stop_timeout = "2s"\n')
        log_path = Path(tmp) / "cuzkd.log"
        env = dict(os.environ)
        if pythonpath:
            env["PYTHONPATH"] = pythonpath
        with log_path.open("wb") as log:
            sup = subprocess.Popen([sys.executable, "-m", "cuzkd", "run", "--config",
                                    str(config)], stdout=log, stderr=subprocess.STDOUT,
                                   stdin=subprocess.DEVNULL, env=env, cwd=pythonpath)
        try:
            engine = _engine_pid(sup.pid)
            time.sleep(2.0)  # warm-up: the burst, the first report
            cpu0, log0, eng0, t0 = (_cpu_seconds(sup.pid), log_path.stat().st_size,
                                    _written(engine), time.monotonic())
            time.sleep(seconds)
            cpu1, log1, eng1, t1 = (_cpu_seconds(sup.pid), log_path.stat().st_size,
                                    _written(engine), time.monotonic())
            stats_text = stats.read_text()
        finally:
            sup.send_signal(signal.SIGTERM)
            sup.wait(30)
    elapsed = t1 - t0
    noted = [line.split() for line in stats_text.splitlines()]
    longest = max((float(w) for t, w in noted if float(t) > t0), default=0.0)
    return {"supervisor_cpu_percent": 100 * (sum(cpu1) - sum(cpu0)) / elapsed,
            "supervisor_system_percent": 100 * (cpu1[1] - cpu0[1]) / elapsed,
            "log_bytes_per_second": (log1 - log0) / elapsed,
            "engine_bytes_per_second": (eng1 - eng0) / elapsed,
            "engine_longest_write": longest}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--mode", choices=sorted(BLOCKS), default="lines")
    parser.add_argument("--rate", type=float, default=0.0,
                        help="the engine's writes in MB/s (default: flat out)")
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--stream", choices=sorted(STREAMS), default="stdout")
    parser.add_argument("--pythonpath", help="run the supervisor from this checkout (its "
                                             "PYTHONPATH and working directory)")
    args = parser.parse_args()
    result = run(args.mode, args.seconds, args.rate * 1e6, args.pythonpath, args.stream)
    print(f"mode={args.mode} stream={args.stream} rate={args.rate:g} "
          f"seconds={args.seconds:g}: "
          f"supervisor CPU {result['supervisor_cpu_percent']:.1f} % "
          f"({result['supervisor_system_percent']:.1f} % system), "
          f"log {result['log_bytes_per_second'] / 1e6:.3f} MB/s, "
          f"engine writes {result['engine_bytes_per_second'] / 1e6:.1f} MB/s, "
          f"its longest write {result['engine_longest_write'] * 1e3:.1f} ms")


if __name__ == "__main__":
    main()
