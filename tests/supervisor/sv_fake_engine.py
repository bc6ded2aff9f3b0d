"""A tiny stand-in engine for supervisor tests: stdlib only, so it starts in ~30 ms.

    python sv_fake_engine.py --socket PATH | --port N  [--mode MODE] [--exit-after S]
                             [--exit-code N] [--grandchildren N] [--pidfile PATH]

Modes: ``serve`` (answer GET /status with a valid document), ``hang`` (accept connections,
never answer), ``garbage`` (answer 200 with non-JSON), ``silent`` (bind nothing),
``ignore-term`` (serve, but ignore SIGTERM). ``--exit-after`` exits with ``--exit-code`` after
that many seconds; ``--grandchildren`` double-forks that many short-lived grandchildren;
``--pidfile`` appends this process's pid (one line per start) so tests can count starts;
``--fail-starts N`` makes the first N starts (counted in the pidfile) exit 1 after 50 ms;
``--hang-after S`` stops answering /status (connections hang) S seconds after start;
``--helper PIDFILE`` double-forks a helper into its own session (``setsid``) that appends its
pid to PIDFILE and sleeps (``--helper-ignores-term``: with SIGTERM ignored).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import sys
import threading
import time

STATUS = {
    "uptime_secs": 1.0,
    "memory": {"total_bytes": 1, "used_bytes": 0, "available_bytes": 1},
    "synthesis": {"max_concurrent": 1, "active": 0},
    "pipelines": [],
    "gpu_workers": [],
    "allocations": {"srs": [], "pce": []},
    "counters": {"total_completed": 0, "total_failed": 0, "completed_by_kind": {},
                 "failed_by_kind": {}, "queue_depth": 0},
    "buffers": {"synth_in_flight": 0, "provers_in_flight": 0, "aux_in_flight": 0,
                "shells_in_flight": 0, "pending_handles": 0},
}


HANG_AT = [float("inf")]


def respond(conn: socket.socket, mode: str) -> None:
    with conn:
        conn.recv(65536)
        if mode == "hang" or time.monotonic() >= HANG_AT[0]:
            time.sleep(3600)
            return
        body = b"this is not json" if mode == "garbage" else json.dumps(STATUS).encode()
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                     b"Content-Length: " + str(len(body)).encode() + b"\r\n"
                     b"Connection: close\r\n\r\n" + body)


def serve(sock: socket.socket, mode: str) -> None:
    while True:
        conn, _ = sock.accept()
        threading.Thread(target=respond, args=(conn, mode), daemon=True).start()


def double_fork(count: int) -> None:
    for _ in range(count):
        pid = os.fork()
        if pid == 0:
            if os.fork() == 0:  # grandchild: re-parented to the subreaper when its parent exits
                time.sleep(0.05)
            os._exit(0)
        os.waitpid(pid, 0)


def setsid_helper(pidfile: str, ignore_term: bool) -> None:
    """Double-fork a helper out of our process group and tree, as daemonising tools do.

    Returns once the helper is set up (its pid written, SIGTERM ignored if asked)."""
    ready_r, ready_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.setsid()
        if os.fork() == 0:
            if ignore_term:
                signal.signal(signal.SIGTERM, signal.SIG_IGN)
            with open(pidfile, "a") as fh:
                fh.write(f"{os.getpid()}\n")
            os.write(ready_w, b"x")
            while True:
                time.sleep(3600)
        os.read(ready_r, 1)
        os._exit(0)
    os.waitpid(pid, 0)
    os.close(ready_r)
    os.close(ready_w)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--socket")
    p.add_argument("--port", type=int)
    p.add_argument("--mode", default="serve")
    p.add_argument("--exit-after", type=float)
    p.add_argument("--exit-code", type=int, default=1)
    p.add_argument("--grandchildren", type=int, default=0)
    p.add_argument("--pidfile")
    p.add_argument("--fail-starts", type=int, default=0)
    p.add_argument("--hang-after", type=float)
    p.add_argument("--helper")
    p.add_argument("--helper-ignores-term", action="store_true")
    args = p.parse_args()
    if args.pidfile:
        with open(args.pidfile, "a") as fh:
            fh.write(f"{os.getpid()}\n")
        with open(args.pidfile) as fh:
            if len(fh.read().split()) <= args.fail_starts:
                args.exit_after, args.exit_code = 0.05, 1
    if args.hang_after is not None:
        HANG_AT[0] = time.monotonic() + args.hang_after
    if args.mode == "ignore-term":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    print(f"fake engine pid {os.getpid()} mode {args.mode}", flush=True)
    if args.mode != "silent":
        if args.socket:
            if os.path.exists(args.socket):
                os.unlink(args.socket)
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.bind(args.socket)
        else:
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind(("127.0.0.1", args.port))
        sock.listen(16)
        threading.Thread(target=serve, args=(sock, args.mode), daemon=True).start()
    if args.grandchildren:
        double_fork(args.grandchildren)
    if args.helper:
        setsid_helper(args.helper, args.helper_ignores_term)
    if args.exit_after is not None:
        time.sleep(args.exit_after)
        print("fake engine exiting", file=sys.stderr, flush=True)
        os._exit(args.exit_code)
    while True:
        time.sleep(3600)


if __name__ == "__main__":
    main()
