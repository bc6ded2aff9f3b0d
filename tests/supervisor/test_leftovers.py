"""No engine descendant outlives its engine or its supervisor (real processes, real signals).

Helpers that ``setsid`` and double-fork out of the engine's group and tree, helpers that ignore
SIGTERM, and an engine behind a wrapper shell that survives a SIGKILLed supervisor.
"""

from __future__ import annotations

import os
import signal
import socket
import sys
import urllib.request
from datetime import datetime
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families
from support.supervisor_harness import (
    FAKE_ENGINE,
    RunningSupervisor,
    pid_alive,
    scripted_engine,
    start_supervisor,
    write_config,
)
from support.waiting import wait_until

FAST = {"health_interval": "50ms", "stop_timeout": "500ms", "backoff_initial": "50ms"}


def _helpers(pidfile: Path) -> list[int]:
    return [int(p) for p in pidfile.read_text().split()] if pidfile.exists() else []


def _killed_metric(sup: RunningSupervisor, engine: str) -> float:
    url = f"http://{sup.about()['metrics_listen']}/metrics"
    with urllib.request.urlopen(url, timeout=10) as resp:
        text = resp.read().decode()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if (sample.name == "cuzkd_engine_descendants_killed_total"
                    and sample.labels == {"engine": engine}):
                return sample.value
    raise AssertionError("no cuzkd_engine_descendants_killed_total")


def _ts(event: dict[str, Any]) -> float:
    return datetime.fromisoformat(str(event["timestamp"])).timestamp()


def test_setsid_helpers_of_exited_engines_are_stopped_and_counted(tmp_path: Path) -> None:
    pidfile = tmp_path / "helpers"
    eng = scripted_engine(tmp_path, "gpu0", args=["--helper", str(pidfile), "--exit-after", "0.3"],
                      **FAST)
    sup = start_supervisor(write_config(tmp_path, [eng]))
    try:
        def three_stopped() -> list[dict[str, Any]]:
            found = sup.events("engine_descendants_stopped", engine="gpu0")
            return found if len(found) >= 3 else []

        stopped = wait_until(three_stopped, 30, "three engines' helpers stopped")
        assert all(e["count"] == 1 and e["left"] == [] for e in stopped)
        swept = [pid for e in stopped for pid in e["pids"]]
        assert not [pid for pid in swept if pid_alive(pid)]
        helpers = _helpers(pidfile)
        assert set(swept) <= set(helpers)
        # no pile-up: at most the running engine's helper and one being stopped are alive
        assert [pid for pid in helpers[:-2] if pid_alive(pid)] == []
        assert _killed_metric(sup, "gpu0") >= 3
    finally:
        assert sup.stop() == 0
    assert [pid for pid in _helpers(pidfile) if pid_alive(pid)] == []


def test_helpers_ignoring_sigterm_are_killed_after_stop_timeout(tmp_path: Path) -> None:
    pidfile = tmp_path / "helpers"
    eng = scripted_engine(tmp_path, "gpu0", restart="never",
                      args=["--helper", str(pidfile), "--helper-ignores-term",
                            "--exit-after", "0.3", "--exit-code", "0"], **FAST)
    sup = start_supervisor(write_config(tmp_path, [eng]))
    try:
        [done] = wait_until(lambda: sup.events("engine_descendants_stopped", engine="gpu0"), 20,
                            "the helper stopped")
        [helper] = _helpers(pidfile)
        assert not pid_alive(helper)
        assert done["pids"] == [helper]
        [began] = sup.events("engine_descendants_stopping", engine="gpu0")
        assert _ts(done) - _ts(began) >= 0.5  # TERM was ignored: KILL after stop_timeout
        assert _killed_metric(sup, "gpu0") == 1
    finally:
        assert sup.stop() == 0


def test_the_replacement_starts_once_the_previous_helpers_are_gone(tmp_path: Path) -> None:
    """A helper that ignores SIGTERM may hold the dead engine's port or GPU memory until it is
    killed; a replacement spawned meanwhile would fail to bind and count as a crash."""
    pidfile = tmp_path / "helpers"
    eng = scripted_engine(tmp_path, "gpu0", args=["--helper", str(pidfile), "--helper-ignores-term",
                                              "--exit-after", "1.5"],  # running by then
                      **{**FAST, "stop_timeout": "1s"})
    sup = start_supervisor(write_config(tmp_path, [eng]))
    try:
        spawned = wait_until(lambda: sup.events("engine_spawned", engine="gpu0")[1:], 20,
                             "the replacement")
        [stopped, *_] = sup.events("engine_descendants_stopped", engine="gpu0")
        [waited, *_] = sup.events("engine_spawn_waiting", engine="gpu0")
        assert _ts(spawned[0]) >= _ts(stopped) >= _ts(waited) + 0.9  # TERM ignored: KILL at 1s
        assert waited["pids"] == stopped["pids"] == _helpers(pidfile)[:1]
        # meanwhile it reads as starting without a process, not as the dead one running
        [moved, *_] = [e for e in sup.events("engine_state_changed", engine="gpu0")
                       if "leftovers" in e["reason"]]
        assert (moved["new"], moved["pid"]) == ("starting", None)
    finally:
        assert sup.stop() == 0


#: An engine that finishes its work on SIGTERM (half a second), then exits.
_DRAINING_ENGINE = """
import signal, sys, time
def term(*_):
    print("draining", flush=True)
    time.sleep(0.5)
    print("drained", flush=True)
    sys.exit(0)
signal.signal(signal.SIGTERM, term)
print("ready", flush=True)
while True:
    time.sleep(1)
"""


def test_an_engine_behind_a_wrapper_shell_finishes_its_stop(tmp_path: Path) -> None:
    """``sh -c "cuzk ...; echo done"``: the stop signal reaches the whole group and the shell
    dies of it at once; the engine under it must get its stop_timeout to finish, not a SIGKILL
    of the group the moment the shell is gone."""
    script = tmp_path / "engine.py"
    script.write_text(_DRAINING_ENGINE)
    eng = {"name": "wrapped", "command": ["sh", "-c", f"{sys.executable} {script}; echo done"],
           "stop_timeout": "5s"}
    sup = start_supervisor(write_config(tmp_path, [eng]))
    try:
        wait_until(lambda: sup.events("engine_output", engine="wrapped", line="ready"), 20,
                   "the engine under the shell")
        sup.wait_engine("wrapped", lambda e: e["state"] == "running")
        status, body = sup.request("POST", "/v1/engines/wrapped/stop", timeout=30)
        assert status == 200, body
        wait_until(lambda: sup.events("engine_output", engine="wrapped", line="drained"), 10,
                   "the engine's own shutdown")
        assert not sup.events("engine_group_killed", engine="wrapped")
    finally:
        assert sup.stop() == 0


def test_shutdown_stops_every_helper_before_exiting(tmp_path: Path) -> None:
    pidfiles = [tmp_path / "h0", tmp_path / "h1"]
    engines = [scripted_engine(tmp_path, f"gpu{i}", args=["--helper", str(pf),
                                                       "--helper-ignores-term"], **FAST)
               for i, pf in enumerate(pidfiles)]
    sup = start_supervisor(write_config(tmp_path, engines))
    try:
        for name in ("gpu0", "gpu1"):
            sup.wait_engine(name, lambda e: e["state"] == "running")
        helpers = wait_until(lambda: all(_helpers(pf) for pf in pidfiles) and
                             [_helpers(pf)[0] for pf in pidfiles], 20, "helpers started")
        assert all(pid_alive(pid) for pid in helpers)
    finally:
        assert sup.stop() == 0
    assert [pid for pid in helpers if pid_alive(pid)] == []
    assert sorted(pid for e in sup.events("engine_descendants_stopped")
                  for pid in e["pids"]) == sorted(helpers)


def test_shutdown_stops_an_adopted_child_that_names_no_engine(tmp_path: Path) -> None:
    pidfile = tmp_path / "helpers"
    eng = scripted_engine(tmp_path, "gpu0", args=["--helper", str(pidfile), "--helper-clean-env",
                                              "--helper-ignores-term"], **FAST)
    sup = start_supervisor(write_config(tmp_path, [eng]))
    try:
        sup.wait_engine("gpu0", lambda e: e["state"] == "running")
        [helper] = wait_until(lambda: _helpers(pidfile), 20, "the helper started")
        wait_until(lambda: Path(f"/proc/{helper}/environ").read_bytes() == b"", 20,
                   "the helper exec'd without an environment")
    finally:
        assert sup.stop() == 0
    assert not pid_alive(helper)
    # attributed by a tree walk if one saw it before it escaped, else stopped as adopted
    stopped = [*sup.events("engine_descendants_stopped"), *sup.events("adopted_stopped")]
    assert [pid for e in stopped for pid in e["pids"]] == [helper]


def test_engine_removed_by_reload_leaves_no_helper(tmp_path: Path) -> None:
    pidfile = tmp_path / "helpers"
    keep = scripted_engine(tmp_path, "keep", **FAST)
    gone = scripted_engine(tmp_path, "gone", args=["--helper", str(pidfile),
                                               "--helper-ignores-term"], **FAST)
    config = write_config(tmp_path, [keep, gone])
    sup = start_supervisor(config)
    try:
        sup.wait_engine("gone", lambda e: e["state"] == "running")
        [helper] = wait_until(lambda: _helpers(pidfile), 20, "the helper started")
        write_config(tmp_path, [keep])
        sup.proc.send_signal(signal.SIGHUP)
        wait_until(lambda: sup.events("supervisor_reloaded"), 20, "the reload applied")
        assert not pid_alive(helper)  # gone before the reload was declared applied
        assert set(sup.engines()) == {"keep"}
    finally:
        assert sup.stop() == 0


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_wrapped_engine_left_by_a_killed_supervisor_is_ended_at_next_start(
        tmp_path: Path) -> None:
    port = _port()
    pidfile = tmp_path / "engine-pids"
    engine_cmd = (f"{sys.executable} {FAKE_ENGINE} --port {port} --mode ignore-term "
                  f"--pidfile {pidfile}; echo done")
    eng = {"name": "gpu0", "command": ["sh", "-c", engine_cmd],
           "status_url": f"http://127.0.0.1:{port}/status", **FAST}
    config = write_config(tmp_path, [eng])
    first = start_supervisor(config)
    try:
        first.wait_engine("gpu0", lambda e: e["state"] == "running")
        [grandchild] = _helpers(pidfile)
        os.kill(first.proc.pid, signal.SIGKILL)
        first.proc.wait(10)
    finally:
        first.close()
    # PDEATHSIG ended the shell only: the engine itself still runs and holds the port
    assert pid_alive(grandchild)
    second = start_supervisor(config)
    try:
        [ended] = second.events("previous_leftovers_stopped", engine="gpu0")
        assert ended["pids"] == [grandchild]
        assert not pid_alive(grandchild)
        eng_info = second.wait_engine("gpu0", lambda e: e["state"] == "running")
        assert eng_info["restarts"] == 0  # started cleanly: no loop against the leftover
        assert _killed_metric(second, "gpu0") == 1
    finally:
        assert second.stop() == 0
    assert [pid for pid in _helpers(pidfile) if pid_alive(pid)] == []


def test_escaped_helper_left_by_a_killed_supervisor_is_ended_at_next_start(
        tmp_path: Path) -> None:
    # The helper left the engine's group and tree (setsid + double fork): only the record of
    # what the supervisor saw names it after the supervisor is gone.
    pidfile = tmp_path / "helpers"
    config = write_config(tmp_path, [scripted_engine(tmp_path, "gpu0",
                                                     args=["--helper", str(pidfile)], **FAST)])
    first = start_supervisor(config)
    try:
        first.wait_engine("gpu0", lambda e: e["state"] == "running")
        [helper] = wait_until(lambda: _helpers(pidfile), 20, "the helper started")

        def recorded() -> bool:
            return any(str(helper) in p.read_text()
                       for p in (first.state_dir / "procs").glob("gpu0-*.json"))

        wait_until(recorded, 20, "the helper in the state dir record")
        os.kill(first.proc.pid, signal.SIGKILL)
        first.proc.wait(10)
    finally:
        first.close()
    assert pid_alive(helper)
    second = start_supervisor(config)
    try:
        [ended] = second.events("previous_leftovers_stopped", engine="gpu0")
        assert ended["pids"] == [helper]
        assert not pid_alive(helper)
    finally:
        assert second.stop() == 0
