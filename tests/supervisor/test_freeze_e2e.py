"""A real ``cuzkd run`` frozen by SIGSTOP longer than its engines' unhealthy_after kills none.

The issue's case, kept small: three engines whose replies take 0.5 s (a poll is nearly always
in flight), status_timeout 1 s, unhealthy_after 2 s; the supervisor stopped for 3 s, then
continued. Their replies waited in the sockets: the overdue polls say nothing, and the polls
made after the resume find every engine answering.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

from support.supervisor_harness import scripted_engine, start_supervisor, write_config
from support.waiting import wait_until

ENGINES = ("a", "b", "c")


def served(path: Path) -> int:
    return len(path.read_text().splitlines()) if path.exists() else 0


def test_a_supervisor_frozen_past_unhealthy_after_kills_no_engine(tmp_path: Path) -> None:
    keys = {"health_interval": "100ms", "status_timeout": "1s", "unhealthy_after": "2s",
            "drain": "none", "stall_after": "0s"}
    engines = [scripted_engine(tmp_path, name, args=["--answer-after", "0.5",
                                                 "--served", str(tmp_path / f"{name}.served")],
                           **keys) for name in ENGINES]
    sup = start_supervisor(write_config(tmp_path, engines))
    try:
        pids = {name: sup.wait_engine(name, lambda e: e["state"] == "running")["pid"]
                for name in ENGINES}
        os.kill(sup.proc.pid, signal.SIGSTOP)
        time.sleep(3.0)  # the freeze itself (the stimulus, not a wait for something)
        at_resume = {name: served(tmp_path / f"{name}.served") for name in ENGINES}
        os.kill(sup.proc.pid, signal.SIGCONT)
        # Each engine (or a replacement, were it killed) answers polls made after the resume.
        wait_until(lambda: all(served(tmp_path / f"{n}.served") >= at_resume[n] + 3
                               for n in ENGINES), 10, "three answered polls after the resume")
        for name in ENGINES:
            info = sup.engine(name)
            assert (info["state"], info["pid"], info["restarts"]) == ("running", pids[name], 0)
        assert not sup.events("engine_state_changed", new="stopping")
        assert any(e["frozen_seconds"] >= 2.0 for e in sup.events("supervisor_resumed"))
    finally:
        sup.stop()
