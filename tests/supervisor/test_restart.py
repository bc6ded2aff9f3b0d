"""Restart behaviour of a real supervisor with real (tiny) engine processes."""

from __future__ import annotations

import os
import signal
from datetime import datetime
from pathlib import Path

from support.supervisor_harness import scripted_engine, start_supervisor, write_config
from support.waiting import wait_until

FAST = {"health_interval": "50ms", "stop_timeout": "1s"}


def _ts(event: dict[str, object]) -> float:
    return datetime.fromisoformat(str(event["timestamp"])).timestamp()


def test_crash_loop_backs_off_with_growing_delays(tmp_path: Path) -> None:
    eng = scripted_engine(tmp_path, "crashy", args=["--exit-after", "0.05"],
                      backoff_initial="100ms", backoff_max="800ms", backoff_multiplier=2.0,
                      **FAST)
    sup = start_supervisor(write_config(tmp_path, [eng]))
    try:
        wait_until(lambda: len(sup.events("engine_state_changed", engine="crashy",
                                          new="backoff")) >= 5,
                   20, "five backoff periods")
        info = sup.engine("crashy")
    finally:
        assert sup.stop() == 0
    backoffs = sup.events("engine_state_changed", engine="crashy", new="backoff")
    delays = [float(e["restart_delay"]) for e in backoffs]
    # 100ms, 200ms, 400ms, 800ms (cap) with at most 20% jitter off each
    assert delays[:3] == sorted(delays[:3])
    for expected, got in zip([0.1, 0.2, 0.4, 0.8, 0.8], delays, strict=False):
        assert expected * 0.79 <= got <= expected + 1e-3, delays
    # the replacement never started before its delay was over
    spawns = [_ts(e) for e in sup.events("engine_spawned", engine="crashy")]
    for event, delay in zip(backoffs[:4], delays, strict=False):
        after = [t for t in spawns if t >= _ts(event)]
        assert after and after[0] - _ts(event) >= delay - 0.01
    assert info["exits"]["exit_1"] >= 5
    assert info["restarts"] >= 5


def test_healthy_engine_killed_restarts_at_once(tmp_path: Path) -> None:
    """A real SIGKILL of a running engine: counted as ``signal_SIGKILL``, and (its first
    failure) a new process at once, no backoff period. The backoff rules themselves (growth,
    reset after backoff_reset_after of healthy running) are exact on virtual time in
    test_runner_virtual.py; this waits on state transitions only."""
    eng = scripted_engine(tmp_path, "steady", backoff_initial="30s", backoff_max="30s", **FAST)
    sup = start_supervisor(write_config(tmp_path, [eng]))
    try:
        first = sup.wait_engine("steady", lambda e: e["state"] == "running")
        os.kill(first["pid"], signal.SIGKILL)
        after = sup.wait_engine("steady", lambda e: e["state"] == "running"
                                and e["pid"] not in (None, first["pid"]))
    finally:
        assert sup.stop() == 0
    assert after["last_exit_cause"] == "signal_SIGKILL" and after["restarts"] == 1
    # no backoff period: the kill led straight to a new process (a 30 s one would time out)
    assert not sup.events("engine_state_changed", engine="steady", new="backoff")


def test_hung_engine_is_killed_and_restarted_after_unhealthy_after(tmp_path: Path) -> None:
    eng = scripted_engine(tmp_path, "hangs", args=["--hang-after", "0.3"],
                      unhealthy_after="600ms", backoff_initial="100ms", **FAST)
    ok = scripted_engine(tmp_path, "fine", **FAST)
    sup = start_supervisor(write_config(tmp_path, [eng, ok]))
    try:
        first = sup.wait_engine("hangs", lambda e: e["state"] == "running")
        after = sup.wait_engine("hangs", lambda e: e["pid"] not in (None, first["pid"]),
                                timeout=20, what="a replacement process")
        fine = sup.engine("fine")
    finally:
        assert sup.stop() == 0
    assert after["exits"] == {"unhealthy": 1}
    assert after["restarts"] == 1
    [kill] = [e for e in sup.events("engine_state_changed", engine="hangs", new="stopping")
              if e["reason"].startswith("status silent for unhealthy_after (last error: ")]
    assert _ts(kill) - first["started_at"] >= 0.3 + 0.6 - 0.05
    assert fine["state"] == "running" and fine["restarts"] == 0


def test_garbage_status_never_becomes_running(tmp_path: Path) -> None:
    eng = scripted_engine(tmp_path, "garbled", "garbage", start_timeout="500ms",
                      backoff_initial="100ms", **FAST)
    ok = scripted_engine(tmp_path, "fine", **FAST)
    sup = start_supervisor(write_config(tmp_path, [eng, ok]))
    try:
        info = sup.wait_engine("garbled", lambda e: e["exits"].get("start_timeout", 0) >= 1,
                               timeout=20)
        assert not sup.events("engine_state_changed", engine="garbled", new="running")
        assert sup.engine("fine")["state"] == "running"
    finally:
        assert sup.stop() == 0
    assert info["last_exit_cause"] == "start_timeout"
