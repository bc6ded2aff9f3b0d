"""Stopping: graceful SIGTERM, escalation to SIGKILL, a hurried second signal, and no engine
outliving a SIGKILLed supervisor (PR_SET_PDEATHSIG)."""

from __future__ import annotations

import signal
import time
from pathlib import Path

from support.supervisor_harness import pid_alive, scripted_engine, start_supervisor, write_config
from support.waiting import wait_until

#: Room for a 60 s stop_timeout after the (default, quiet) drain: check-config insists.
LONG_GRACE = {"shutdown_grace": "90s"}


def test_sigterm_stops_gracefully_and_escalates_for_a_stubborn_engine(tmp_path: Path) -> None:
    engines = [scripted_engine(tmp_path, "polite", stop_timeout="1s"),
               scripted_engine(tmp_path, "stubborn", "ignore-term", stop_timeout="1s")]
    sup = start_supervisor(write_config(tmp_path, engines))
    running = [sup.wait_engine(n, lambda e: e["state"] == "running") for n in ("polite",
                                                                               "stubborn")]
    started = time.monotonic()
    assert sup.stop(signal.SIGTERM, timeout=15) == 0
    assert time.monotonic() - started < 1 + 4  # stop_timeout + margin
    assert not any(pid_alive(e["pid"]) for e in running)
    exits = {e["engine"]: (e["cause"], e["process_cause"]) for e in sup.events("engine_exited")}
    assert exits == {"polite": ("stopped", "signal_SIGTERM"),
                     "stubborn": ("stopped", "signal_SIGKILL")}
    [kill] = sup.events("engine_killed")
    assert kill["engine"] == "stubborn" and kill["reason"] == "stop_timeout elapsed"


def test_second_sigterm_skips_the_wait(tmp_path: Path) -> None:
    engines = [scripted_engine(tmp_path, "stubborn", "ignore-term", stop_timeout="60s")]
    sup = start_supervisor(write_config(tmp_path, engines, supervisor=LONG_GRACE))
    pid = sup.wait_engine("stubborn", lambda e: e["state"] == "running")["pid"]
    sup.proc.send_signal(signal.SIGTERM)
    wait_until(lambda: sup.events("engine_stopping"), 10, "the stop signal to the engine")
    started = time.monotonic()
    sup.proc.send_signal(signal.SIGINT)
    assert sup.proc.wait(10) == 0
    assert time.monotonic() - started < 10
    sup.close()
    assert not pid_alive(pid)
    assert sup.events("engine_killed", reason="stop hurried")


def test_sigkill_of_the_supervisor_leaves_no_engine(tmp_path: Path) -> None:
    engines = [scripted_engine(tmp_path, "a"), scripted_engine(tmp_path, "b", "ignore-term")]
    sup = start_supervisor(write_config(tmp_path, engines))
    pids = [sup.wait_engine(n, lambda e: e["state"] == "running")["pid"] for n in ("a", "b")]
    sup.proc.send_signal(signal.SIGKILL)
    sup.proc.wait(10)
    sup.close()
    wait_until(lambda: not any(pid_alive(p) for p in pids), 5, "engines to die with the "
                                                                "supervisor")


def test_second_signal_before_the_stops_went_out_still_hurries(tmp_path: Path) -> None:
    # TERM and INT back to back (different signals, so the kernel does not merge them) are
    # handled before the shutdown has sent any stop: the second must still skip stop_timeout.
    engines = [scripted_engine(tmp_path, "stubborn", "ignore-term", stop_timeout="60s")]
    sup = start_supervisor(write_config(tmp_path, engines, supervisor=LONG_GRACE))
    pid = sup.wait_engine("stubborn", lambda e: e["state"] == "running")["pid"]
    started = time.monotonic()
    sup.proc.send_signal(signal.SIGTERM)
    sup.proc.send_signal(signal.SIGINT)
    assert sup.proc.wait(15) == 0
    assert time.monotonic() - started < 15
    sup.close()
    assert not pid_alive(pid)


def test_start_and_restart_are_refused_while_stopping(tmp_path: Path) -> None:
    engines = [scripted_engine(tmp_path, "stubborn", "ignore-term", stop_timeout="60s")]
    sup = start_supervisor(write_config(tmp_path, engines, supervisor=LONG_GRACE))
    try:
        sup.wait_engine("stubborn", lambda e: e["state"] == "running")
        sup.proc.send_signal(signal.SIGTERM)
        wait_until(lambda: sup.events("engine_stopping"), 10, "the stop signal to the engine")
        for verb in ("start", "restart"):
            status, body = sup.request("POST", f"/v1/engines/stubborn/{verb}")
            assert status == 409 and "stopping" in body["error"], (status, body)
        assert sup.engine("stubborn")["state"] == "stopping"
        sup.proc.send_signal(signal.SIGINT)
        assert sup.proc.wait(15) == 0
    finally:
        sup.close()
