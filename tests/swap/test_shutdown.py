"""SIGTERM during a swap: the swap is cancelled, its client told why at once, the store put
back, and the supervisor gone within ``shutdown_grace`` with its state dir free.

Once, an engine whose swap restart was still stopping when SIGTERM came left the swap waiting
for a spawn the shutdown had called off; the supervisor then took 126 s to exit (aiohttp's
60 s twice), the state dir stayed locked all along and the ``cuzkd swap`` client hung. Here the
``{binary}`` engine ignores SIGTERM, so its swap restart lasts its ``stop_timeout``, and the
supervisor's SIGTERM lands inside it.
"""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from support.supervisor_harness import FAKE_ENGINE, start_supervisor, write_config
from support.waiting import wait_until

from cuzkd.supervisor.daemon.statedir import StateDirLock
from cuzkd.swap.releases import ReleaseStore, source_release_id

GRACE = 10.0


def release_script(tmp: Path, version: str) -> Path:
    """A release: the fake engine, ignoring SIGTERM, serving its status on the socket $1."""
    path = tmp / version / "cuzk"
    path.parent.mkdir()
    path.write_text(f"#!/bin/sh\n# {version}\nexec {sys.executable} {FAKE_ENGINE} "
                    "--mode ignore-term --socket \"$1\"\n")
    path.chmod(0o755)
    return path


def test_sigterm_during_a_swap_cancels_it_and_exits_within_the_grace(tmp_path: Path) -> None:
    v1, v2 = release_script(tmp_path, "v1"), release_script(tmp_path, "v2")
    sock = tmp_path / "gpu0.sock"
    config = write_config(
        tmp_path,
        [{"name": "gpu0", "command": ["{binary}", str(sock)], "status_url": f"unix:{sock}",
          "health_interval": "0.1s", "drain_timeout": "2s", "stop_timeout": "2s"}],
        supervisor={"initial_binary": str(v1), "release_settle": "0.2s",
                    "shutdown_grace": f"{GRACE:g}s"})
    sup = start_supervisor(config)
    swap = None
    try:
        wait_until(lambda: sup.events("release_accepted"), 20, "v1 accepted")
        swap = subprocess.Popen([sys.executable, "-m", "cuzkd", "swap", "--config", str(config),
                                 "--settle", "30s", str(v2)],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        wait_until(lambda: sup.events("engine_state_changed", engine="gpu0", new="stopping"), 20,
                   "gpu0's swap restart under way")
        sent = time.monotonic()
        sup.proc.send_signal(signal.SIGTERM)

        out, err = swap.communicate(timeout=GRACE)
        told = time.monotonic() - sent
        assert swap.returncode == 75, (out, err)  # EX_TEMPFAIL: run it again later
        assert "swap cancelled: supervisor shutting down" in err
        assert sup.proc.wait(GRACE) == 0
        took = time.monotonic() - sent
    finally:
        if swap is not None and swap.poll() is None:
            swap.kill()
            swap.wait()
        sup.close()
    assert told < 5 and took < GRACE  # told at once; gone once gpu0's stop_timeout ran out
    lock = StateDirLock(sup.state_dir)
    lock.acquire()  # free: a new `cuzkd run` can start now
    lock.release()
    store = ReleaseStore(sup.state_dir)
    active = store.active()
    assert active is not None and active.id == source_release_id(v1)  # as before the swap
    [record] = [r for r in store.history() if r.release == source_release_id(v2)]
    assert (record.verdict, record.reason) == ("rejected", "cancelled: supervisor shutting down")
    [cancel] = sup.events("swap_cancelled")
    assert cancel["reason"] == "supervisor shutting down"


def test_a_swap_asked_for_while_the_supervisor_stops_is_told_to_come_back(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The route answers 503 once the coordinator is closed; ``cuzkd swap`` exits 75."""
    from aiohttp import web

    from cuzkd.cli import swap_commands as swap_cli
    from cuzkd.swap.control import swap_routes
    from cuzkd.swap.rolling import SwapCoordinator

    async def main() -> int:
        coordinator = SwapCoordinator(ReleaseStore(tmp_path / "state"), target=None,  # type: ignore[arg-type]
                                      keep_releases=2)
        coordinator.close("supervisor shutting down")
        app = web.Application()
        swap_routes(coordinator)(app)
        runner = web.AppRunner(app)
        await runner.setup()
        sock = tmp_path / "control.sock"
        await web.UnixSite(runner, str(sock)).start()
        try:
            return await swap_cli._stream(sock, {"path": str(tmp_path / "new")}, "swap")
        finally:
            await runner.cleanup()

    assert asyncio.run(main()) == 75
    assert "refused: no swap now: supervisor shutting down" in capsys.readouterr().err
