"""The shipped systemd/cuzkd.service, unmodified, under the distribution's systemd as PID 1.

One machine for the module (see conftest.py); the tests run in file order and each leaves the
unit running for the next, except the last, which stops it. The watchdog tests wait for real
time: the unit's WatchdogSec=30s is part of what is tested, so it is not shortened.
"""

from __future__ import annotations

import json
import os
import re
import stat
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from support.cuzk_caller import Caller
from support.cuzkd_machine import (
    CONFIG_PATH,
    DOOR_SOCKET,
    METRICS,
    cuzk_engine_table,
    engine_values,
    engines_config,
)
from support.systemd import Machine
from support.waiting import wait_until

from cuzkd.cli.control_client import call
from cuzkd.units import parse_duration

UNIT = "cuzkd.service"
DYNAMIC_UIDS = range(61184, 65520)  # systemd's DynamicUser= range

pytestmark = pytest.mark.timeout(240)

STUBBORN_MARK = "cuzkd-live-stubborn"
# One line of Python: ignore SIGTERM, fork a child that starts its own session, sleep.
_STUBBORN = ("import os, signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
             "os.fork() or (os.setsid(), time.sleep(3600)); time.sleep(3600)")
STUBBORN_ENGINE = (f'\n[[engine]]\nname = "stubborn"\n'
                   f'command = ["/opt/cuzkd/bin/python3", "-c", {json.dumps(_STUBBORN)}, '
                   f'"{STUBBORN_MARK}"]\nstop_timeout = "1s"\n')


def _main_pid(machine: Machine) -> int:
    return int(machine.show(UNIT, "MainPID")["MainPID"])


def _metrics(machine: Machine) -> str:
    code, body = machine.http_get(f"{METRICS}/metrics")
    assert code == 200, body
    return body


def _wait_engines_up(machine: Machine, names: set[str], timeout: float = 60) -> dict[str, float]:
    """Until exactly ``names`` are configured and every one of them is up."""
    def up() -> dict[str, float] | None:
        values = engine_values(_metrics(machine), "cuzkd_engine_up")
        return values if set(values) == names and all(values.values()) else None
    return wait_until(up, timeout, f"engines {sorted(names)} up", interval=0.2)  # type: ignore[no-any-return]


def _wait_active(machine: Machine) -> None:
    wait_until(lambda: machine.show(UNIT, "ActiveState")["ActiveState"] == "active", 60,
               "the unit active again", interval=0.2)


def _ensure_active(machine: Machine) -> None:
    if machine.show(UNIT, "ActiveState")["ActiveState"] != "active":
        machine.systemctl("reset-failed", UNIT, check=False)
        machine.systemctl("start", UNIT)
    _wait_engines_up(machine, _configured(machine))


def _configured(machine: Machine) -> set[str]:
    text = (machine.root / CONFIG_PATH.lstrip("/")).read_text()
    return {line.split('"')[1] for line in text.splitlines() if line.startswith("name = ")}


def _unit_processes(machine: Machine) -> set[int]:
    return machine.cgroup_pids(machine.show(UNIT, "ControlGroup")["ControlGroup"])


def test_start_returns_after_ready_with_the_listener_up(machine: Machine) -> None:
    assert machine.show(UNIT, "ActiveState")["ActiveState"] == "inactive"
    machine.systemctl("start", UNIT)
    # No polling: Type=notify makes `start` wait for READY=1, sent after the listener is up.
    props = machine.show(UNIT, "ActiveState", "SubState", "Type", "StatusText")
    assert (props["ActiveState"], props["SubState"], props["Type"]) == (
        "active", "running", "notify")
    assert props["StatusText"], "READY=1 carries a STATUS= line"
    code, body = machine.http_get(f"{METRICS}/healthz")
    assert code == 200, body
    _wait_engines_up(machine, {"alpha", "beta"})


def test_reload_applies_the_new_config_in_the_same_process(machine: Machine) -> None:
    """``systemctl reload`` returns once the new engine set runs (ExecReload is ``cuzkd
    reload``, which waits); a file cuzkd refuses fails the reload and changes nothing."""
    _ensure_active(machine)
    pid = _main_pid(machine)
    before = engine_values(_metrics(machine), "cuzkd_engine_start_time_seconds")
    config = machine.root / CONFIG_PATH.lstrip("/")
    config.write_text(engines_config("alpha", "gamma"))
    machine.systemctl("reload", UNIT)
    assert _main_pid(machine) == pid
    assert machine.show(UNIT, "ActiveState")["ActiveState"] == "active"
    metrics = _metrics(machine)  # no waiting: the reload is over when systemctl returns
    assert set(engine_values(metrics, "cuzkd_engine_start_time_seconds")) == {"alpha", "gamma"}
    _wait_engines_up(machine, {"alpha", "gamma"})
    after = engine_values(_metrics(machine), "cuzkd_engine_start_time_seconds")
    assert after["alpha"] == before["alpha"], "an unchanged engine keeps running"

    good = config.read_text()
    config.write_text(good + '[[engine]]\nname = "alpha"\n')  # a duplicate name
    refused = machine.systemctl("reload", UNIT, check=False)
    assert refused.returncode != 0
    props = machine.show(UNIT, "ActiveState", "MainPID")
    assert (props["ActiveState"], int(props["MainPID"])) == ("active", pid)
    assert "cuzkd_config_last_reload_successful 0" in _metrics(machine)
    assert engine_values(_metrics(machine), "cuzkd_engine_start_time_seconds") == after
    config.write_text(good)
    machine.systemctl("reload", UNIT)
    assert "cuzkd_config_last_reload_successful 1" in _metrics(machine)


def test_dynamic_user_owns_the_state_dir_and_the_hardening_holds(machine: Machine) -> None:
    _ensure_active(machine)
    main = machine.host_pid(_main_pid(machine))
    uid = os.stat(f"/proc/{main}").st_uid
    assert uid in DYNAMIC_UIDS, f"main process runs as uid {uid}"
    state = machine.root / "var/lib/private/cuzkd"
    assert os.lstat(machine.root / "var/lib/cuzkd").st_mode & stat.S_IFLNK, \
        "DynamicUser= keeps state under /var/lib/private behind a symlink"
    assert (state.stat().st_uid, stat.S_IMODE(state.stat().st_mode)) == (uid, 0o750)
    sock = os.lstat(state / "control.sock")
    assert stat.S_ISSOCK(sock.st_mode)
    assert (sock.st_uid, stat.S_IMODE(sock.st_mode)) == (uid, 0o600)
    for pid in _unit_processes(machine):  # the supervisor and every engine
        lines = Path(f"/proc/{pid}/status").read_text().splitlines()
        status = dict(line.split(":", 1) for line in lines if ":" in line)
        assert int(status["Uid"].split()[0]) == uid, pid
        assert status["NoNewPrivs"].strip() == "1", pid
        assert int(status["CapBnd"].strip(), 16) == 0, pid
        assert status["Seccomp"].strip() == "2", pid  # SystemCallFilter= is a seccomp filter


def test_journal_has_the_unit_output_as_json(machine: Machine) -> None:
    _ensure_active(machine)
    requires = machine.show("cuzkd-live.target", "Requires")["Requires"].split()
    assert "systemd-journald.socket" in requires

    main = _main_pid(machine)

    def lines() -> list[str] | None:
        # _SYSTEMD_UNIT= is what the unit's processes wrote; `-u` would add systemd's own
        # "Started ..." lines about the unit, which are not cuzkd's to format. _PID= keeps the
        # daemon's (its engines' lines come through it); ExecReload's `cuzkd reload` writes
        # one line of text for the operator, as any command does. _TRANSPORT=stdout leaves out
        # what systemd's executor logs under the same PID before the exec (e.g. "Found
        # pre-existing public StateDirectory= ..., migrating").
        out = machine.run("journalctl", "--no-pager", "-o", "cat", f"_SYSTEMD_UNIT={UNIT}",
                          f"_PID={main}", "_TRANSPORT=stdout").stdout.splitlines()
        return out if any('"supervisor_started"' in line for line in out) else None

    out = wait_until(lines, 30, "cuzkd's start in the journal", interval=0.2)
    events = [json.loads(line) for line in out if line.strip()]
    assert all(isinstance(e, dict) and "event" in e for e in events)
    assert {"supervisor_started"} <= {e["event"] for e in events}


def test_watchdog_pings_keep_the_unit_active_past_watchdog_sec(machine: Machine) -> None:
    _ensure_active(machine)
    props = machine.show(UNIT, "WatchdogUSec", "ActiveEnterTimestampMonotonic", "MainPID",
                         "NRestarts")
    watchdog = parse_duration(props["WatchdogUSec"])  # systemctl shows spans as "30s"
    assert watchdog == parse_duration("30s"), "the shipped WatchdogSec="
    since = int(props["ActiveEnterTimestampMonotonic"]) / 1e6
    # The machine shares the host's CLOCK_MONOTONIC (no time namespace).
    remaining = since + watchdog * 1.2 - time.monotonic()
    if remaining > 0:
        time.sleep(remaining)  # the duration under test, not a synchronisation
    after = machine.show(UNIT, "ActiveState", "MainPID", "NRestarts",
                         "WatchdogTimestampMonotonic")
    assert after["ActiveState"] == "active"
    assert (after["MainPID"], after["NRestarts"]) == (props["MainPID"], props["NRestarts"])
    last_ping = int(after["WatchdogTimestampMonotonic"]) / 1e6
    assert time.monotonic() - last_ping < watchdog, "pings arrive within WatchdogSec"


def test_a_frozen_event_loop_is_ended_by_the_watchdog(machine: Machine) -> None:
    _ensure_active(machine)
    props = machine.show(UNIT, "MainPID", "NRestarts")
    machine.systemctl("kill", "--kill-whom=main", "--signal=SIGSTOP", UNIT)
    try:
        wait_until(lambda: machine.show(UNIT, "Result")["Result"] == "watchdog", 45,
                   "Result=watchdog", interval=0.5)
    finally:
        # The watchdog's SIGABRT waits for the stopped process; let it land instead of
        # waiting for TimeoutAbortSec's SIGKILL.
        machine.systemctl("kill", "--kill-whom=main", "--signal=SIGCONT", UNIT, check=False)
    # Restart=on-failure: a watchdog timeout is a failure, so a new process takes over.
    wait_until(lambda: machine.show(UNIT, "NRestarts")["NRestarts"] != props["NRestarts"], 30,
               "the restart after the watchdog", interval=0.2)
    _wait_active(machine)
    assert machine.show(UNIT, "MainPID")["MainPID"] != props["MainPID"]
    _wait_engines_up(machine, _configured(machine))


def test_sigkill_of_the_whole_unit_is_followed_by_a_clean_restart(machine: Machine) -> None:
    _ensure_active(machine)
    props = machine.show(UNIT, "MainPID", "NRestarts")
    old = _unit_processes(machine)
    assert len(old) >= 3, "the supervisor and its engines"
    machine.systemctl("kill", "--signal=SIGKILL", UNIT)
    wait_until(lambda: machine.show(UNIT, "NRestarts")["NRestarts"]
               == str(int(props["NRestarts"]) + 1), 30, "the restart", interval=0.2)
    _wait_active(machine)
    assert machine.show(UNIT, "MainPID")["MainPID"] != props["MainPID"]
    _wait_engines_up(machine, _configured(machine))
    assert not old & _unit_processes(machine), "nothing of the killed run is left"
    code, _ = machine.http_get(f"{METRICS}/healthz")
    assert code == 200


#: What a call the old cuzkd's door still had when it exited is told (docs/door.md)
RESTART_REFUSAL = "UNAVAILABLE: Prove: cuzkd stopped (a restart or a stop)"


def test_a_restart_proves_winning_posts_on_the_draining_engine_and_fails_no_handshake(
        machine: Machine) -> None:
    """``systemctl restart cuzkd`` (shutdown_grace 5 s, ~1 s proofs) under a PoRep and a
    WinningPoSt caller, both without ``wait_for_ready``: cuzkd.socket stays open, the old door
    serves every connection until the old cuzkd exits, so a WinningPoSt sent while it drains is
    proved by the draining engine at once, a PoRep it cannot finish fails UNAVAILABLE naming
    the restart, and no call fails for want of a connection or a handshake; then the new
    cuzkd's door (the socket held meanwhile) proves on."""
    _ensure_active(machine)
    # the cuzk engine stays for the next test (a door comes with a start, never a reload)
    (machine.root / CONFIG_PATH.lstrip("/")).write_text(
        engines_config(grace="5s", door='proving_allowance = { winning-post = "1s" }')
        + cuzk_engine_table("cz", synth_secs=1.0))
    machine.systemctl("restart", UNIT)
    _wait_engines_up(machine, {"cz"})
    socket_since = machine.show("cuzkd.socket", "ActiveEnterTimestampMonotonic")
    address = f"unix://{machine.root}{DOOR_SOCKET}"  # from the host, as root
    porep, winning = Caller(address), Caller(address, "winning-post", every=0.3)
    porep.start()
    winning.start()
    try:
        wait_until(lambda: porep.completed() >= 2 and winning.completed() >= 2, 30,
                   "proofs through the door", interval=0.1)
        pid = _main_pid(machine)
        asked = time.monotonic()
        machine.systemctl("restart", UNIT)  # returns once the new cuzkd is ready
        ready = time.monotonic()
        assert _main_pid(machine) != pid
        done = porep.completed()
        wait_until(lambda: porep.completed() >= done + 2, 30, "proofs after it", interval=0.1)
    finally:
        porep.finish()
        winning.finish()
    failed = [o for o in porep.outcomes + winning.outcomes if o != "COMPLETED"]
    assert all(o.startswith(RESTART_REFUSAL) for o in failed), failed
    assert not [o for o in winning.outcomes if o != "COMPLETED"], winning.outcomes
    drained = [end - sent for (sent, end), outcome in zip(winning.spans, winning.outcomes,
                                                          strict=True)
               if asked < sent and end < ready]
    assert drained, "no WinningPoSt was proved while the old cuzkd drained"
    assert max(drained) < 1.5, drained
    assert porep.spanned(ready) or winning.spanned(ready), "no call waited through the restart"
    assert machine.show("cuzkd.socket", "ActiveEnterTimestampMonotonic") == socket_since


#: The cuzkd "installed" by ``pip install -U`` for the upgrade test: the payload's console
#: script (cuzkd_machine.py), saying it is another version
UPGRADED = "0.0.0+live-upgrade"
_UPGRADED_SCRIPT = ("#!/opt/cuzkd/bin/python3\nimport sys\n\nimport cuzkd\n\n"
                    f"cuzkd.__version__ = {UPGRADED!r}\n\n"
                    "from cuzkd.cli import main\n\nsys.exit(main())\n")


def _install(machine: Machine, script: str) -> None:
    """Put ``script`` at /usr/local/bin/cuzkd atomically, as pip does (a new file renamed over
    the old: the running supervisor's program is replaced, never rewritten)."""
    program = machine.root / "usr/local/bin/cuzkd"
    staged = program.with_name(".cuzkd.new")
    staged.write_text(script)
    staged.chmod(0o755)
    staged.replace(program)


def _control(machine: Machine, path: str) -> Any:
    """The control API's answer to ``GET path``, asked from the host as root."""
    return call(machine.root / "var/lib/private/cuzkd/control.sock", "GET", path, timeout=30)


def _build_version(machine: Machine) -> str:
    match = re.search(r'^cuzkd_build_info\{version="([^"]*)"\} 1', _metrics(machine), re.M)
    assert match, "cuzkd_build_info"
    return match.group(1)


def _journal_events(machine: Machine, pid: int, *names: str) -> dict[str, tuple[float, Any]]:
    """``event -> (monotonic time journald took the line, the line)`` of cuzkd's JSON lines
    naming one of ``names`` (the last of each)."""
    out = machine.run("journalctl", "--no-pager", "-o", "json", f"_SYSTEMD_UNIT={UNIT}",
                      f"_PID={pid}", "_TRANSPORT=stdout").stdout
    found: dict[str, tuple[float, Any]] = {}
    for entry in map(json.loads, out.splitlines()):
        message = entry.get("MESSAGE")
        if isinstance(message, str) and message.startswith("{"):
            line = json.loads(message)
            if line.get("event") in names:
                found[line["event"]] = (int(entry["__MONOTONIC_TIMESTAMP"]) / 1e6, line)
    return found


class _UnitWatch(threading.Thread):
    """``systemctl show`` of the unit again and again until stopped: what it went through."""

    def __init__(self, machine: Machine) -> None:
        super().__init__(daemon=True)
        self._machine = machine
        self.seen: list[tuple[str, str, str]] = []  # (ActiveState, SubState, MainPID)
        self.halt = threading.Event()

    def run(self) -> None:
        while not self.halt.is_set():
            props = self._machine.show(UNIT, "ActiveState", "SubState", "MainPID")
            state = (props["ActiveState"], props["SubState"], props["MainPID"])
            if not self.seen or self.seen[-1] != state:
                self.seen.append(state)
            self.halt.wait(0.02)

    def finish(self) -> list[tuple[str, str, str]]:
        self.halt.set()
        self.join(30)
        return self.seen


def test_upgrade_re_executes_cuzkd_in_place_and_the_door_proves_through_it(
        machine: Machine) -> None:
    """``cuzkd upgrade`` after a newer cuzkd was installed over /usr/local/bin/cuzkd, under a
    PoRep and a WinningPoSt caller: the supervisor execs the new program in place (RELOADING=1,
    then READY=1 from the new code), so the unit stays up with the same MainPID, the engine and
    the door process keep their pids, every call completes, including the ones in flight at
    the exec, and the build info and the journal name the new version."""
    if _configured(machine) != {"cz"}:  # run alone: the restart test's cuzk engine and door
        (machine.root / CONFIG_PATH.lstrip("/")).write_text(
            engines_config(grace="5s", door='proving_allowance = { winning-post = "1s" }')
            + cuzk_engine_table("cz", synth_secs=1.0))
        machine.systemctl("restart", UNIT)
    _ensure_active(machine)
    props = machine.show(UNIT, "MainPID", "NRestarts", "InvocationID")
    pid = int(props["MainPID"])
    old = _build_version(machine)
    assert old != UPGRADED
    engines = {e["name"]: (e["pid"], e["restarts"]) for e in _control(machine, "/v1/engines")
               ["engines"]}
    door_process = _control(machine, "/v1/doors")["process"]["pid"]
    started = engine_values(_metrics(machine), "cuzkd_engine_start_time_seconds")
    assert set(engines) == {"cz"} and door_process, (engines, door_process)
    original = (machine.root / "usr/local/bin/cuzkd").read_text()

    address = f"unix://{machine.root}{DOOR_SOCKET}"
    porep, winning = Caller(address), Caller(address, "winning-post", every=0.3)
    watch = _UnitWatch(machine)
    porep.start()
    winning.start()
    try:
        wait_until(lambda: porep.completed() >= 1 and winning.completed() >= 1, 30,
                   "proofs through the door", interval=0.1)
        _install(machine, _UPGRADED_SCRIPT)
        watch.start()
        asked = time.monotonic()
        done = machine.run("/usr/local/bin/cuzkd", "upgrade", "--config", CONFIG_PATH,
                           check=False)
        returned = time.monotonic()
        seen = watch.finish()
        assert done.returncode == 0, (done.stdout, done.stderr)
        assert f"upgraded: cuzkd {old} -> {UPGRADED} (same pid" in done.stdout, done.stdout
        finished = porep.completed()
        wait_until(lambda: porep.completed() >= finished + 1, 30, "a proof after it",
                   interval=0.1)
    finally:
        watch.halt.set()
        porep.finish()
        winning.finish()
        _install(machine, original)  # later tests run the cuzkd the payload installed

    print(f"{done.stdout.strip()!r} in {returned - asked:.2f} s; the unit went through {seen}")
    assert {active for active, _sub, _pid in seen} <= {"active", "reloading"}, seen
    assert {main for _active, _sub, main in seen} == {str(pid)}, seen
    after = machine.show(UNIT, "ActiveState", "SubState", "MainPID", "NRestarts",
                         "InvocationID")
    assert (after["ActiveState"], after["SubState"]) == ("active", "running"), after
    assert (int(after["MainPID"]), after["NRestarts"], after["InvocationID"]) == (
        pid, props["NRestarts"], props["InvocationID"])
    assert _build_version(machine) == UPGRADED
    cmdline = Path(f"/proc/{machine.host_pid(pid)}/cmdline").read_bytes().split(b"\0")
    assert b"--handover" in cmdline, cmdline  # the process is the new program's exec
    assert {e["name"]: (e["pid"], e["restarts"]) for e in _control(machine, "/v1/engines")
            ["engines"]} == engines
    assert _control(machine, "/v1/doors")["process"]["pid"] == door_process
    assert engine_values(_metrics(machine), "cuzkd_engine_start_time_seconds") == started

    def logged() -> dict[str, tuple[float, Any]] | None:
        found = _journal_events(machine, pid, "supervisor_upgrading", "supervisor_upgraded")
        return found if len(found) == 2 else None

    events = wait_until(logged, 30, "the upgrade in the journal", interval=0.2)
    exec_at, upgrading = events["supervisor_upgrading"]
    _adopted_at, upgraded = events["supervisor_upgraded"]
    assert (upgrading["old"], upgrading["new"]) == (old, UPGRADED), upgrading
    assert (upgraded["old"], upgraded["new"]) == (old, UPGRADED), upgraded
    assert upgraded["engines"] == 1 and 0 < upgraded["gap_seconds"] < 10, upgraded

    outcomes = porep.outcomes + winning.outcomes
    assert set(outcomes) == {"COMPLETED"}, outcomes
    assert porep.spanned(exec_at) or winning.spanned(exec_at), "no call was in flight at the exec"
    # the journal's clock is the host's CLOCK_MONOTONIC (no time namespace)
    assert asked < exec_at < returned


def test_stop_ends_every_process_of_the_unit_within_the_stop_timeout(machine: Machine) -> None:
    _ensure_active(machine)
    # The cuzk engine of the test before stays (a reload never takes one out of its door).
    # A hostile engine as well: it ignores SIGTERM and leaves a child in a session of its own.
    (machine.root / CONFIG_PATH.lstrip("/")).write_text(
        engines_config("alpha", "gamma") + cuzk_engine_table("cz") + STUBBORN_ENGINE)
    machine.systemctl("reload", UNIT)
    wait_until(lambda: len([c for _p, c in machine.processes() if STUBBORN_MARK in c]) == 2,
               30, "the stubborn engine and its setsid child", interval=0.2)
    control_group = machine.show(UNIT, "ControlGroup")["ControlGroup"]
    assert len(machine.cgroup_pids(control_group)) >= 5
    timeout = parse_duration(machine.show(UNIT, "TimeoutStopUSec")["TimeoutStopUSec"])
    started = time.monotonic()
    machine.systemctl("stop", UNIT)
    elapsed = time.monotonic() - started
    props = machine.show(UNIT, "ActiveState", "Result", "ExecMainStatus")
    assert elapsed < timeout
    assert (props["ActiveState"], props["Result"]) == ("inactive", "success")
    assert props["ExecMainStatus"] == "0", "cuzkd exits 0 after stopping its engines"
    assert not machine.cgroup_pids(control_group)
    assert not [cmd for _pid, cmd in machine.processes()
                if "/usr/local/bin/cuzkd" in cmd or "-m cuzkd" in cmd or STUBBORN_MARK in cmd]
