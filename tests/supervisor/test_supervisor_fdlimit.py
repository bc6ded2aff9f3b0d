"""Descriptor exhaustion on a real supervisor: retried, recovered from, never a log flood.

The supervisor's own ``RLIMIT_NOFILE`` is lowered while it runs (``prlimit`` on its pid, as an
operator's ``ulimit -n`` would): spawns then fail with ``EMFILE`` for real.
"""

from __future__ import annotations

import os
import resource
import signal
from pathlib import Path

from sv_harness import fake_engine, start_supervisor, wait_until, write_config

FAST = {"health_interval": "50ms", "stop_timeout": "1s", "backoff_initial": "50ms",
        "backoff_max": "200ms"}


def _open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def test_spawn_out_of_descriptors_backs_off_and_recovers(tmp_path: Path) -> None:
    eng = fake_engine(tmp_path, "gpu0", **FAST)
    sup = start_supervisor(write_config(tmp_path, [eng]))
    pid = sup.proc.pid
    try:
        first = sup.wait_engine("gpu0", lambda e: e["state"] == "running")
        limits = resource.prlimit(pid, resource.RLIMIT_NOFILE)
        # The engine's pipes and status connection close when it dies: room for none of them.
        resource.prlimit(pid, resource.RLIMIT_NOFILE, (_open_fds(pid) - 4, limits[1]))
        os.kill(first["pid"], signal.SIGKILL)
        def retries() -> list[dict[str, object]]:
            found = sup.events("engine_state", engine="gpu0", new="backoff")
            return found if len(found) >= 5 else []

        retried = wait_until(retries, 20, "five spawn retries")
        assert all("Too many open files" in str(e["reason"]) for e in retried)
        resource.prlimit(pid, resource.RLIMIT_NOFILE, limits)
        again = sup.wait_engine("gpu0", lambda e: e["state"] == "running" and
                                e["pid"] != first["pid"], what="respawned")
        assert again["last_error"] is None
    finally:
        assert sup.stop() == 0
    assert not sup.events("engine_state", engine="gpu0", new="failed")
    # one line for the whole burst of failures (rate-limited per engine and errno)
    [failed] = sup.events("engine_spawn_failed", engine="gpu0")
    assert failed["errno"] == "EMFILE" and failed["transient"] is True
