"""The stall watchdog end to end: real supervisor, stand-in engines whose documents move or
freeze, real restarts."""

from __future__ import annotations

import urllib.request
from datetime import datetime
from pathlib import Path

from support.supervisor_harness import scripted_engine, start_supervisor, write_config
from support.waiting import wait_until

STALL_AFTER = 1.0
POLL = 0.1


def at(event: dict[str, object]) -> float:
    return datetime.fromisoformat(str(event["timestamp"])).timestamp()


def test_frozen_engine_is_restarted_idle_and_steady_ones_never_stall(tmp_path: Path) -> None:
    keys = {"stall_after": f"{STALL_AFTER}s", "health_interval": f"{POLL}s"}
    # The others' work never ends (frozen, or steady forever), so a drain at the final stop
    # could only wait out drain_timeout; "frozen" keeps its drain: a stall must skip it.
    undrained = {**keys, "drain": "none"}
    frozen = ["--progress-every", "0.2", "--freeze-after", "1.0"]
    config = write_config(tmp_path, [
        scripted_engine(tmp_path, "frozen", args=frozen, **keys),
        scripted_engine(tmp_path, "watched", args=frozen, stall_action="alert", **undrained),
        scripted_engine(tmp_path, "idle", **undrained),
        scripted_engine(tmp_path, "steady", args=["--progress-every", "0.3"], **undrained),
    ])
    sup = start_supervisor(config)
    try:
        first = sup.wait_engine("frozen", lambda e: e["state"] == "running")["pid"]
        sup.wait_engine("frozen", lambda e: e["exits"].get("stalled") == 1
                        and e["state"] == "running" and e["pid"] != first, timeout=20,
                        what="the frozen engine to be restarted for a stall")
        [freeze] = sup.events("engine_output", pid=first, line="fake engine frozen")
        [stall] = sup.events("engine_stalled", engine="frozen")
        assert stall["pid"] == first and stall["reason"] == "no_progress"
        assert stall["phases"]["gpu"] >= 1 and stall["action"] == "restart"
        delay = at(stall) - at(freeze)
        # within stall_after + one poll of the last change (seen up to a poll after it);
        # generous slack for a loaded 2-core CI machine, never earlier than stall_after
        assert STALL_AFTER - 0.2 <= delay <= STALL_AFTER + 2 * POLL + 1.0, delay
        [killed] = sup.events("engine_killed", engine="frozen")
        assert killed["reason"] == "stalled"
        [exited] = sup.events("engine_exited", engine="frozen", pid=first)
        assert (exited["cause"], exited["process_cause"]) == ("stalled", "signal_SIGKILL")
        assert not sup.events("engine_exit_unexpected", engine="frozen")

        watched = sup.wait_engine("watched", lambda e: e["stalled"], timeout=20)
        assert watched["stalls_total"] == 1 and watched["restarts"] == 0

        # The restarted one freezes again: its second stall is our clock -- by then the idle
        # and steady engines have been watched for longer than the startup grace (3 × 1 s).
        sup.wait_engine("frozen", lambda e: e["stalls_total"] == 2, timeout=20)
        for name in ("idle", "steady"):
            eng = sup.engine(name)
            assert (eng["stalls_total"], eng["stalled"], eng["restarts"]) == (0, False, 0), eng

        base = f"http://{sup.about()['metrics_listen']}"
        with urllib.request.urlopen(f"{base}/metrics", timeout=10) as resp:
            text = resp.read().decode()
        assert 'cuzkd_engine_stalled{engine="watched"} 1.0' in text
        assert 'cuzkd_engine_stalled{engine="idle"} 0.0' in text
        assert 'cuzkd_engine_stalls_total{engine="frozen"} 2.0' in text
        assert 'cuzkd_engine_exits_total{cause="stalled",engine="frozen"}' in text
        # A stall restart skips the drain (a hung kernel finishes nothing) and counts what it
        # threw away: the frozen job's two partitions (one synthesizing or gpu, one gpu) x 2.
        assert not sup.events("engine_drain_requested", engine="frozen")
        lost = 'cuzkd_engine_stop_inflight_partitions_total{engine="frozen",reason="stall"}'
        assert f"{lost} 4.0" in text or f"{lost} 3.0" in text, text
        wait_until(lambda: sup.engine("watched")["pid"] == watched["pid"], 1, "same pid")
    finally:
        assert sup.stop() == 0
