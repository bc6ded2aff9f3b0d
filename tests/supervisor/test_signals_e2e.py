"""Stray signals against a real ``cuzkd run``: none kills it or touches its engines.

A signal without a handler once ended the supervisor outright (no log line; PDEATHSIG then
SIGKILLed every engine), and during start-up SIGINT printed a ``KeyboardInterrupt`` traceback
and SIGHUP killed silently. The table is tested from plain values in test_signals.py;
here real signals go to a real process and each test waits for the log line they cause.
"""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from support.supervisor_harness import (
    RunningSupervisor,
    pid_alive,
    scripted_engine,
    start_supervisor,
    write_config,
)
from support.waiting import wait_until

#: signal -> the name its log line gives (this module runs against builds without the table)
STRAYS = {**{int(s): s.name for s in (signal.SIGUSR2, signal.SIGALRM, signal.SIGVTALRM,
                                      signal.SIGPROF, signal.SIGIO, signal.SIGPWR,
                                      signal.SIGXCPU, signal.SIGXFSZ, signal.SIGSTKFLT,
                                      signal.SIGRTMIN, signal.SIGRTMAX)},
          **{signal.SIGRTMIN + n: f"SIGRTMIN+{n}" for n in (3, 5, 6)}}
#: the flood test's signal, and the one sent after it
FLOOD = (signal.SIGRTMIN + 5, signal.SIGRTMIN + 6)
ENGINES = ("a", "b")


@pytest.fixture(scope="module")
def sup(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningSupervisor]:
    tmp = tmp_path_factory.mktemp("signals")
    running = start_supervisor(write_config(tmp, [scripted_engine(tmp, n) for n in ENGINES],
                                            defaults={"health_interval": "0.1s"}))
    try:
        for name in ENGINES:
            running.wait_engine(name, lambda e: e["state"] == "running")
        yield running
    finally:
        assert running.stop() == 0  # still the supervisor it was: a clean stop


def pids(sup: RunningSupervisor) -> dict[str, int]:
    return {name: eng["pid"] for name, eng in sup.engines().items()}


def ignored(sup: RunningSupervisor, signum: int) -> list[dict[str, object]]:
    return sup.events("signal_ignored", signal=STRAYS[signum])


def test_stray_signals_are_logged_and_change_nothing(sup: RunningSupervisor) -> None:
    before, transitions = pids(sup), len(sup.events("engine_state_changed"))
    for signum in STRAYS:
        if signum not in FLOOD:
            os.kill(sup.proc.pid, signum)
    wait_until(lambda: all(ignored(sup, s) for s in STRAYS if s not in FLOOD), 15,
               "a line for each signal")
    assert sup.proc.poll() is None
    assert pids(sup) == before and all(map(pid_alive, before.values()))
    # no engine was stopped or restarted
    assert len(sup.events("engine_state_changed")) == transitions
    [line] = ignored(sup, signal.SIGRTMIN + 3)
    assert line["level"] == "warning" and line["phase"] == "running"


def test_a_flood_of_one_signal_writes_one_line(sup: RunningSupervisor) -> None:
    flood, last = FLOOD
    for _ in range(20):  # real-time signals queue: each of the 20 is delivered
        os.kill(sup.proc.pid, flood)
    os.kill(sup.proc.pid, last)  # handled after the flood (signals are taken in order)
    wait_until(lambda: ignored(sup, last), 15, "the signal after the flood")
    assert len(ignored(sup, flood)) == 1


def test_sigusr1_writes_each_engines_state_to_the_log(sup: RunningSupervisor) -> None:
    os.kill(sup.proc.pid, signal.SIGUSR1)
    dumped = wait_until(lambda: len(sup.events("engine_state_dumped")) >= len(ENGINES) and
                        {e["engine"]: e for e in sup.events("engine_state_dumped")},
                        15, "a state line per engine")
    assert {name: e["pid"] for name, e in dumped.items()} == pids(sup)
    assert all(e["state"] == "running" for e in dumped.values())
    [about] = sup.events("supervisor_state_dumped")
    assert about["pid"] == sup.proc.pid and about["engines_total"] == len(ENGINES)
    assert sup.proc.poll() is None


def test_sigquit_writes_task_and_thread_stacks_and_kills_nothing(sup: RunningSupervisor) -> None:
    before = pids(sup)
    os.kill(sup.proc.pid, signal.SIGQUIT)
    stacks = wait_until(lambda: sup.events("task_stack_dumped"), 15, "the task stacks")
    assert any("_stop_event" in str(s["stack"]) or "run" in str(s["coro"]) for s in stacks)
    assert "most recent call first" in sup.log_text()  # faulthandler's thread dump
    assert sup.proc.poll() is None and pids(sup) == before


@dataclass
class FifoStart:
    """A ``cuzkd run`` reading its config from a FIFO: held in start-up -- past every import,
    before its event loop -- until :meth:`feed` writes the file."""

    sup: RunningSupervisor
    writer: int  # our end of the FIFO, opened once the supervisor opened its own
    text: str

    def feed(self) -> None:
        os.write(self.writer, self.text.encode())  # far below the pipe's buffer: never blocks
        os.close(self.writer)


def start_on_fifo(tmp_path: Path, env: dict[str, str] | None = None) -> FifoStart:
    text = write_config(tmp_path, [scripted_engine(tmp_path, "a")],
                        defaults={"health_interval": "0.1s"}).read_text()
    fifo = tmp_path / "fifo.toml"
    os.mkfifo(fifo)
    log_path = tmp_path / "fifo.log"
    log_fh = log_path.open("ab")
    proc = subprocess.Popen([sys.executable, "-m", "cuzkd", "run", "--config", str(fifo)],
                            stdin=subprocess.DEVNULL, stdout=log_fh, stderr=subprocess.STDOUT,
                            env={**os.environ, **(env or {})})
    state = tmp_path / "state"
    sup = RunningSupervisor(proc, fifo, state, log_path, state / "control.sock", log_fh)

    def reading() -> int | None:
        assert proc.poll() is None, sup.log_text()
        try:  # ENXIO until the supervisor opens the FIFO to read its config
            return os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
        except OSError as exc:
            if exc.errno != errno.ENXIO:
                raise
            return None

    return FifoStart(sup, wait_until(reading, 30, "the config read"), text)


def test_sigint_during_start_up_is_a_logged_clean_stop(tmp_path: Path) -> None:
    start = start_on_fifo(tmp_path)
    sup = start.sup
    try:
        sup.proc.send_signal(signal.SIGINT)
        start.feed()
        assert sup.proc.wait(30) == 0
        log = sup.log_text()
        assert "Traceback" not in log and "KeyboardInterrupt" not in log
        [line] = sup.events("signal_received", signal="SIGINT")
        assert line["phase"] == "starting" and line["action"] == "stopping engines"
        assert not sup.events("engine_spawned")  # stopped before any engine started
        assert sup.events("supervisor_stopped")
    finally:
        sup.close()


def test_sighup_and_strays_during_start_up_are_ignored_and_it_runs_on(tmp_path: Path) -> None:
    """A burst of different signals too: with faulthandler on, each handler interrupted by the
    next once overflowed its small alternate signal stack (SIGSEGV)."""
    start = start_on_fifo(tmp_path, env={"PYTHONFAULTHANDLER": "1"})
    sup = start.sup
    try:
        sup.proc.send_signal(signal.SIGHUP)
        for signum in STRAYS:
            sup.proc.send_signal(signum)
        start.feed()
        def engine_running() -> bool:
            assert sup.proc.poll() is None, sup.log_text()  # the signals did not end it
            engine = sup.control_socket.exists() and sup.engines().get("a")
            return bool(engine) and engine["state"] == "running"

        wait_until(engine_running, 30, "the engine running")
        assert [e["phase"] for e in sup.events("signal_ignored", signal="SIGHUP")] == ["starting"]
        assert all(ignored(sup, signum) for signum in STRAYS)
        assert not sup.events("supervisor_reloaded") and not sup.events("supervisor_reload_refused")
        assert sup.stop() == 0
    finally:
        sup.close()


def test_as_pid_1_the_handled_signals_still_arrive(tmp_path: Path) -> None:
    """The kernel drops a signal without a handler sent to a namespace's init: handled, USR1
    dumps and a stray is logged (and neither kills, as PID 1's death would end the container)."""
    probe = subprocess.run(["unshare", "--pid", "--fork", "--mount-proc", "true"],
                           capture_output=True, text=True, timeout=10)
    if probe.returncode != 0:
        pytest.skip(f"cannot create a PID namespace here: {probe.stderr.strip()}")
    sup = start_supervisor(write_config(tmp_path, [scripted_engine(tmp_path, "a")]),
                           prefix=["unshare", "--pid", "--fork", "--mount-proc"])
    children = Path(f"/proc/{sup.proc.pid}/task/{sup.proc.pid}/children").read_text().split()
    [pid1] = [int(c) for c in children]  # the supervisor, seen from outside
    try:
        assert sup.about()["pid"] == 1
        os.kill(pid1, signal.SIGUSR1)
        os.kill(pid1, signal.SIGRTMIN + 3)
        wait_until(lambda: sup.events("engine_state_dumped") and
                   sup.events("signal_ignored", signal="SIGRTMIN+3"), 15, "both lines")
        os.kill(pid1, signal.SIGTERM)
        assert sup.proc.wait(20) == 0
    finally:
        if pid_alive(pid1):  # killing unshare would leave its namespace running
            os.kill(pid1, signal.SIGKILL)
        sup.close()
