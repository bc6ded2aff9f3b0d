"""The child table: spawn-then-register, exit routing, zombies, and one-shot (smoke) runs.

The routing is tested in-process with a stand-in spawner and exits fed through ``dispatch``
as the reaper would; one-shot runs use real processes and the real reaper (signals, process
groups and pipes are what they are about).
"""

from __future__ import annotations

import asyncio
import io
import os
import signal
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

import pytest
from support.started import started
from support.waiting import wait_until

from cuzkd.supervisor.proc.children import ChildProcess, ChildTable
from cuzkd.supervisor.proc.spawn import EngineProcess


class StandIn:
    """A spawned child that is only a pid: nothing runs."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.stdout = io.BytesIO()
        self.stderr = io.BytesIO()
        self.wait_status: int | None = None
        self.signals: list[int] = []

    def reaped(self, wait_status: int) -> None:
        self.wait_status = wait_status

    def signal_group(self, signum: int) -> bool:
        self.signals.append(signum)
        return self.wait_status is None


def stand_in_spawner(pids: Iterator[int]) -> tuple[list[StandIn], object]:
    spawned: list[StandIn] = []

    def spawn(argv: Sequence[str], env: Mapping[str, str],
              pass_fds: Sequence[int] = ()) -> ChildProcess:
        if argv[0] == "missing":
            raise FileNotFoundError(2, "No such file or directory", argv[0])
        spawned.append(StandIn(next(pids)))
        return spawned[-1]

    return spawned, spawn


def test_spawned_pid_is_registered_before_spawn_returns_and_its_exit_goes_to_its_owner() -> None:
    spawned, spawner = stand_in_spawner(iter([101, 102]))
    table = ChildTable(spawner)  # type: ignore[arg-type]
    exits: list[tuple[str, int]] = []
    a = table.spawn(["a"], {}, lambda status: exits.append(("a", status)))
    assert set(table.pids()) == {101}  # no await between the fork and the registration
    table.spawn(["b"], {}, lambda status: exits.append(("b", status)))
    assert table.dispatch(101, 0x0100) is True
    assert exits == [("a", 0x0100)] and a is spawned[0] and spawned[0].wait_status == 0x0100
    assert set(table.pids()) == {102} and table.zombies_reaped == 0
    # A pid nobody spawned here (an adopted orphan) is a zombie reaped, counted, not routed;
    # so is a second exit of a pid already handed over (the pid was reused by an orphan).
    assert table.dispatch(999, 0) is False and table.dispatch(101, 0) is False
    assert exits == [("a", 0x0100)] and table.zombies_reaped == 2


def test_spawn_failure_registers_nothing() -> None:
    _, spawner = stand_in_spawner(iter([7]))
    table = ChildTable(spawner)  # type: ignore[arg-type]
    with pytest.raises(FileNotFoundError):
        table.spawn(["missing"], {}, lambda status: None)
    assert not table.pids()


async def test_oneshot_spawn_failure_is_a_cause_not_an_exception() -> None:
    _, spawner = stand_in_spawner(iter([7]))
    table = ChildTable(spawner)  # type: ignore[arg-type]
    assert (await table.run_oneshot(["missing"], 1)).startswith("spawn_failed")
    assert not table.pids()


async def test_oneshot_exit_causes_and_timeout() -> None:
    table = ChildTable()
    table.install(asyncio.get_running_loop())
    try:
        assert await table.run_oneshot(["sh", "-c", "echo hi; exit 3"], 10) == "exit_3"
        assert await table.run_oneshot(["sleep", "30"], 0.2) == "timeout"
        assert (await table.run_oneshot(["/nonexistent/binary"], 10)).startswith("spawn_failed")
        # A NUL byte (the smoke args come from the API's JSON) is a spawn failure, not a
        # ValueError escaping into the swap.
        assert (await table.run_oneshot(["true", "a\0b"], 10)).startswith("spawn_failed")
    finally:
        table.uninstall()
    assert not table.pids()


async def test_cancelled_oneshot_kills_its_group_and_stops_reading(tmp_path: Path) -> None:
    # A helper that escaped the process group keeps the output pipes open: a cancelled smoke
    # run must not leave its readers waiting on them.
    pidfile = tmp_path / "escaped.pid"
    script = f'setsid sh -c "echo \\$\\$ > {pidfile}; exec sleep 30" & exec sleep 30'
    spawned: list[EngineProcess] = []

    def spawner(argv: Sequence[str], env: Mapping[str, str],
                pass_fds: Sequence[int] = ()) -> ChildProcess:
        spawned.append(EngineProcess(argv, env, pass_fds))
        return spawned[-1]

    table = ChildTable(spawner)
    table.install(asyncio.get_running_loop())
    before = asyncio.all_tasks()
    try:
        run = await started(table.run_oneshot(["sh", "-c", script], 60))  # it has spawned
        [proc] = spawned
        await asyncio.to_thread(wait_until, lambda: pidfile.exists() and pidfile.read_text(),
                                10, "the escaped helper's pid")
        run.cancel()
        await asyncio.gather(run, return_exceptions=True)
        await asyncio.to_thread(wait_until, lambda: proc.pid not in table.pids(), 10,
                                "the killed one-shot to be reaped")
        assert proc._popen.returncode == -signal.SIGKILL
        readers = asyncio.all_tasks() - before - {asyncio.current_task()}
        await asyncio.wait_for(asyncio.gather(*readers, return_exceptions=True), 5)
    finally:
        table.uninstall()
        if pidfile.exists():
            os.kill(int(pidfile.read_text()), signal.SIGKILL)
