"""The swap's order of steps, against a real release store and a scripted stand-in supervisor.

The stand-in plays the supervisor's part of :class:`SwapTarget` (it is our own protocol, not
an OS facility): an engine it restarts "runs" whatever binary ``current`` resolves to at that
moment, and is healthy when that binary says ``good``. The end-to-end swap with real engine
processes is in test_e2e.py.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path

import pytest

from cuzkd.errors import SwapInProgress
from cuzkd.status.document import Extensions, Histogram
from cuzkd.status.tracker import StatusTracker
from cuzkd.swap.analysis import Criteria
from cuzkd.swap.releases import ReleaseStore, source_release_id
from cuzkd.swap.rolling import CANARY_ENGINE_ENV, CANARY_STATUS_ENV, AnalysisPlan, SwapCoordinator


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
        #: release ids whose engines fail now although the binary says ``good``
        self.broken: set[str] = set()
        #: how often wait_healthy found the engine failing; ``checked`` is set at each answer
        self.failed_checks = 0
        self.checked = asyncio.Event()

    def engine_names_using_binary(self) -> list[str]:
        return list(self.engines)

    async def restart_engine(self, name: str, *, swap: bool = False) -> None:
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
        broken = self.running.get(name) in self.broken
        healthy = b"good" in await asyncio.to_thread(binary.read_bytes) and not broken
        self.checked.set()
        self.checked = asyncio.Event()
        if healthy:
            return None
        self.failed_checks += 1
        return "exited with exit_1 during settle"

    async def run_oneshot(self, argv: Sequence[str], timeout: float) -> str:
        self.log.append(("smoke", " ".join(argv[1:])))
        return self.smoke_cause


@pytest.fixture
def v1(store: ReleaseStore, make_script):
    """An accepted seed release, as ``initial_binary`` leaves it once its engines are healthy."""
    release = store.install(make_script("v1-good"))
    store.put_in_service(release, "initial_binary")
    store.activate(release)
    store.judge(release, "accepted", "seed healthy")
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
    assert coord.counts == {"ok": 1, "rolled_back": 0, "refused": 0, "cancelled": 0}


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


async def test_rollback_after_an_automatic_rollback_never_goes_to_the_crashing_release(
    store, make_script, v1
):
    target = ScriptedSupervisor(store, ["gpu0"])
    coord = SwapCoordinator(store, target, keep_releases=3)
    crashed = await coord.swap(make_script("v2-bad"), settle=0)
    assert crashed.result == "rolled_back" and store.active().id == v1.id
    assert store.previous().id == crashed.previous  # `previous` names the crashing release
    target.log.clear()

    outcome = await coord.rollback(settle=0)

    assert outcome.result == "refused"
    assert "no accepted release before the active one" in outcome.reason
    assert store.active().id == v1.id and target.log == []
    assert coord.rollback_counts == {"ok": 0, "failed": 1, "cancelled": 0}
    assert coord.counts == {"ok": 0, "rolled_back": 1, "refused": 0, "cancelled": 0}


async def test_rollback_goes_to_the_last_accepted_release_and_then_further_back(
    store, make_script, v1
):
    target = ScriptedSupervisor(store, ["gpu0"])
    coord = SwapCoordinator(store, target, keep_releases=5)
    v2 = (await coord.swap(make_script("v2-good"), settle=0)).release
    assert (await coord.swap(make_script("v3-bad"), settle=0)).result == "rolled_back"
    assert store.active().id == v2

    first = await coord.rollback(settle=0)

    assert (first.result, first.release, first.previous) == ("ok", v1.id, v2)
    assert target.running == {"gpu0": v1.id}
    assert store.verdict(store.active()).verdict == "accepted"
    left = {r.release: r for r in store.history()}[v2]
    assert left.verdict == "rejected" and "rolled back" in left.reason
    # v2 was left by an operator, v3 crashed: nothing accepted is older than v1.
    assert (await coord.rollback(settle=0)).result == "refused"
    assert coord.rollback_counts == {"ok": 1, "failed": 1, "cancelled": 0}
    assert coord.counts == {"ok": 1, "rolled_back": 1, "refused": 0, "cancelled": 0}


async def test_a_rollback_that_fails_is_undone_and_its_target_rejected(store, make_script, v1):
    target = ScriptedSupervisor(store, ["gpu0", "gpu1"])
    coord = SwapCoordinator(store, target, keep_releases=3)
    v2 = (await coord.swap(make_script("v2-good"), settle=0)).release
    target.broken.add(v1.id)  # v1 ran well once; its engines fail now
    target.log.clear()
    events: list[dict] = []

    outcome = await coord.rollback(settle=0, progress=events.append)

    assert outcome.result == "failed"
    assert "engine gpu0" in outcome.reason and "the rollback was undone" in outcome.reason
    assert outcome.release == v2 and store.active().id == v2
    # gpu0 moved to v1, failed, and came back on v2; gpu1 was never touched.
    assert target.log == [("restart", "gpu0"), ("restart", "gpu0")]
    assert target.running == {"gpu0": v2, "gpu1": v2}
    assert "rolled_back" in [e["event"] for e in events]
    verdicts = {r.release: r.verdict for r in store.history()}
    assert verdicts == {v1.id: "rejected", v2: "accepted"}
    assert coord.rollback_counts == {"ok": 0, "failed": 1, "cancelled": 0}
    assert coord.counts["rolled_back"] == 0


async def test_each_swap_records_its_verdict_with_time_and_reason(store, make_script, v1):
    target = ScriptedSupervisor(store, ["gpu0"])
    target.smoke_cause = "exit_3"
    coord = SwapCoordinator(store, target, keep_releases=5)
    smoke_source = make_script("v2-good")
    await coord.swap(smoke_source, smoke_args=["--version"], settle=0)
    smoked = source_release_id(smoke_source)
    target.smoke_cause = "exit_0"
    bad = await coord.swap(make_script("v3-bad"), settle=0)
    good = await coord.swap(make_script("v4-good"), settle=0)
    records = {r.release: r for r in store.history()}
    assert records[v1.id].verdict == "accepted"
    assert records[smoked].verdict == "rejected"
    assert "exit_3" in records[smoked].reason
    assert records[bad.previous].verdict == "rejected"
    assert "exited with exit_1" in records[bad.previous].reason
    assert records[good.release].verdict == "accepted"
    assert all(r.decided_at is not None and r.decided_at >= r.activated_at
               for r in records.values())
    assert store.rollback_target().id == v1.id


async def test_a_history_that_cannot_be_written_does_not_break_the_swap(
    store, make_script, v1, monkeypatch
):
    target = ScriptedSupervisor(store, ["gpu0"])
    coord = SwapCoordinator(store, target, keep_releases=3)
    events: list[dict] = []

    def disk_full(release, verdict, reason, analysis=None):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(store, "judge", disk_full)
    outcome = await coord.swap(make_script("v2-good"), settle=0, progress=events.append)
    assert outcome.result == "ok" and not coord.busy
    assert {"event": "history_not_saved", "release": outcome.release,
            "reason": "[Errno 28] No space left on device"} in events


async def test_a_seed_is_accepted_once_its_engines_are_healthy(store, make_script):
    seed = store.install(make_script("v1-good"))
    store.put_in_service(seed, "initial_binary")
    store.activate(seed)
    target = ScriptedSupervisor(store, ["gpu0"])
    target.broken.add(seed.id)
    target.running["gpu0"] = seed.id
    coord = SwapCoordinator(store, target, keep_releases=3)
    accepting = asyncio.create_task(coord.accept_when_healthy(settle=0, retry=0))
    while target.failed_checks < 3:  # a few rounds with the engine failing: still on trial
        await target.checked.wait()
    assert not accepting.done() and store.verdict(seed).verdict == "pending"

    target.broken.clear()
    await asyncio.wait_for(accepting, 5)

    record = store.verdict(seed)
    assert record.verdict == "accepted" and "healthy" in record.reason


async def test_a_seed_is_still_accepted_after_a_swap_from_it_was_rolled_back(store, make_script):
    seed = store.install(make_script("v1-good"))
    store.put_in_service(seed, "initial_binary")
    store.activate(seed)
    target = ScriptedSupervisor(store, ["gpu0"])
    target.broken.add(seed.id)  # not yet healthy when the operator swaps
    target.running["gpu0"] = seed.id
    coord = SwapCoordinator(store, target, keep_releases=3)
    accepting = asyncio.create_task(coord.accept_when_healthy(settle=0, retry=0))

    assert (await coord.swap(make_script("v2-bad"), settle=0)).result == "rolled_back"
    assert not accepting.done() and store.verdict(seed).verdict == "pending"
    target.broken.clear()
    await asyncio.wait_for(accepting, 5)

    assert store.verdict(seed).verdict == "accepted"


async def test_acceptance_leaves_a_judged_release_alone(store, make_script, v1):
    target = ScriptedSupervisor(store, ["gpu0"])
    coord = SwapCoordinator(store, target, keep_releases=3)
    await coord.swap(make_script("v2-bad"), settle=0)  # rejected, rolled back to v1
    store.judge(v1, "rejected", "an operator said so")
    await asyncio.wait_for(coord.accept_when_healthy(settle=0, retry=0), 5)
    assert store.verdict(v1).verdict == "rejected"


class CountingSupervisor(ScriptedSupervisor):
    """The stand-in with status counters: each reading of an engine adds ``speed`` partitions
    done per GPU second on whatever release it runs (``slow`` in the script: half speed), so a
    window's growth is exact and needs no real time."""

    def __init__(self, store: ReleaseStore, engines: list[str], *, work: bool = True) -> None:
        super().__init__(store, engines)
        active = store.active()
        assert active is not None
        self.running = dict.fromkeys(engines, active.id)  # all on the old release to start
        self.work = work
        self.readings: dict[str, tuple[int, float]] = {}
        self.checks: list[tuple[list[str], dict[str, str]]] = []

    async def engine_status(self, name: str) -> tuple[object, object]:
        done, seconds = self.readings.get(name, (0, 0.0))
        binary = next(r.binary for r in self.store.releases() if r.id == self.running[name])
        speed = 15 if b"slow" in await asyncio.to_thread(binary.read_bytes) else 30
        if self.work:
            done, seconds = done + speed, seconds + 1.0
        self.readings[name] = (done, seconds)
        hist = Histogram(bounds=[1.0], bucket_counts=[done], count=done, sum=seconds)
        ext = Extensions(phase_transitions={"snap-update": {"done": done}}, worker_busy=[],
                         synth_duration_seconds={}, gpu_duration_seconds={"snap-update": hist},
                         jobs_in_flight=0)
        return StatusTracker().snapshot(), ext

    def engine_status_address(self, name: str) -> str:
        return f"unix:/run/{name}.sock"

    async def run_oneshot(self, argv: Sequence[str], timeout: float,
                          env: dict[str, str] | None = None) -> str:
        self.checks.append((list(argv), dict(env or {})))
        return "exit_0"


def plan(**fields: object) -> AnalysisPlan:
    return AnalysisPlan(**{"seconds": 0.01, "criteria": Criteria(min_partitions=10), **fields})


async def test_a_slow_canary_is_rolled_back_and_the_rest_never_moved(store, make_script, v1):
    target = CountingSupervisor(store, ["gpu0", "gpu1", "gpu2"])
    coord = SwapCoordinator(store, target, keep_releases=3)
    outcome = await coord.swap(make_script("v2-good-slow"), settle=0, plan=plan(canary=2))
    assert outcome.result == "rolled_back" and store.active().id == v1.id
    assert outcome.analysis["result"] == "fail" and outcome.analysis["baseline"] == "peers"
    assert outcome.analysis["kinds"][0]["ratio"] == 0.5
    # the two canaries moved and came back; gpu2, the baseline, was never restarted
    assert target.log == [("restart", "gpu0"), ("restart", "gpu1"), ("restart", "gpu0"),
                          ("restart", "gpu1")]
    [record] = [r for r in store.history() if r.release == outcome.previous]
    assert record.verdict == "rejected" and record.analysis == outcome.analysis
    assert coord.counts["rolled_back"] == 1


async def test_a_passing_canary_lets_the_rest_move_and_the_check_sees_the_canary(
        store, make_script, v1):
    target = CountingSupervisor(store, ["gpu0", "gpu1"])
    coord = SwapCoordinator(store, target, keep_releases=3)
    outcome = await coord.swap(make_script("v2-good"), settle=0,
                               plan=plan(check=["verify", "--fast"]))
    assert outcome.result == "ok" and outcome.analysis["result"] == "pass"
    assert target.log == [("restart", "gpu0"), ("restart", "gpu1")]
    [(argv, env)] = target.checks
    assert argv == ["verify", "--fast"]
    assert (env[CANARY_ENGINE_ENV], env[CANARY_STATUS_ENV]) == ("gpu0", "unix:/run/gpu0.sock")
    record = store.verdict(store.active())
    assert record.verdict == "accepted" and record.analysis["result"] == "pass"


@pytest.mark.parametrize(("choice", "result"), [("rollback", "rolled_back"), ("proceed", "ok")])
async def test_inconclusive_does_what_on_inconclusive_says(store, make_script, v1, choice,
                                                           result):
    target = CountingSupervisor(store, ["gpu0", "gpu1"], work=False)
    coord = SwapCoordinator(store, target, keep_releases=3)
    outcome = await coord.swap(make_script("v2-good"), settle=0,
                               plan=plan(on_inconclusive=choice))
    assert outcome.result == result and outcome.analysis["result"] == "inconclusive"


async def test_one_engine_is_measured_before_the_swap(store, make_script, v1):
    target = CountingSupervisor(store, ["gpu0"])
    coord = SwapCoordinator(store, target, keep_releases=3)
    events: list[dict] = []
    outcome = await coord.swap(make_script("v2-good-slow"), settle=0, plan=plan(),
                               progress=events.append)
    assert outcome.result == "rolled_back" and outcome.analysis["baseline"] == "self"
    steps = [e["event"] for e in events]
    assert steps.index("analysis_baseline") < steps.index("activated") < steps.index("analysis")


# -- a shutdown cancels the operation under way (SwapCoordinator.close) ---------------------

SHUTDOWN = "supervisor shutting down"


def record_of(store: ReleaseStore, release_id: str):
    return next((r for r in store.history() if r.release == release_id), None)


async def test_close_cancels_a_swap_in_an_engine_restart_and_puts_the_store_back(
        store, make_script, v1):
    target = ScriptedSupervisor(store, ["gpu0", "gpu1"])
    target.gate = asyncio.Event()  # gpu0's restart never ends by itself
    coord = SwapCoordinator(store, target, keep_releases=3)
    events: list[dict] = []
    source = make_script("v2-good")
    swap = asyncio.create_task(coord.swap(source, settle=0, progress=events.append))
    await target.restarting.wait()
    assert store.active().id == source_release_id(source)  # flipped: gpu0 is being moved

    coord.close(SHUTDOWN)
    outcome = await swap

    assert (outcome.result, outcome.reason) == ("cancelled", SHUTDOWN)
    assert store.active().id == v1.id == outcome.release  # the next start runs v1 everywhere
    v2 = record_of(store, source_release_id(source))
    assert (v2.verdict, v2.reason) == ("rejected", f"cancelled: {SHUTDOWN}")
    assert record_of(store, v1.id).verdict == "accepted"
    assert target.log == []  # gpu0's restart was cut short, gpu1 never touched
    assert [e["event"] for e in events][-2:] == ["rolled_back", "rejected"]
    assert coord.counts == {"ok": 0, "rolled_back": 0, "refused": 0, "cancelled": 1}
    assert not coord.busy
    later = await coord.swap(make_script("v3-good"), settle=0)  # closed: nothing is tried
    assert (later.result, later.reason) == ("cancelled", SHUTDOWN)
    assert store.active().id == v1.id and len(store.releases()) == 2
    assert coord.counts["cancelled"] == 1 and not target.log


class EndlessSmoke(ScriptedSupervisor):
    """The smoke run never ends by itself; records that it was cancelled."""

    def __init__(self, store: ReleaseStore, engines: list[str]) -> None:
        super().__init__(store, engines)
        self.smoking = asyncio.Event()
        self.smoke_cancelled = False

    async def run_oneshot(self, argv: Sequence[str], timeout: float) -> str:
        self.smoking.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            self.smoke_cancelled = True  # the child table kills its process group here
            raise
        return "exit_0"


async def test_close_during_the_smoke_run_cancels_it_before_anything_changes(
        store, make_script, v1):
    target = EndlessSmoke(store, ["gpu0"])
    coord = SwapCoordinator(store, target, keep_releases=3)
    history = store.history()
    swap = asyncio.create_task(coord.swap(make_script("v2-good"), smoke_args=["--version"],
                                          settle=0))
    await target.smoking.wait()
    coord.close(SHUTDOWN)
    outcome = await swap
    assert outcome.result == "cancelled" and target.smoke_cancelled
    assert store.active().id == v1.id and store.history() == history  # never on trial
    assert target.log == []


async def test_close_during_a_rollback_returns_to_the_release_it_left(store, make_script, v1):
    target = ScriptedSupervisor(store, ["gpu0"])
    coord = SwapCoordinator(store, target, keep_releases=3)
    v2 = (await coord.swap(make_script("v2-good"), settle=0)).release
    target.gate = asyncio.Event()
    target.restarting.clear()
    rollback = asyncio.create_task(coord.rollback(settle=0))
    await target.restarting.wait()
    assert store.active().id == v1.id  # the rollback flipped to v1, gpu0 is being moved
    coord.close(SHUTDOWN)
    outcome = await rollback
    assert outcome.result == "cancelled"
    assert store.active().id == v2  # as before the rollback: it did not happen
    assert record_of(store, v2).verdict == "accepted"  # not rejected by a cut-short rollback
    assert coord.rollback_counts == {"ok": 0, "failed": 0, "cancelled": 1}


async def test_close_while_a_failed_swap_restores_its_engines_keeps_the_failure(
        store, make_script, v1):
    target = ScriptedSupervisor(store, ["gpu0"])
    coord = SwapCoordinator(store, target, keep_releases=3)

    restoring = asyncio.Event()

    def progress(event: dict) -> None:
        if event["event"] == "rolled_back":  # gpu0 failed on v2: hold its restart on v1
            target.gate = asyncio.Event()
            target.restarting.clear()
            restoring.set()

    source = make_script("v2-bad")
    swap = asyncio.create_task(coord.swap(source, settle=0, progress=progress))
    await restoring.wait()
    await target.restarting.wait()  # set again by gpu0's restart on v1 alone
    coord.close(SHUTDOWN)
    outcome = await swap
    assert outcome.result == "cancelled" and store.active().id == v1.id
    v2 = record_of(store, source_release_id(source))
    assert v2.verdict == "rejected" and "gpu0" in v2.reason  # the real reason stays
    assert coord.counts == {"ok": 0, "rolled_back": 0, "refused": 0, "cancelled": 1}


async def test_close_on_a_fresh_store_leaves_the_first_release_on_trial(store, make_script):
    target = ScriptedSupervisor(store, ["gpu0"])
    target.gate = asyncio.Event()
    coord = SwapCoordinator(store, target, keep_releases=3)
    source = make_script("v1-good")
    swap = asyncio.create_task(coord.swap(source, settle=0))
    await target.restarting.wait()
    coord.close(SHUTDOWN)
    outcome = await swap
    # Nothing to go back to: it stays active, pending, accepted once healthy like a seed.
    assert outcome.result == "cancelled"
    assert store.active().id == source_release_id(source)
    assert record_of(store, source_release_id(source)).verdict == "pending"


async def test_close_during_the_canary_analysis_cuts_its_window_short(
        store, make_script, v1):
    target = CountingSupervisor(store, ["gpu0", "gpu1"])
    coord = SwapCoordinator(store, target, keep_releases=3)
    analysing = asyncio.Event()

    def progress(event: dict) -> None:
        if event["event"] == "analysing":
            analysing.set()

    swap = asyncio.create_task(coord.swap(make_script("v2-good"), settle=0,
                                          plan=plan(seconds=3600), progress=progress))
    await analysing.wait()
    coord.close(SHUTDOWN)
    outcome = await asyncio.wait_for(swap, 5)  # not the hour of the window
    assert outcome.result == "cancelled" and store.active().id == v1.id
    assert target.log == [("restart", "gpu0")]  # the canary; gpu1 never moved


def _release_ids(store: ReleaseStore) -> set[str]:
    return {r.id for r in store.releases()}


async def test_a_refused_swap_removes_the_release_it_installed(store, make_script, v1):
    """Refused by its smoke test or at its activation, the swap's copy leaves ``releases/``
    at once (on a full disk it is the space the next try needs); the verdict stays in the
    history. A release that was installed before the swap (same content) stays."""
    target = ScriptedSupervisor(store, ["gpu0"])
    target.smoke_cause = "exit_3"
    coord = SwapCoordinator(store, target, keep_releases=5)
    events: list[dict] = []
    smoked = make_script("v2-smoked")
    outcome = await coord.swap(smoked, smoke_args=["--version"], settle=0,
                               progress=events.append)
    assert outcome.result == "refused" and _release_ids(store) == {v1.id}
    assert "discarded" in [e["event"] for e in events]
    verdicts = {r.release: r.verdict for r in store.history()}
    assert verdicts[source_release_id(smoked)] == "rejected"

    target.smoke_cause = "exit_0"
    v2, v3 = make_script("v2-good"), make_script("v3-good")
    for source in (v2, v3):
        assert (await coord.swap(source, settle=0)).result == "ok"
    target.smoke_cause = "exit_3"  # v1 again: neither active nor previous, but installed before
    assert (await coord.swap(v1.binary, smoke_args=["--version"], settle=0)).result == "refused"
    assert v1.id in _release_ids(store)

    (store.state_dir / "history.json").unlink()
    (store.state_dir / "history.json").mkdir()  # the history cannot be read: no activation
    v4 = make_script("v4-good")
    refused = await coord.swap(v4, settle=0)
    assert refused.result == "refused" and "cannot activate" in refused.reason
    assert source_release_id(v4) not in _release_ids(store)
