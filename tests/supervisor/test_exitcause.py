"""Exit causes: the pure precedence rules on real wait statuses, the OOM counters on real
files, and each cause this machine can produce end to end with a real supervisor."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.supervisor_harness import fake_engine, pid_alive, start_supervisor, write_config
from support.waiting import wait_until

from cuzkd.supervisor.core.exitcause import process_cause
from cuzkd.supervisor.proc.oom import OomCounters, memory_cgroup_events
from cuzkd.supervisor.proc.reaper import ended


def wait_status(code: str, *, core: bool = False, cwd: Path | None = None) -> int:
    """The raw waitpid status of a real child running ``code``."""
    def allow_core() -> None:
        import resource

        resource.setrlimit(resource.RLIMIT_CORE, (resource.RLIM_INFINITY,) * 2)

    proc = subprocess.Popen([sys.executable, "-c", code], cwd=cwd,
                            preexec_fn=allow_core if core else None)
    _, status = os.waitpid(proc.pid, 0)
    proc.returncode = 0  # collected above; keep Popen from waiting again
    return status


def test_exit_codes_and_signals() -> None:
    assert process_cause(ended(wait_status("pass")), supervisor_killed=False,
                         oom_kills_moved=False) == ("exit_0", True)
    assert process_cause(ended(wait_status("raise SystemExit(7)")), supervisor_killed=False,
                         oom_kills_moved=True) == ("exit_7", False)
    term = wait_status("import os, signal; os.kill(os.getpid(), signal.SIGTERM)")
    assert process_cause(ended(term), supervisor_killed=False,
                         oom_kills_moved=True) == ("signal_SIGTERM", False)


def test_sigkill_is_oom_only_when_a_counter_moved_and_the_supervisor_did_not_send_it() -> None:
    kill = wait_status("import os, signal; os.kill(os.getpid(), signal.SIGKILL)")
    assert process_cause(ended(kill), supervisor_killed=False, oom_kills_moved=False)[0] == \
        "signal_SIGKILL"
    assert process_cause(ended(kill), supervisor_killed=False,
                         oom_kills_moved=True)[0] == "oom_killed"
    assert process_cause(ended(kill), supervisor_killed=True, oom_kills_moved=True)[0] == \
        "signal_SIGKILL"


def core_dumps_work(tmp_path: Path) -> int | None:
    status = wait_status("import os; os.abort()", core=True, cwd=tmp_path)
    return status if os.WCOREDUMP(status) else None


def test_core_dump_beats_the_signal(tmp_path: Path) -> None:
    status = core_dumps_work(tmp_path)
    if status is None:
        pytest.skip("this machine writes no core dumps (kernel.core_pattern / limits)")
    assert process_cause(ended(status), supervisor_killed=False, oom_kills_moved=False) == \
        ("core_dumped", False)


def test_oom_counters_prefer_the_cgroup_and_fall_back_to_the_machine(tmp_path: Path) -> None:
    proc, root = tmp_path / "proc", tmp_path / "cgroup"
    (proc / "7").mkdir(parents=True)
    (proc / "7" / "cgroup").write_text("0::/eng\n")
    events = root / "eng" / "memory.events"
    events.parent.mkdir(parents=True)
    events.write_text("low 0\nhigh 0\nmax 3\noom 1\noom_kill 1\n")
    vmstat = proc / "vmstat"
    vmstat.write_text("nr_free_pages 5\noom_kill 40\n")
    assert memory_cgroup_events(7, proc_root=proc, cgroup_root=root) == events
    counters = OomCounters(7, proc_root=proc, cgroup_root=root)
    vmstat.write_text("nr_free_pages 5\noom_kill 41\n")  # someone else's OOM kill
    assert not counters.moved()
    events.write_text("oom 2\noom_kill 2\n")
    assert counters.moved()
    events.unlink()  # the cgroup went away with the process: the machine's counter decides
    assert counters.moved()
    vmstat.write_text("oom_kill 40\n")
    assert not counters.moved()


def test_oom_counters_read_cgroup_v1() -> None:
    root = Path("/tmp") / f"cuzkd-v1-{uuid.uuid4().hex}"
    try:
        (root / "proc" / "9").mkdir(parents=True)
        (root / "proc" / "9" / "cgroup").write_text(
            "5:cpu,cpuacct:/x\n4:memory:/svc/eng\n0::/\n")
        oom_control = root / "cg" / "memory" / "svc" / "eng" / "memory.oom_control"
        oom_control.parent.mkdir(parents=True)
        oom_control.write_text("oom_kill_disable 0\nunder_oom 0\noom_kill 0\n")
        counters = OomCounters(9, proc_root=root / "proc", cgroup_root=root / "cg")  # no vmstat
        assert not counters.moved()
        oom_control.write_text("oom_kill_disable 0\nunder_oom 0\noom_kill 1\n")
        assert counters.moved()
    finally:
        subprocess.run(["rm", "-rf", str(root)], check=True)


# -- end to end ----------------------------------------------------------------------------


def test_unexpected_exit_logs_the_stderr_tail_and_status_shows_it(tmp_path: Path) -> None:
    config = write_config(tmp_path, [fake_engine(
        tmp_path, "crasher", restart="never",
        args=["--stderr-lines", "30", "--exit-after", "0.3", "--exit-code", "3"])])
    sup = start_supervisor(config)
    try:
        eng = sup.wait_engine("crasher", lambda e: e["state"] == "failed"
                              and e["last_exit_stderr"][-1:] == ["fake engine exiting"])
        assert eng["last_exit_cause"] == "exit_3"
        expected = [f"stderr line {i}" for i in range(11, 30)] + ["fake engine exiting"]
        assert eng["last_exit_stderr"] == expected
        [event] = sup.events("engine_exit_unexpected", engine="crasher")
        assert event["cause"] == "exit_3" and event["stderr_tail"] == expected
        out = subprocess.run([sys.executable, "-m", "cuzkd", "status", "crasher", "--config",
                              str(config)], capture_output=True, text=True, check=True).stdout
        assert "last exit exit_3   exits exit_3 1   stalls 0" in out, out
        assert "  | stderr line 29" in out, out
        assert "  | stderr line 10" not in out
        missing = subprocess.run([sys.executable, "-m", "cuzkd", "status", "nope", "--config",
                                  str(config)], capture_output=True, text=True)
        assert missing.returncode != 0 and "no engine named 'nope'" in missing.stderr
    finally:
        sup.stop()


def test_supervisor_intent_wins_over_what_the_process_died_of(tmp_path: Path) -> None:
    config = write_config(tmp_path, [fake_engine(tmp_path, "e")])
    sup = start_supervisor(config)
    try:
        sup.wait_engine("e", lambda e: e["state"] == "running")
        assert sup.request("POST", "/v1/engines/e/restart")[0] == 200
        sup.wait_engine("e", lambda e: e["state"] == "running")
        assert sup.request("POST", "/v1/engines/e/stop")[0] == 200
        assert sup.engine("e")["exits"] == {"stopped": 2}
        assert not sup.events("engine_exit_unexpected")
    finally:
        sup.stop()


def test_core_dump_end_to_end(tmp_path: Path) -> None:
    if core_dumps_work(tmp_path) is None:
        pytest.skip("this machine writes no core dumps (kernel.core_pattern / limits)")
    config = write_config(tmp_path, [fake_engine(
        tmp_path, "dumper", restart="never",
        args=["--abort-after", "0.2", "--core-dir", str(tmp_path)])])
    sup = start_supervisor(config)
    try:
        eng = sup.wait_engine("dumper", lambda e: e["state"] == "failed")
        assert eng["exits"] == {"core_dumped": 1}
    finally:
        sup.stop()


@pytest.fixture
def memory_cgroup() -> Iterator[Path]:
    """A 64 MiB memory cgroup next to this process's own (v1 or v2), or a skip."""
    own = memory_cgroup_events(os.getpid())
    if own is None:
        pytest.skip("no memory cgroup is visible to this process")
    path = own.parent / f"cuzkd-oom-{uuid.uuid4().hex[:8]}"
    try:
        try:
            path.mkdir()
            # v2 needs the memory controller enabled for children (cgroup.subtree_control),
            # which a cgroup holding processes cannot do: then there is no memory.max to write
            limit = "memory.max" if own.name == "memory.events" else "memory.limit_in_bytes"
            (path / limit).write_text(str(64 << 20))
            if (path / "memory.memsw.limit_in_bytes").exists():
                (path / "memory.memsw.limit_in_bytes").write_text(str(64 << 20))
        except OSError as exc:
            pytest.skip(f"cannot create a memory-limited cgroup here: {exc}")
        yield path
    finally:
        with contextlib.suppress(OSError):
            path.rmdir()


def test_oom_kill_end_to_end(tmp_path: Path, memory_cgroup: Path) -> None:
    config = write_config(tmp_path, [fake_engine(
        tmp_path, "hog", restart="never", health_interval="100ms",
        args=["--oom-cgroup", str(memory_cgroup), "--oom-after", "0.5"])])
    sup = start_supervisor(config)
    try:
        eng = sup.wait_engine("hog", lambda e: e["state"] == "failed", timeout=30)
        assert eng["exits"] == {"oom_killed": 1}, eng
        [event] = sup.events("engine_exit_unexpected", engine="hog")
        assert event["cause"] == "oom_killed"
    finally:
        sup.stop()


def test_external_sigkill_is_not_an_oom_kill(tmp_path: Path) -> None:
    config = write_config(tmp_path, [fake_engine(tmp_path, "victim", restart="never")])
    sup = start_supervisor(config)
    try:
        pid = sup.wait_engine("victim", lambda e: e["state"] == "running")["pid"]
        os.kill(pid, signal.SIGKILL)
        eng = sup.wait_engine("victim", lambda e: e["state"] == "failed")
        assert eng["exits"] == {"signal_SIGKILL": 1}
    finally:
        sup.stop()


#: Forks into the background as a daemon does (setsid, a second fork, the middle process
#: gone) and exits 0 once the daemon runs: it leaves the engine's group and tree.
DOUBLE_FORK = """
import os, time
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        time.sleep(600)
    os._exit(0)
os.wait()
"""


def test_an_engine_that_daemonizes_is_told_to_run_in_the_foreground(tmp_path: Path) -> None:
    """Exit 0 while descendants run on -- a background job in the engine's group, or a
    double-forked daemon the supervisor adopted -- is ``daemonized``, never a clean
    ``exit_0``: one warning saying why, the same words as the engine's last error, and the
    descendants ended as any engine's leftovers are."""
    engines = [
        {"name": "background", "command": ["sh", "-c", "sleep 600 & exit 0"]},
        {"name": "daemon", "command": [sys.executable, "-c", DOUBLE_FORK]},
    ]
    for engine in engines:
        engine.update(restart="never", stop_timeout="2s")
    sup = start_supervisor(write_config(tmp_path, engines))
    message = ("the engine's process exited 0 while its descendants ran on -- engines must "
               "run in the foreground")
    try:
        for name in ("background", "daemon"):
            eng = sup.wait_engine(name, lambda e: e["state"] == "failed", 20)
            assert eng["exits"] == {"daemonized": 1} and eng["last_exit_cause"] == "daemonized"
            assert eng["last_error"] == message
            [warned] = wait_until(lambda n=name: sup.events("engine_daemonized", engine=n),
                                  10, f"{name}: engine_daemonized")
            assert warned["level"] == "warning" and warned["error"] == message
            [stopped] = wait_until(
                lambda n=name: sup.events("engine_descendants_stopped", engine=n), 10,
                f"{name}: its descendants stopped")
            assert stopped["left"] == [] and not any(map(pid_alive, stopped["pids"]))
    finally:
        assert sup.stop() == 0
