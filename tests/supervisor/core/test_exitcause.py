"""Exit causes: the pure precedence rules on real wait statuses, the OOM counters on real
files, and each cause this machine can produce end to end with a real supervisor."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families
from support.cuzk_standin import write_cuzk_toml
from support.ports import free_port
from support.supervisor_harness import (
    RunningSupervisor,
    pid_alive,
    scripted_engine,
    start_supervisor,
    write_config,
)
from support.waiting import wait_until

from cuzkd.supervisor.core.exitcause import MESSAGE_CHARS, exit_message, process_cause
from cuzkd.supervisor.proc.oom import OomCounters, memory_cgroup_events
from cuzkd.supervisor.proc.reaper import ended


def wait_status(code: str, *, core: bool = False, cwd: Path | None = None) -> int:
    """The raw waitpid status of a real child running ``code``.

    The child raises its own core limit (no ``preexec_fn``: Python in a forked child of a
    process with gRPC's threads alive can crash before exec).
    """
    prelude = ("import resource; resource.setrlimit(resource.RLIMIT_CORE,"
               " (resource.RLIM_INFINITY,) * 2)\n" if core else "")
    proc = subprocess.Popen([sys.executable, "-c", prelude + code], cwd=cwd)
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


def test_cuzk_exit_statuses_have_names_for_cuzk_engines_only() -> None:
    """101, 1 and 2 are cuzk's panic, error and usage; any other status of cuzk, and every
    status of another engine, stays exit_N."""
    def cause(code: int, *, cuzk: bool) -> tuple[str, bool]:
        return process_cause(ended(wait_status(f"raise SystemExit({code})")),
                             supervisor_killed=False, oom_kills_moved=False, cuzk=cuzk)

    assert [cause(code, cuzk=True) for code in (101, 1, 2, 3, 0)] == [
        ("panic", False), ("error", False), ("usage", False), ("exit_3", False),
        ("exit_0", True)]
    assert [cause(code, cuzk=False)[0] for code in (101, 1, 2)] == [
        "exit_101", "exit_1", "exit_2"]
    term = wait_status("import os, signal; os.kill(os.getpid(), signal.SIGTERM)")
    assert process_cause(ended(term), supervisor_killed=False, oom_kills_moved=False,
                         cuzk=True) == ("signal_SIGTERM", False)


#: What a cuzk that panicked on its main thread writes to stderr (Rust 1.73 on): a worker
#: thread's panic before it (tokio keeps running), then the main thread's, then the hint.
PANIC_TAIL = [
    "thread 'tokio-runtime-worker' panicked at cuzk-core/src/engine.rs:912:9:",
    "index out of bounds: the len is 2 but the index is 2",
    "thread 'main' panicked at cuzk-daemon/src/main.rs:104:14:",
    "failed to configure rayon global thread pool: ThreadPoolBuildError { kind: "
    "GlobalPoolAlreadyInitialized }",
    "note: run with `RUST_BACKTRACE=1` environment variable to display a backtrace",
]
MAIN_PANIC = ("thread 'main' panicked at cuzk-daemon/src/main.rs:104:14: failed to configure "
              "rayon global thread pool: ThreadPoolBuildError { kind: "
              "GlobalPoolAlreadyInitialized }")


def test_a_panic_is_named_by_the_main_threads_panic_line_location_and_message() -> None:
    assert exit_message("panic", PANIC_TAIL) == MAIN_PANIC
    backtrace = ["thread 'main' panicked at src/main.rs:2:5:", "boom", "stack backtrace:",
                 "   0: rust_begin_unwind", "             at /rustc/x/std/src/panicking.rs:1"]
    assert exit_message("panic", backtrace) == "thread 'main' panicked at src/main.rs:2:5: boom"
    # Rust before 1.73 wrote it on one line; newer ones name the thread id
    assert exit_message("panic", ["thread 'main' panicked at 'boom', src/main.rs:2:5",
                                  "note: run with `RUST_BACKTRACE=1`"]) == \
        "thread 'main' panicked at 'boom', src/main.rs:2:5"
    assert exit_message("panic", ["thread 'main' (4711) panicked at src/main.rs:2:5:",
                                  "boom"]) == \
        "thread 'main' (4711) panicked at src/main.rs:2:5: boom"
    # no main thread's panic in the tail: the last one of any thread
    assert exit_message("panic", PANIC_TAIL[:2]) == (
        "thread 'tokio-runtime-worker' panicked at cuzk-core/src/engine.rs:912:9: "
        "index out of bounds: the len is 2 but the index is 2")
    # a long backtrace pushed the panic out of the tail: nothing made up
    assert exit_message("panic", backtrace[2:]) is None


def test_an_error_is_its_error_line_with_the_causes_anyhow_lists() -> None:
    config = ['Error: failed to load config from "/etc/cuzk/cuzk.toml"', "", "Caused by:",
              "    TOML parse error at line 3, column 16", "      |",
              "    3 | total_budget = 256G", "      |                ^", "    invalid number"]
    assert exit_message("error", config) == (
        'Error: failed to load config from "/etc/cuzk/cuzk.toml": '
        "TOML parse error at line 3, column 16")
    bind = ["Error: gRPC server error", "", "Caused by:", "    0: transport error",
            "    1: Address already in use (os error 98)", "something else, later"]
    assert exit_message("error", bind) == (
        "Error: gRPC server error: transport error: Address already in use (os error 98)")
    assert exit_message("error", ["Error: bad address 'x'"]) == "Error: bad address 'x'"
    assert exit_message("error", ["nothing that says"]) is None


def test_a_usage_error_is_claps_error_line() -> None:
    clap = ["error: unexpected argument '--version' found", "",
            "  tip: to pass '--version' as a value, use '-- --version'", "",
            "Usage: cuzk-daemon [OPTIONS]", "", "For more information, try '--help'."]
    assert exit_message("usage", clap) == "error: unexpected argument '--version' found"


def test_only_cuzk_causes_are_decoded_and_a_message_is_bounded() -> None:
    """Another engine's exit 1 says nothing cuzkd could read (exit_1 is not error); an
    endless message is cut to MESSAGE_CHARS."""
    assert exit_message("exit_1", ["Error: something"]) is None
    assert exit_message("exit_101", PANIC_TAIL) is None
    assert exit_message(None, PANIC_TAIL) is None
    long = exit_message("error", ["Error: " + "x" * 5000])
    assert long is not None and len(long) == MESSAGE_CHARS


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


def logged(sup: RunningSupervisor, event: str, engine: str) -> list[dict[str, Any]]:
    """``engine``'s ``event`` lines, once the log has them (its writer may lag the API)."""
    found: list[dict[str, Any]] = wait_until(lambda: sup.events(event, engine=engine), 15,
                                             f"{event} of {engine} in the log")
    return found


def test_unexpected_exit_logs_the_stderr_tail_and_status_shows_it(tmp_path: Path) -> None:
    config = write_config(tmp_path, [scripted_engine(
        tmp_path, "crasher", restart="never",
        args=["--stderr-lines", "30", "--exit-after", "0.3", "--exit-code", "3"])])
    sup = start_supervisor(config)
    try:
        eng = sup.wait_engine("crasher", lambda e: e["state"] == "failed"
                              and e["last_exit_stderr"][-1:] == ["fake engine exiting"])
        assert eng["last_exit_cause"] == "exit_3"
        expected = [f"stderr line {i}" for i in range(11, 30)] + ["fake engine exiting"]
        assert eng["last_exit_stderr"] == expected
        [event] = logged(sup, "engine_exit_unexpected", "crasher")
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


STANDIN = Path(__file__).parents[2] / "support" / "cuzk_standin.py"
#: engine name -> (what the stand-in is made to do, the cause, the last_error it leaves)
CUZK_EXITS = {
    "panicky": ("101", "panic", "thread 'main' panicked at cuzk-daemon/src/main.rs:212:14: "
                "called `Result::unwrap()` on an `Err` value: stand-in forced panic"),
    "erring": ("1", "error", "Error: stand-in: forced error (CUZK_STANDIN_EXIT=1)"),
    "misused": ("2", "usage", "error: unexpected argument '--stand-in-forced' found"),
}


def standin_engine(tmp_path: Path, name: str, exit_code: str, **keys: Any) -> dict[str, Any]:
    """An ``[[engine]]`` running the cuzk stand-in with its own cuzk TOML, made to exit
    ``exit_code`` before its listeners are up."""
    own = write_cuzk_toml(tmp_path / f"{name}.toml", f"unix://{tmp_path}/{name}.sock",
                          f"127.0.0.1:{free_port()}", '[memory]\ntotal_budget = "8GiB"\n')
    return {"name": name, "command": [sys.executable, str(STANDIN), "-c", str(own)],
            "env": {"CUZK_STANDIN_EXIT": exit_code}, "restart": "never", **keys}


def test_cuzk_exits_are_panic_error_and_usage_with_what_it_said(tmp_path: Path) -> None:
    """Through ``cuzkd run``: each cause and its words in the API, the exit event, ``cuzkd
    status``, ``status NAME``, ``/status`` and /metrics; the same panic from an engine that is
    not of type cuzk is exit_101 with no words read into it."""
    engines = [standin_engine(tmp_path, name, code, type="cuzk")
               for name, (code, _, _) in CUZK_EXITS.items()]
    engines.append(standin_engine(tmp_path, "plain", "101"))
    config = write_config(tmp_path, engines)
    sup = start_supervisor(config)
    try:
        for name, (_, cause, error) in CUZK_EXITS.items():
            eng = sup.wait_engine(name, lambda e: e["state"] == "failed" and e["last_error"],
                                  timeout=30)
            assert (eng["exits"], eng["last_error"]) == ({cause: 1}, error)
            [event] = logged(sup, "engine_exit_unexpected", name)
            assert (event["cause"], event["error"]) == (cause, error)
            [exited] = logged(sup, "engine_exited", name)
            assert exited["cause"] == cause
        plain = sup.wait_engine("plain", lambda e: e["state"] == "failed", timeout=30)
        assert (plain["exits"], plain["last_error"]) == ({"exit_101": 1}, None)
        assert "error" not in logged(sup, "engine_exit_unexpected", "plain")[0]

        def cli(*args: str) -> str:
            return subprocess.run([sys.executable, "-m", "cuzkd", "status", *args, "--config",
                                   str(config)], capture_output=True, text=True).stdout

        listing = cli()
        for _, cause, error in CUZK_EXITS.values():
            assert f"{cause} error: {error}" in listing, listing
        one = cli("panicky")
        assert "last exit panic   exits panic 1" in one and \
            f"last error: {CUZK_EXITS['panicky'][2]}" in one, one
        listen = sup.about()["metrics_listen"]
        with urllib.request.urlopen(f"http://{listen}/status", timeout=30) as resp:
            shown = {e["name"]: e for e in json.load(resp)["engines"]}
        assert shown["erring"]["last_exit_cause"] == "error"
        assert shown["erring"]["last_error"] == CUZK_EXITS["erring"][2]
        with urllib.request.urlopen(f"http://{listen}/metrics", timeout=30) as resp:
            exits = {(s.labels["engine"], s.labels["cause"]): s.value
                     for f in text_string_to_metric_families(resp.read().decode())
                     for s in f.samples if s.name == "cuzkd_engine_exits_total"}
        assert exits == {("panicky", "panic"): 1, ("erring", "error"): 1,
                         ("misused", "usage"): 1, ("plain", "exit_101"): 1}
    finally:
        sup.stop()


def test_supervisor_intent_wins_over_what_the_process_died_of(tmp_path: Path) -> None:
    config = write_config(tmp_path, [scripted_engine(tmp_path, "e")])
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
    config = write_config(tmp_path, [scripted_engine(
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
    config = write_config(tmp_path, [scripted_engine(
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
    config = write_config(tmp_path, [scripted_engine(tmp_path, "victim", restart="never")])
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
