"""Restart latency: time from an engine's exit to the start of its replacement.

cuzkd and supervisord 4.x supervise the same child program side by side in one run. The child
writes ``<pid> start <unix time>`` when it starts, then exits 1 after ``--lifetime`` seconds,
writing ``<pid> exit <unix time>`` just before (it runs with ``python -I -S`` so
interpreter start-up, which both supervisors pay alike, stays small); the latency of one
restart is the next start's time minus the previous exit's time (one clock, one machine).

supervisord is installed into its own throwaway venv (``python3 -m venv`` + ``pip install
'supervisor>=4,<5'``), never a dependency of cuzkd. For a fair comparison both are configured
to restart every exit: cuzkd with a long-lived healthy run each time (lifetime >
backoff_reset_after, so every exit restarts at once), supervisord with ``autorestart=true``,
``startsecs=0`` (so its start-retry logic does not interfere).

    .venv/bin/python bench/restart_latency.py [--restarts 30] [--lifetime 0.4]
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

CHILD = textwrap.dedent("""\
    import os, sys, time, socket
    log, lifetime, sock = sys.argv[1], float(sys.argv[2]), sys.argv[3]
    with open(log, "a") as fh:
        fh.write(f"{os.getpid()} start {time.time()!r}\\n")
    if sock != "-":  # answer cuzkd's status polls so it counts the run as healthy
        import json, threading
        doc = json.dumps({"uptime_secs": 0, "memory": {"total_bytes": 1, "used_bytes": 0,
            "available_bytes": 1}, "synthesis": {"max_concurrent": 1, "active": 0},
            "pipelines": [], "gpu_workers": [], "allocations": {"srs": [], "pce": []},
            "counters": {"total_completed": 0, "total_failed": 0, "completed_by_kind": {},
            "failed_by_kind": {}, "queue_depth": 0}, "buffers": {"synth_in_flight": 0,
            "provers_in_flight": 0, "aux_in_flight": 0, "shells_in_flight": 0,
            "pending_handles": 0}}).encode()
        if os.path.exists(sock):
            os.unlink(sock)
        s = socket.socket(socket.AF_UNIX); s.bind(sock); s.listen(8)
        def serve():
            while True:
                c, _ = s.accept(); c.recv(4096)
                c.sendall(b"HTTP/1.1 200 OK\\r\\nContent-Length: %d\\r\\nConnection: close"
                          b"\\r\\n\\r\\n" % len(doc) + doc); c.close()
        threading.Thread(target=serve, daemon=True).start()
    time.sleep(lifetime)
    with open(log, "a") as fh:
        fh.write(f"{os.getpid()} exit {time.time()!r}\\n")
    os._exit(1)
""")


def latencies(log: Path) -> list[float]:
    events = [line.split() for line in log.read_text().splitlines()]
    out, last_exit = [], None
    for _, kind, stamp in events:
        if kind == "exit":
            last_exit = float(stamp)
        elif last_exit is not None:
            out.append(float(stamp) - last_exit)
            last_exit = None
    return out


def wait_restarts(log: Path, count: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if log.exists() and len(latencies(log)) >= count:
            return
        time.sleep(0.1)
    raise SystemExit(f"timed out waiting for {count} restarts in {log}")


def supervisord_python(work: Path) -> Path:
    venv = work / "supervisord-venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    subprocess.run([str(venv / "bin/pip"), "install", "-q", "supervisor>=4,<5"], check=True)
    return venv / "bin/python"


def run_supervisord(work: Path, child: Path, args: argparse.Namespace) -> list[float]:
    python = supervisord_python(work)
    log = work / "supervisord-child.log"
    conf = work / "supervisord.conf"
    conf.write_text(textwrap.dedent(f"""\
        [supervisord]
        nodaemon=true
        logfile={work}/supervisord.log
        pidfile={work}/supervisord.pid
        [unix_http_server]
        file={work}/supervisord.sock
        [program:child]
        command={sys.executable} -I -S {child} {log} {args.lifetime} -
        autorestart=true
        startsecs=0
        startretries=1000
        stopsignal=KILL
    """))
    return supervise([str(python), "-m", "supervisor.supervisord", "-c", str(conf)], log, args)


def run_cuzkd(work: Path, child: Path, args: argparse.Namespace) -> list[float]:
    log = work / "cuzkd-child.log"
    sock = work / "child.sock"
    conf = work / "cuzkd.toml"
    conf.write_text(textwrap.dedent(f"""\
        [supervisor]
        state_dir = "{work}/cuzkd-state"
        [metrics]
        listen = "127.0.0.1:0"
        [[engine]]
        name = "child"
        command = ["{sys.executable}", "-I", "-S", "{child}", "{log}", "{args.lifetime}", "{sock}"]
        status_url = "unix:{sock}"
        health_interval = "50ms"
        backoff_reset_after = "{args.lifetime / 2}"
        stop_timeout = "1s"
    """))
    return supervise([sys.executable, "-m", "cuzkd", "run", "--config", str(conf)], log, args)


def supervise(argv: list[str], log: Path, args: argparse.Namespace) -> list[float]:
    """Run a supervisor until its child restarted ``args.restarts`` times; the latencies."""
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_restarts(log, args.restarts, args.restarts * (args.lifetime + 3) + 30)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)
    return latencies(log)[: args.restarts]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--restarts", type=int, default=30)
    parser.add_argument("--lifetime", type=float, default=0.4)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="cuzkd-bench-") as tmp:
        work = Path(tmp)
        child = work / "child.py"
        child.write_text(CHILD)
        results = {"cuzkd": run_cuzkd(work, child, args),
                   "supervisord": run_supervisord(work, child, args)}
    print(f"restart latency, exit -> replacement start, {args.restarts} restarts each "
          f"(cpus: {os.cpu_count()})")
    for name, values in results.items():
        print(f"  {name:<12} median {statistics.median(values) * 1e3:8.1f} ms   "
              f"p90 {statistics.quantiles(values, n=10)[-1] * 1e3:8.1f} ms   "
              f"max {max(values) * 1e3:8.1f} ms")
    ratio = statistics.median(results["supervisord"]) / statistics.median(results["cuzkd"])
    print(f"  supervisord / cuzkd median ratio: {ratio:.0f}x")


if __name__ == "__main__":
    main()
