"""The health loop's pace with plain numbers: polls, tree walks, stall samples."""

from __future__ import annotations

from cuzkd.states import State
from cuzkd.supervisor.core.cadence import (
    DESCENDANT_WALK,
    PROCESS_SETTLE,
    STALL_SAMPLES,
    STARTING_POLL,
    HealthCadence,
)


def cadence(*, health_interval: float = 2.0, start_timeout: float = 60.0,
            stall_after: float = 600.0) -> HealthCadence:
    return HealthCadence(health_interval, start_timeout, stall_after)


def test_polls_are_quick_until_the_first_answer_then_every_health_interval() -> None:
    c = cadence()
    assert c.poll_delay(State.STARTING) == STARTING_POLL
    assert c.poll_delay(State.RUNNING) == 2.0
    assert cadence(health_interval=0.05).poll_delay(State.STARTING) == 0.05


def test_an_engine_without_status_settles_after_process_settle_within_its_start_timeout() -> None:
    assert cadence().settle_delay == PROCESS_SETTLE
    assert cadence(start_timeout=0.3).settle_delay == 0.3


def test_the_tree_is_walked_at_once_then_every_descendant_walk_and_again_after_a_spawn() -> None:
    c = cadence()
    assert c.walk_due(1000.0)
    assert not c.walk_due(1000.0 + DESCENDANT_WALK - 0.01)
    assert c.walk_due(1000.0 + DESCENDANT_WALK)
    c.spawned()
    assert c.walk_due(1000.0 + DESCENDANT_WALK + 1)


def test_stall_samples_are_spaced_to_stall_samples_per_stall_after() -> None:
    c = cadence(stall_after=600.0)
    assert c.stall_sample_due(1000.0)
    c.stall_sampled(1000.0)
    gap = 600.0 / STALL_SAMPLES
    assert not c.stall_sample_due(1000.0 + gap - 0.01)
    assert c.stall_sample_due(1000.0 + gap)
    c.spawned()
    assert c.stall_sample_due(1000.0)


def test_no_stall_samples_without_a_stall_watch() -> None:
    assert not cadence(stall_after=0.0).stall_sample_due(1000.0)
