"""Smoke runs (``Supervisor.run_oneshot``): spawned and reaped like engines, never raising."""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path

from sv_harness import wait_until

from cuzkd.config import Config, SupervisorConfig
from cuzkd.supervisor.daemon import Supervisor


def _supervisor(tmp_path: Path) -> Supervisor:
    return Supervisor(Config(supervisor=SupervisorConfig(state_dir=str(tmp_path / "state"))))


async def test_oneshot_exit_causes_and_timeout(tmp_path: Path) -> None:
    sup = _supervisor(tmp_path)
    sup._reaper.install(asyncio.get_running_loop())
    try:
        assert await sup.run_oneshot(["sh", "-c", "echo hi; exit 3"], 10) == "exit_3"
        assert await sup.run_oneshot(["sleep", "30"], 0.2) == "timeout"
        assert (await sup.run_oneshot([str(tmp_path / "missing")], 10)).startswith(
            "spawn_failed")
        # A NUL byte (the smoke args come from the API's JSON) is a spawn failure, not a
        # ValueError escaping into the swap.
        assert (await sup.run_oneshot(["true", "a\0b"], 10)).startswith("spawn_failed")
    finally:
        sup._reaper.uninstall()
    assert sup._oneshots == {}


async def test_cancelled_oneshot_kills_its_group_and_stops_reading(tmp_path: Path) -> None:
    # A helper that escaped the process group keeps the output pipes open: a cancelled smoke
    # run must not leave its readers waiting on them.
    pidfile = tmp_path / "escaped.pid"
    script = f'setsid sh -c "echo \\$\\$ > {pidfile}; exec sleep 30" & exec sleep 30'
    sup = _supervisor(tmp_path)
    sup._reaper.install(asyncio.get_running_loop())
    before = asyncio.all_tasks()
    try:
        run = asyncio.create_task(sup.run_oneshot(["sh", "-c", script], 60))
        await asyncio.sleep(0)  # run_oneshot spawns before its first await
        [(proc, exited)] = sup._oneshots.values()
        await asyncio.to_thread(wait_until, lambda: pidfile.exists() and pidfile.read_text(),
                                10, "the escaped helper's pid")
        run.cancel()
        await asyncio.gather(run, return_exceptions=True)
        assert (await asyncio.wait_for(exited, 10)) is not None  # killed and reaped
        assert proc._popen.returncode == -signal.SIGKILL
        readers = asyncio.all_tasks() - before - {asyncio.current_task()}
        await asyncio.wait_for(asyncio.gather(*readers, return_exceptions=True), 5)
    finally:
        sup._reaper.uninstall()
        if pidfile.exists():
            os.kill(int(pidfile.read_text()), signal.SIGKILL)
