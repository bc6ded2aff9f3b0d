"""A tiny stand-in engine for supervisor tests: stdlib only, so it starts in ~30 ms.

    python scripted_engine.py --socket PATH | --port N  [--mode MODE] [--exit-after S]
                          [--exit-code N] [--grandchildren N] [--pidfile PATH]

Modes: ``serve`` (answer GET /status with a valid document), ``hang`` (accept connections,
never answer), ``garbage`` (answer 200 with non-JSON), ``silent`` (bind nothing),
``ignore-term`` (serve, but ignore SIGTERM), ``big`` (a valid 1 MB pretty-printed document sent
chunked in 1 KiB writes, as a busy cuzk does; ``--send-secs S`` paces the writes so one
document takes S seconds to arrive, as over a slow or congested link), ``http500`` (answer
500 with a short text),
``wrong-shape`` (valid JSON missing ``memory``). ``--exit-after`` exits with ``--exit-code`` after
that many seconds; ``--grandchildren`` double-forks that many short-lived grandchildren;
``--pidfile`` appends this process's pid (one line per start) so tests can count starts;
``--fail-starts N`` makes the first N starts (counted in the pidfile) exit 1 after 50 ms;
``--hang-after S`` stops answering /status (connections hang) S seconds after start;
``--helper PIDFILE`` double-forks a helper into its own session (``setsid``) that appends its
pid to PIDFILE and sleeps (``--helper-ignores-term``: with SIGTERM ignored;
``--helper-clean-env``: as ``sleep`` exec'd with an empty environment, so nothing names its
engine).
``--progress-every S`` lists a job whose first partition moves one phase every S seconds (the
second stays in ``gpu``); ``--freeze-after S`` stops that movement S seconds after start and
prints ``fake engine frozen`` (a hung GPU kernel: /status answers, nothing moves);
``--quiet-after S`` lists no job from S seconds after start on (the work is over: a quiet
moment for the supervisor's stop sequence);
``--answer-after S`` answers each /status request S seconds after it arrived (a busy engine's
reply in flight); ``--listen-after S`` binds its status socket S seconds after start (a slow
starter: cuzk lists its GPUs first); ``--served PATH`` appends a line to PATH for each answer sent;
``--stderr-lines N`` writes N numbered lines to stderr at start; ``--abort-after S`` calls
abort() with core dumps allowed (core file in ``--core-dir``); ``--oom-cgroup DIR`` moves the
engine into that memory cgroup at start and ``--oom-after S`` then allocates until killed.
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
START = time.monotonic()
#: (progress step seconds, freeze after seconds) when the document shows a moving job
PIPELINE: list[float | None] = [None, None]
#: seconds after start from which no job is listed
QUIET_AT = [float("inf")]
CYCLE = ("pending", "synthesizing", "synth_done", "gpu")


def document() -> dict[str, object]:
    every, freeze = PIPELINE
    elapsed = time.monotonic() - START
    if every is None or elapsed >= QUIET_AT[0]:
        return STATUS
    step = int(min(elapsed, freeze if freeze is not None else elapsed) / every)
    states = [CYCLE[step % len(CYCLE)], "gpu"]
    partitions = [{"index": i, "state": st, "synth_ms": None, "gpu_ms": None}
                  for i, st in enumerate(states)]
    pipeline = {"job_id": f"job-{step // len(CYCLE)}", "proof_kind": "porep-c2",
                "started_secs_ago": 1.0, "total_partitions": 2, "partitions_done": 0,
                "partitions": partitions}
    return {**STATUS, "uptime_secs": elapsed, "pipelines": [pipeline]}


def announce_freeze(after: float) -> None:
    time.sleep(after)
    print("fake engine frozen", flush=True)


#: ``big``: jobs x 16 pending partitions, pretty-printed, is just over 1 MB.
BIG_JOBS = 480
PIECE = 1024


def big_status() -> bytes:
    pipelines = [{"job_id": f"ps-snap-{3644168 + j}-33825-1120793", "proof_kind": "snap-update",
                  "started_secs_ago": 1.5, "total_partitions": 16, "partitions_done": 0,
                  "partitions": [{"index": p, "state": "pending", "synth_ms": None,
                                  "gpu_ms": None} for p in range(16)]}
                 for j in range(BIG_JOBS)]
    return json.dumps({**STATUS, "pipelines": pipelines}, indent=2).encode()


def send_chunked(conn: socket.socket, body: bytes) -> None:
    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                 b"Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n")
    began = time.monotonic()
    step = SEND_SECS[0] * PIECE / max(len(body), 1)
    for i, start in enumerate(range(0, len(body), PIECE)):
        piece = body[start:start + PIECE]
        conn.sendall(b"%x\r\n%s\r\n" % (len(piece), piece))
        if step:
            time.sleep(max(0.0, began + (i + 1) * step - time.monotonic()))
    conn.sendall(b"0\r\n\r\n")


def respond(conn: socket.socket, mode: str) -> None:
    with conn:
        conn.recv(65536)
        if mode == "hang" or time.monotonic() >= HANG_AT[0]:
            time.sleep(3600)
            return
        if mode == "big":
            send_chunked(conn, BIG_BODY[0])
            return
        time.sleep(ANSWER_AFTER[0])
        status = b"500 Internal Server Error" if mode == "http500" else b"200 OK"
        body = {"garbage": b"this is not json", "http500": b"worker pool gone",
                "wrong-shape": json.dumps({k: v for k, v in STATUS.items() if k != "memory"})
                .encode()}.get(mode) or json.dumps(document()).encode()
        conn.sendall(b"HTTP/1.1 " + status + b"\r\nContent-Type: application/json\r\n"
                     b"Content-Length: " + str(len(body)).encode() + b"\r\n"
                     b"Connection: close\r\n\r\n" + body)
        if SERVED[0]:
            with open(SERVED[0], "a") as fh:
                fh.write("served\n")


BIG_BODY = [b""]
SEND_SECS = [0.0]
ANSWER_AFTER = [0.0]
SERVED = [""]


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


def setsid_helper(pidfile: str, ignore_term: bool, clean_env: bool) -> None:
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
            if clean_env:  # SIG_IGN survives exec
                os.execve("/bin/sleep", ["sleep", "3600"], {})
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
    p.add_argument("--helper-clean-env", action="store_true")
    p.add_argument("--progress-every", type=float)
    p.add_argument("--freeze-after", type=float)
    p.add_argument("--quiet-after", type=float)
    p.add_argument("--stderr-lines", type=int, default=0)
    p.add_argument("--abort-after", type=float)
    p.add_argument("--core-dir")
    p.add_argument("--oom-cgroup")
    p.add_argument("--oom-after", type=float)
    p.add_argument("--send-secs", type=float, default=0.0)
    p.add_argument("--answer-after", type=float, default=0.0)
    p.add_argument("--served", default="")
    p.add_argument("--listen-after", type=float, default=0.0)
    args = p.parse_args()
    SEND_SECS[0] = args.send_secs
    ANSWER_AFTER[0], SERVED[0] = args.answer_after, args.served
    if args.oom_cgroup:
        with open(os.path.join(args.oom_cgroup, "cgroup.procs"), "w") as fh:
            fh.write(str(os.getpid()))
    PIPELINE[:] = [args.progress_every, args.freeze_after]
    if args.quiet_after is not None:
        QUIET_AT[0] = args.quiet_after
    if args.freeze_after is not None:
        threading.Thread(target=announce_freeze, args=(args.freeze_after,), daemon=True).start()
    for i in range(args.stderr_lines):
        print(f"stderr line {i}", file=sys.stderr, flush=True)
    if args.pidfile:
        with open(args.pidfile, "a") as fh:
            fh.write(f"{os.getpid()}\n")
        with open(args.pidfile) as fh:
            if len(fh.read().split()) <= args.fail_starts:
                args.exit_after, args.exit_code = 0.05, 1
    if args.hang_after is not None:
        HANG_AT[0] = time.monotonic() + args.hang_after
    if args.mode == "big":
        BIG_BODY[0] = big_status()
    if args.mode == "ignore-term":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    print(f"fake engine pid {os.getpid()} mode {args.mode}", flush=True)
    if args.mode != "silent":
        time.sleep(args.listen_after)
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
        setsid_helper(args.helper, args.helper_ignores_term, args.helper_clean_env)
    if args.abort_after is not None:
        import resource

        resource.setrlimit(resource.RLIMIT_CORE, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
        os.chdir(args.core_dir or "/tmp")
        time.sleep(args.abort_after)
        os.abort()
    if args.oom_after is not None:
        time.sleep(args.oom_after)
        hog = []
        while True:
            hog.append(b"x" * (16 << 20))  # written, so every page is resident
    if args.exit_after is not None:
        time.sleep(args.exit_after)
        print("fake engine exiting", file=sys.stderr, flush=True)
        os._exit(args.exit_code)
    while True:
        time.sleep(3600)


if __name__ == "__main__":
    main()
