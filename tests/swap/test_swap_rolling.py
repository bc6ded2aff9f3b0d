"""The swap's order of steps, against a real release store and a scripted stand-in supervisor.

The stand-in plays the supervisor's part of :class:`SwapTarget` (it is our own protocol, not
an OS facility): an engine it restarts "runs" whatever binary ``current`` resolves to at that
moment, and is healthy when that binary says ``good``. The end-to-end swap with real engine
processes is in test_swap_e2e.py.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path

import pytest

from cuzkd.swap.releases import ReleaseStore
from cuzkd.swap.rolling import SwapCoordinator, SwapInProgress


class ScriptedSupervisor:
    def __init__(self, store: ReleaseStore, engines: list[str]) -> None:
        self.store = store
        self.engines = engines
        self.running: dict[str, str] = {}  # engine -> release id it runs
        self.log: list[tuple[str, str]] = []
        self.smoke_cause = "exit_0"
        self.down_at_once = 0
        self._down = 0
        self.gate: asyncio.Event | None = None
        self.restarting = asyncio.Event()

    def engine_names_using_binary(self) -> list[str]:
        return list(self.engines)

    async def restart_engine(self, name: str) -> None:
        if name not in self.engines:
            raise KeyError(name)
        self._down += 1
        self.down_at_once = max(self.down_at_once, self._down)
        self.restarting.set()
        if self.gate is not None:
            await self.gate.wait()
        active = self.store.active()
        assert active is not None
        self.running[name] = active.id
        self.log.append(("restart", name))

    async def wait_healthy(self, name: str, settle: float) -> str | None:
        self._down -= 1
        binary = Path(self.store.active_binary())
        if b"good" in await asyncio.to_thread(binary.read_bytes):
            return None
        return "exited with exit_1 during settle"

    async def run_oneshot(self, argv: Sequence[str], timeout: float) -> str:
        self.log.append(("smoke", " ".join(argv[1:])))
        return self.smoke_cause


@pytest.fixture
def v1(store: ReleaseStore, make_script):
    release = store.install(make_script("v1-good"))
    store.activate(release)
    return release


async def test_swap_rolls_every_binary_engine_one_at_a_time(store, make_script, v1):
    target = ScriptedSupervisor(store, ["gpu0", "gpu1", "gpu2"])
    coord = SwapCoordinator(store, target, keep_releases=3)
    events: list[dict] = []
    outcome = await coord.swap(make_script("v2-good"), smoke_args=["--version"],
                               settle=0, progress=events.append)
    assert outcome.result == "ok"
    assert outcome.previous == v1.id
    assert store.active().id == outcome.release != v1.id
    assert target.running == dict.fromkeys(["gpu0", "gpu1", "gpu2"], outcome.release)
    assert target.down_at_once == 1
    assert target.log[0] == ("smoke", "--version")
    assert [e["event"] for e in events][:2] == ["installed", "smoke_test"]
    assert coord.counts == {"ok": 1, "rolled_back": 0, "refused": 0}


async def test_unhealthy_engine_rolls_everything_back(store, make_script, v1):
    target = ScriptedSupervisor(store, ["gpu0", "gpu1"])
    coord = SwapCoordinator(store, target, keep_releases=3)
    outcome = await coord.swap(make_script("v2-bad"), settle=0)
    assert outcome.result == "rolled_back"
    assert "gpu0" in outcome.reason
    assert store.active().id == v1.id
    # gpu0 was moved, failed, and was restarted again on v1; gpu1 was never touched.
    assert target.log == [("restart", "gpu0"), ("restart", "gpu0")]
    assert target.running == {"gpu0": v1.id}
    assert coord.counts["rolled_back"] == 1


async def test_failed_smoke_test_refuses_before_activation(store, make_script, v1):
    target = ScriptedSupervisor(store, ["gpu0"])
    target.smoke_cause = "exit_3"
    coord = SwapCoordinator(store, target, keep_releases=3)
    outcome = await coord.swap(make_script("v2-good"), smoke_args=["--version"], settle=0)
    assert outcome.result == "refused"
    assert "exit_3" in outcome.reason
    assert store.active().id == v1.id
    assert ("restart", "gpu0") not in target.log
    assert coord.counts["refused"] == 1


async def test_invalid_source_is_refused_and_nothing_changes(store, tmp_path, v1):
    target = ScriptedSupervisor(store, ["gpu0"])
    coord = SwapCoordinator(store, target, keep_releases=3)
    before = sorted(p.name for p in (store.state_dir / "releases").iterdir())
    outcome = await coord.swap(tmp_path / "missing", settle=0)
    assert outcome.result == "refused"
    assert sorted(p.name for p in (store.state_dir / "releases").iterdir()) == before
    assert target.log == []


async def test_a_second_swap_while_one_runs_is_refused(store, make_script, v1):
    target = ScriptedSupervisor(store, ["gpu0"])
    target.gate = asyncio.Event()
    coord = SwapCoordinator(store, target, keep_releases=3)
    first = asyncio.create_task(coord.swap(make_script("v2-good"), settle=0))
    await target.restarting.wait()
    with pytest.raises(SwapInProgress):
        await coord.swap(make_script("v3-good"), settle=0)
    target.gate.set()
    assert (await first).result == "ok"


async def test_rollback_command_returns_to_the_previous_release(store, make_script, v1):
    target = ScriptedSupervisor(store, ["gpu0"])
    coord = SwapCoordinator(store, target, keep_releases=3)
    await coord.swap(make_script("v2-good"), settle=0)
    outcome = await coord.rollback(settle=0)
    assert outcome.result == "ok"
    assert store.active().id == v1.id
    assert target.running == {"gpu0": v1.id}


async def test_swap_prunes_to_keep_releases(store, make_script, v1):
    target = ScriptedSupervisor(store, [])
    coord = SwapCoordinator(store, target, keep_releases=2)
    for tag in ("v2-good", "v3-good", "v4-good"):
        assert (await coord.swap(make_script(tag), settle=0)).result == "ok"
    ids = {r.id for r in store.releases()}
    assert len(ids) == 2
    assert store.active().id in ids
    assert store.previous().id in ids


async def test_engine_removed_by_a_reload_mid_swap_is_skipped(store, make_script, v1):
    target = ScriptedSupervisor(store, ["gpu0", "gpu1"])
    coord = SwapCoordinator(store, target, keep_releases=3)
    target.engines.remove("gpu0")  # listed when the swap began, gone when its turn comes
    events: list[dict] = []
    target.engine_names_using_binary = lambda: ["gpu0", "gpu1"]  # type: ignore[method-assign]
    outcome = await coord.swap(make_script("v2-good"), settle=0, progress=events.append)
    assert outcome.result == "ok"
    assert {"event": "skipped", "engine": "gpu0", "reason": "engine removed by a reload"} in events
    assert target.running == {"gpu1": outcome.release}


async def test_install_failure_is_a_counted_refusal(store, make_script, v1, monkeypatch):
    # e.g. the source changed while being copied, or the disk is full: the swap must answer
    # with a result (not die mid-stream) and nothing the engines run has changed.
    target = ScriptedSupervisor(store, ["gpu0"])
    coord = SwapCoordinator(store, target, keep_releases=3)

    def no_space(source):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(store, "install", no_space)
    outcome = await coord.swap(make_script("v2-good"), settle=0)
    assert outcome.result == "refused" and "No space left" in outcome.reason
    assert store.active().id == v1.id and target.log == []
    assert coord.counts["refused"] == 1 and not coord.busy


async def test_store_rollback_failure_is_reported_not_raised(store, make_script, v1,
                                                             monkeypatch):
    target = ScriptedSupervisor(store, ["gpu0"])
    coord = SwapCoordinator(store, target, keep_releases=3)
    events: list[dict] = []

    def broken_rollback():
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(store, "rollback", broken_rollback)
    outcome = await coord.swap(make_script("v2-bad"), settle=0, progress=events.append)
    assert outcome.result == "failed" and "cannot roll back" in outcome.reason
    assert events[-1]["event"] == "rollback_impossible"
    assert coord.counts["rolled_back"] == 1 and not coord.busy


async def test_rollback_with_an_unusable_store_is_refused(store, v1):
    (store.state_dir / "current").unlink()
    (store.state_dir / "current").mkdir()  # not a symlink: the store refuses to guess
    coord = SwapCoordinator(store, ScriptedSupervisor(store, []), keep_releases=3)
    outcome = await coord.rollback(settle=0)
    assert outcome.result == "refused" and "not a symlink" in outcome.reason
    assert outcome.release is None
