"""``cuzkd upgrade`` end to end: a real ``cuzkd run`` with the cuzk stand-in behind its front
door, started from a program of its own (a console script in the test's directory, as pip
writes one), replaced under load by a program that says it is another version.

One supervisor for the module; each test replaces the program (as ``pip install -U`` does) and
asks for an upgrade. The last test ends the supervisor: its new program cannot take over.
Every wait is on an event (a call's end, an answer, a log event), never a sleep.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.cuzk_harness import LoadThread, cuzk_engine
from support.door_under_test import Door
from support.supervisor_harness import scripted_engine, start_supervisor, write_config
from support.waiting import wait_until

KNOBS = {"CUZK_STANDIN_SYNTH_SECS": "0.2", "CUZK_STANDIN_GPU_SECS": "0.05",
         "CUZK_STANDIN_POST_SECS": "0.3"}

#: A console script as pip writes one, with a version of its own: the cuzkd "installed"
_SCRIPT = """#!{python}
import sys
import cuzkd
cuzkd.__version__ = {version!r}
{extra}
from cuzkd.cli import main
sys.exit(main())
"""
#: A new program whose hand-over format is another (an older or much newer cuzkd)
OTHER_FORMAT = "import cuzkd.supervisor.core.handover as h; h.FORMAT = 99"
#: A new program whose door process would speak another channel vocabulary
OTHER_CHANNEL = "import cuzkd.supervisor.door.channel as c; c.VERSION = 99"
#: A new program that passes its dry run and fails after the exec: the metrics listener the
#: hand-over names is gone before it runs (its descriptor closed)
LOSES_LISTENER = """
if "--handover" in sys.argv:
    import json, os
    fd = int(sys.argv[sys.argv.index("--handover") + 1])
    for listener in json.loads(os.pread(fd, 1 << 24, 0))["listeners"]["metrics"]:
        os.close(listener)
"""


def install(program: Path, version: str, extra: str = "") -> None:
    """Put a cuzkd of ``version`` where the supervisor was started from (atomically, as pip
    does)."""
    staged = program.with_suffix(".new")
    staged.write_text(_SCRIPT.format(python=sys.executable, version=version, extra=extra))
    staged.chmod(0o755)
    staged.replace(program)


def install_broken(program: Path) -> None:
    staged = program.with_suffix(".new")
    staged.write_text("#!/bin/sh\necho 'cuzkd: cannot even start' >&2\nexit 3\n")
    staged.chmod(0o755)
    staged.replace(program)


@pytest.fixture(scope="module")
def door(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Door]:
    tmp = tmp_path_factory.mktemp("upgrade")
    program = tmp / "cuzkd"
    install(program, "1.0.0")
    table, address = cuzk_engine(tmp, "cz", env=KNOBS, door="", stop_timeout="1s",
                                 drain_timeout="15s")
    sup = start_supervisor(write_config(tmp, [table]), program=[str(program)])
    try:
        yield Door(tmp, sup, address)
    finally:
        sup.stop()


def upgrade(door: Door, *args: str) -> subprocess.CompletedProcess[str]:
    """``cuzkd upgrade ARGS`` run as an operator runs it (the installed program)."""
    return subprocess.run([str(door.tmp / "cuzkd"), "upgrade", *args, "--config",
                           str(door.sup.config)], capture_output=True, text=True, timeout=120)


def counters(door: Door) -> dict[str, float]:
    """Every ``_total`` series of a scrape now (engine CPU time aside: the engine's own)."""
    import urllib.request

    with urllib.request.urlopen(f"http://{door.sup.about()['metrics_listen']}/metrics",
                                timeout=10) as resp:
        text = resp.read().decode()
    return {series: float(value) for series, _, value in
            (line.rpartition(" ") for line in text.splitlines() if not line.startswith("#"))
            if re.match(r"[a-z_]+_total(\{|$)", series)}


def door_pid(door: Door) -> int:
    status, body = door.sup.request("GET", "/v1/doors")
    assert status == 200, body
    return int(body["process"]["pid"])


def test_check_asks_the_new_program_and_changes_nothing(door: Door) -> None:
    pid = door.running()
    install(door.tmp / "cuzkd", "1.1.0")
    done = upgrade(door, "--check")
    assert done.returncode == 0, done.stderr
    assert "cuzkd 1.0.0 -> 1.1.0" in done.stdout
    assert door.sup.about()["pid"] == door.sup.proc.pid
    assert door.running() == pid
    assert not door.sup.events("supervisor_upgrading")


def test_an_upgrade_under_load_keeps_every_call_engine_and_count(door: Door) -> None:
    """Curio-like callers keep PoRep and WinningPoSt calls in flight through the upgrade: none
    fails, the engine and the door process keep their pids, the supervisor its own, every
    ``_total`` series goes on from where it was, and the build info names the new version."""
    engine, door_process = door.running(), door_pid(door)
    restarts = door.sup.engine("cz")["restarts"]
    install(door.tmp / "cuzkd", "1.1.0")
    load = LoadThread(door.address, ["porep-c2", "winning-post"], lambda load: load.steady(4))
    try:
        wait_until(lambda: sum(s.outcome == "completed" for s in load.sent) >= 4, 30,
                   "calls completed before the upgrade")
        before = counters(door)
        done = upgrade(door)
        assert done.returncode == 0, (done.stdout, done.stderr)
        assert "upgraded: cuzkd 1.0.0 -> 1.1.0" in done.stdout
        after_upgrade = len(load.sent)
        wait_until(lambda: sum(s.outcome == "completed" for s in load.sent[after_upgrade:])
                   >= 4, 30, "calls completed after it")
    finally:
        sent = load.stop()
    outcomes = Counter(s.outcome for s in sent if s.outcome)
    assert set(outcomes) == {"completed"}, outcomes
    assert door.sup.proc.poll() is None and door.sup.about()["pid"] == door.sup.proc.pid
    assert door.running() == engine and door_pid(door) == door_process
    assert door.sup.engine("cz")["restarts"] == restarts
    after = counters(door)
    went_down = {k: (v, after.get(k)) for k, v in before.items()
                 if after.get(k, 0.0) < v}
    assert not went_down
    assert door.metric("cuzkd_build_info", version="1.1.0") == 1
    [upgraded] = door.sup.events("supervisor_upgraded")
    assert (upgraded["old"], upgraded["new"]) == ("1.0.0", "1.1.0")
    assert 0 < upgraded["gap_seconds"] < 10
    assert not door.sup.events("engine_exited")
    assert not door.sup.events("door_process_exited")


def test_a_program_that_cannot_start_is_refused_and_nothing_changes(door: Door) -> None:
    engine = door.running()
    installed = (door.tmp / "cuzkd").read_text()
    install_broken(door.tmp / "cuzkd")
    try:
        done = subprocess.run([sys.executable, "-m", "cuzkd", "upgrade", "--config",
                               str(door.sup.config)], capture_output=True, text=True,
                              timeout=120)
    finally:
        (door.tmp / "cuzkd").write_text(installed)
    assert done.returncode == 1
    assert "refused by the new program" in done.stderr and "exit_3" in done.stderr
    assert door.running() == engine
    assert door.sup.about()["state"] == "running"
    status, body = door.sup.request("POST", "/v1/reload", timeout=60)
    assert status == 200, body


def test_a_program_of_another_format_is_refused_with_its_reason(door: Door) -> None:
    engine = door.running()
    upgraded = len(door.sup.events("supervisor_upgraded"))
    install(door.tmp / "cuzkd", "0.9.0", OTHER_FORMAT)
    done = upgrade(door)
    assert done.returncode == 1
    assert "hand-over format" in done.stderr and "reads format 99 only" in done.stderr
    assert door.running() == engine
    assert len(door.sup.events("supervisor_upgraded")) == upgraded
    install(door.tmp / "cuzkd", "1.1.0")


def test_a_program_whose_door_channel_differs_is_refused(door: Door) -> None:
    """The door process runs on through an upgrade, speaking the old code's channel: a new
    cuzkd that speaks another could never reach it."""
    install(door.tmp / "cuzkd", "1.5.0", OTHER_CHANNEL)
    done = upgrade(door)
    assert done.returncode == 1
    assert "door process speaks channel version 1, this cuzkd 99" in done.stderr
    install(door.tmp / "cuzkd", "1.1.0")


def test_a_stopping_engine_refuses_the_upgrade(door: Door) -> None:
    """While a stop sequence runs (its drain, its timers) nothing is handed over."""
    pid = door.running()
    load = LoadThread(door.address, ["porep-c2"], lambda load: load.steady(2))
    try:
        wait_until(lambda: door.said("proof job started", next(
            (s.job_id for s in load.sent), "")), 30, "a job on the engine")
        stopping = subprocess.Popen([sys.executable, "-m", "cuzkd", "restart", "cz",
                                     "--config", str(door.sup.config)],
                                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_until(lambda: door.sup.engine("cz")["state"] == "stopping", 30, "the stop")
        status, body = door.sup.request("POST", "/v1/upgrade", timeout=60)
        assert status == 409, body
        assert "engine cz is stopping" in body["error"]
        assert stopping.wait(60) == 0
    finally:
        load.stop()
    assert door.running() != pid


def test_a_program_that_fails_after_the_exec_stops_the_engines_and_exits_1(door: Door) -> None:
    """The last test: the supervisor ends. The new code finds its metrics listener gone: it
    stops the engine as a shutdown does (drained, SIGTERM) and exits 1, a known state."""
    engine = door.running()
    install(door.tmp / "cuzkd", "1.2.0", LOSES_LISTENER)
    done = upgrade(door)
    assert done.returncode == 1
    assert door.sup.proc.wait(60) == 1
    failed = door.sup.events("supervisor_upgrade_failed", outcome="failed")
    assert failed and "metrics" in failed[-1]["error"], failed
    exited = door.sup.events("engine_exited", pid=engine)
    assert [e["cause"] for e in exited] == ["stopped"]
    wait_until(lambda: not os.path.exists(f"/proc/{engine}"), 30, "the engine gone")


def test_a_sigterm_in_the_gap_is_one_stop_handled_by_the_new_code(tmp_path: Path) -> None:
    """Signals are blocked from before the hand-over to the new code's first handlers: a
    SIGTERM sent once the old code logged ``supervisor_upgrading`` is not fatal in the gap; the
    new code takes over, then stops the engine as a shutdown does and exits 0."""
    program = tmp_path / "cuzkd"
    install(program, "1.0.0")
    sup = start_supervisor(write_config(tmp_path, [scripted_engine(tmp_path, "e")]),
                           program=[str(program)])
    try:
        engine = sup.wait_engine("e", lambda e: e["state"] == "running")["pid"]
        install(program, "1.1.0")
        status, body = sup.request("POST", "/v1/upgrade", timeout=60)
        assert status == 202, body
        wait_until(lambda: sup.events("supervisor_upgrading"), 30, "the exec under way")
        sup.proc.send_signal(signal.SIGTERM)
        assert sup.proc.wait(60) == 0
        assert [e["new"] for e in sup.events("supervisor_upgraded")] == ["1.1.0"]
        assert [e["signal"] for e in sup.events("signal_received")] == ["SIGTERM"]
        assert [e["cause"] for e in sup.events("engine_exited", pid=engine)] == ["stopped"]
    finally:
        sup.close()


def test_an_engine_in_backoff_restarts_when_its_delay_ends_counting_on(tmp_path: Path) -> None:
    """An engine crash-looping in its backoff is handed over with what is left of its delay,
    its failures and restarts: the new code spawns it when the old code would have (the gap
    added, as after any freeze of the supervisor), and the next delay grows from there (no
    reset, no extra spawn at the exec)."""
    program, starts = tmp_path / "cuzkd", tmp_path / "starts"
    install(program, "1.0.0")
    crashing = scripted_engine(tmp_path, "c", args=["--fail-starts", "100", "--pidfile",
                                                     str(starts)],
                               backoff_initial="3s", backoff_max="60s")
    sup = start_supervisor(write_config(tmp_path, [crashing]), program=[str(program)])
    try:
        before = sup.wait_engine("c", lambda e: e["state"] == "backoff", timeout=30)
        spawned = len(starts.read_text().split())
        install(program, "1.1.0")
        status, body = sup.request("POST", "/v1/upgrade", timeout=60)
        assert status == 202, body
        [upgraded] = wait_until(lambda: sup.events("supervisor_upgraded"), 30, "the new code")
        entry = sup.engine("c")
        assert (entry["state"], entry["restarts"]) == ("backoff", before["restarts"])
        # what was left of the delay, on the run clock: the gap, a freeze, is not counted
        assert before["next_restart_at"] - 0.1 <= entry["next_restart_at"] \
            <= before["next_restart_at"] + upgraded["gap_seconds"] + 0.5
        wait_until(lambda: len(starts.read_text().split()) > spawned, 30, "the next spawn")
        respawned = time.time()
        assert respawned >= before["next_restart_at"] - 0.5
        after = sup.wait_engine("c", lambda e: e["state"] == "backoff"
                                and e["restarts"] > before["restarts"], timeout=30)
        # the failures counted on: the next delay is the doubled one, not the first
        assert after["next_restart_at"] - respawned > 3.0
    finally:
        sup.stop()


def test_the_new_code_runs_the_config_that_ran_and_holds_its_locks(tmp_path: Path) -> None:
    """A file changed since it was read is not what the new code runs: a reload applies it
    afterwards. The state dir's lock never lapsed: a second ``cuzkd run`` is refused, naming
    the same pid."""
    program = tmp_path / "cuzkd"
    install(program, "1.0.0")
    config = write_config(tmp_path, [scripted_engine(tmp_path, "a")])
    sup = start_supervisor(config, program=[str(program)])
    try:
        sup.wait_engine("a", lambda e: e["state"] == "running")
        write_config(tmp_path, [scripted_engine(tmp_path, "a"), scripted_engine(tmp_path, "b")])
        install(program, "1.1.0")
        done = subprocess.run([str(program), "upgrade", "--config", str(config)],
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        assert set(sup.engines()) == {"a"}
        second = subprocess.run([str(program), "run", "--config", str(config)],
                                capture_output=True, text=True, timeout=60)
        assert second.returncode == 1
        assert f"another cuzkd (pid {sup.proc.pid})" in second.stdout + second.stderr
        status, body = sup.request("POST", "/v1/reload", timeout=60)
        assert status == 200 and body["engines"] == ["a", "b"], body
    finally:
        sup.stop()
