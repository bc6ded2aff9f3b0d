"""Descriptor exhaustion on a real supervisor: retried, recovered from, never a log flood.

The supervisor's own ``RLIMIT_NOFILE`` is lowered (at its start, as ``ulimit -n 64`` would, or
while it runs with ``prlimit`` on its pid): connections and spawns then meet ``EMFILE`` for real.
"""

from __future__ import annotations

import contextlib
import os
import resource
import signal
import socket
import sys
import urllib.request
from pathlib import Path

from support.supervisor_harness import scripted_engine, start_supervisor, write_config
from support.waiting import wait_until

#: Runs the rest of argv with RLIMIT_NOFILE lowered, like ``ulimit -n N; exec ...``.
_ULIMIT = ("import os, resource, sys; n = int(sys.argv[1]); "
           "resource.setrlimit(resource.RLIMIT_NOFILE, (n, n)); "
           "os.execv(sys.argv[2], sys.argv[2:])")

FAST = {"health_interval": "50ms", "stop_timeout": "1s", "backoff_initial": "50ms",
        "backoff_max": "200ms"}


def _open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def test_spawn_out_of_descriptors_backs_off_and_recovers(tmp_path: Path) -> None:
    eng = scripted_engine(tmp_path, "gpu0", **FAST)
    sup = start_supervisor(write_config(tmp_path, [eng]))
    pid = sup.proc.pid
    try:
        first = sup.wait_engine("gpu0", lambda e: e["state"] == "running")
        limits = resource.prlimit(pid, resource.RLIMIT_NOFILE)
        # The engine's pipes and status connection close when it dies: room for none of them.
        resource.prlimit(pid, resource.RLIMIT_NOFILE, (_open_fds(pid) - 4, limits[1]))
        os.kill(first["pid"], signal.SIGKILL)
        def retries() -> list[dict[str, object]]:
            found = sup.events("engine_state_changed", engine="gpu0", new="backoff")
            return found if len(found) >= 5 else []

        retried = wait_until(retries, 20, "five spawn retries")
        assert all("Too many open files" in str(e["reason"]) for e in retried)
        resource.prlimit(pid, resource.RLIMIT_NOFILE, limits)
        again = sup.wait_engine("gpu0", lambda e: e["state"] == "running" and
                                e["pid"] != first["pid"], what="respawned")
        assert again["last_error"] is None
    finally:
        assert sup.stop() == 0
    assert not sup.events("engine_state_changed", engine="gpu0", new="failed")
    # one line for the whole burst of failures (rate-limited per engine and errno)
    [failed] = sup.events("engine_spawn_failed", engine="gpu0")
    assert failed["errno"] == "EMFILE" and failed["transient"] is True


def _metrics_answers(address: str) -> bool:
    try:
        with urllib.request.urlopen(f"http://{address}/metrics", timeout=2) as resp:
            return resp.status == 200 and b"cuzkd_engine_up" in resp.read()
    except OSError:
        return False


def test_idle_connection_flood_under_ulimit_64(tmp_path: Path) -> None:
    eng = scripted_engine(tmp_path, "gpu0", **FAST)
    sup = start_supervisor(write_config(tmp_path, [eng]),
                           prefix=[sys.executable, "-c", _ULIMIT, "64"])
    flood: list[socket.socket] = []
    try:
        first = sup.wait_engine("gpu0", lambda e: e["state"] == "running")
        address = sup.about()["metrics_listen"]
        host, port = address.rsplit(":", 1)
        for _ in range(100):  # idle: connect and never send a byte
            # a connection refused over the limit may be reset before connect() returns
            with contextlib.suppress(ConnectionResetError):
                flood.append(socket.create_connection((host, int(port)), timeout=5))
        # the control socket answers throughout, and an engine can still be spawned
        assert sup.about()["engines_running"] == 1
        os.kill(first["pid"], signal.SIGKILL)
        sup.wait_engine("gpu0", lambda e: e["state"] == "running" and e["pid"] != first["pid"],
                        what="respawned while the connections are held")
        # the idle connections are closed by the supervisor (~10 s): /metrics answers again
        wait_until(lambda: _metrics_answers(address), 30, "/metrics answering again")
        assert sup.about()["engines_running"] == 1
    finally:
        for sock in flood:
            sock.close()
        assert sup.stop() == 0
    lines = sup.log_text().splitlines()
    assert len(lines) < 80, "\n".join(lines[:100])  # no flood: a few rate-limited lines
    assert not [line for line in lines if not line.startswith("{")]  # no raw tracebacks
    assert not sup.events("engine_state_changed", engine="gpu0", new="failed")
    # the listener refused connections over its limit: no descriptor ran out anywhere
    assert sup.events("metrics_connection_refused")
    assert not sup.events("event_loop_error_caught") and not sup.events("metrics_accept_failed")
