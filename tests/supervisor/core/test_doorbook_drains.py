"""Drains that end: the door's drain waits for work the engine is doing, not for work it
dropped. While an engine drains, its readings (``/status`` and ``GetStatus``) end the wait
for a call or job it shows it no longer has; what was abandoned is sent to the next
process."""

from __future__ import annotations

from support.door_calls import CRITICAL, CURIO_RULES, HIGH, await_, book, prove, sent, submit

from cuzkd.cuzk.reading import KindQueue, QueueReading
from cuzkd.states import DoorAbandon, DoorRetry
from cuzkd.supervisor.core.doorbook import (
    Abandoned,
    EngineEnd,
    EngineReading,
    Hold,
    Outcome,
    Send,
)


def queues(**jobs: tuple[int, int]) -> QueueReading:
    """A GetStatus reading: kind (underscored) -> (pending, in progress); the rest empty."""
    kinds = ("porep-c2", "snap-update", "window-post", "winning-post")
    return QueueReading({kind: KindQueue(*jobs.get(kind.replace("-", "_"), (0, 0)))
                         for kind in kinds})


def listed(*ids: str, **jobs: tuple[int, int]) -> EngineReading:
    return EngineReading(frozenset(ids), queues=queues(**jobs))


def test_a_prove_cuzk_no_longer_lists_stops_holding_the_drain_after_two_reads() -> None:
    b = book(rules=CURIO_RULES)
    b.admit("a", 0.0)
    b.arrived(prove(1, job="porep-1-1"), 0.0)
    b.arrived(prove(2, job="porep-1-2"), 0.0)
    b.stop_admitting("a", 1.0, drain_until=181.0)
    assert b.reading("a", 1.0, listed("porep-1-2")) == []  # one read is not enough
    assert b.reading("a", 1.5, listed("porep-1-1", "porep-1-2")) == []  # shown again
    assert b.reading("a", 2.0, listed("porep-1-2")) == []
    assert b.reading("a", 2.5, listed("porep-1-2")) == [
        Abandoned(1, "a", DoorAbandon.NOT_LISTED, "porep-1-1")]
    assert b.in_flight("a") == 1
    b.returned(2, 3.0, Outcome.OK)
    assert b.in_flight("a") == 0  # the drain ends: call 1 is cuzk's lost work, not its work
    assert b.gone("a", 3.5, EngineEnd.DRAINED) == [Hold(1, 603.5, DoorRetry.STOP)]


def test_a_prove_still_queued_in_cuzk_s_scheduler_holds_the_drain() -> None:
    """cuzk lists a job in /status only once dispatched; queued it is pending in GetStatus."""
    b = book(rules=CURIO_RULES)
    b.admit("a", 0.0)
    b.arrived(prove(1, job="porep-1-1"), 0.0)
    b.stop_admitting("a", 1.0, drain_until=181.0)
    for at in (1.0, 1.5, 2.0):
        assert b.reading("a", at, listed(porep_c2=(1, 0))) == []
    unknown = EngineReading(frozenset(), queues=QueueReading.unknown("deadline exceeded"))
    for at in (2.5, 3.0, 3.5):  # what was not read shows everything
        assert b.reading("a", at, unknown) == []
        assert b.reading("a", at, EngineReading(None, queues=queues())) == []
    assert b.in_flight("a") == 1


def test_an_overwritten_post_stops_holding_the_drain_when_its_queue_shows_nothing() -> None:
    b = book(rules=CURIO_RULES)
    b.admit("a", 0.0)
    b.arrived(prove(1, priority=HIGH, job="wdpost-1-[0]"), 0.0)
    b.arrived(prove(2, priority=HIGH, job="wdpost-1-[1]"), 0.0)
    b.stop_admitting("a", 1.0, drain_until=181.0)
    assert b.reading("a", 1.0, listed(window_post=(0, 1))) == []  # one is on a GPU
    assert b.reading("a", 1.5, listed(window_post=(0, 0))) == []
    assert b.reading("a", 2.0, listed(window_post=(0, 0))) == [
        Abandoned(1, "a", DoorAbandon.POST_QUEUE_EMPTY, "wdpost-1-[0]"),
        Abandoned(2, "a", DoorAbandon.POST_QUEUE_EMPTY, "wdpost-1-[1]")]
    assert b.in_flight("a") == 0


def test_a_post_past_its_deadline_stops_holding_the_drain_at_once() -> None:
    b = book(rules=CURIO_RULES)
    b.admit("a", 0.0)
    b.arrived(prove(1, priority=CRITICAL), 0.0)
    b.stop_admitting("a", 1.0, drain_until=181.0)
    assert b.reading("a", 19.0, listed(winning_post=(0, 1))) == []
    assert b.reading("a", 20.5, listed(winning_post=(0, 1))) == [
        Abandoned(1, "a", DoorAbandon.PAST_DEADLINE, "porep-1000-1")]


def test_a_submitted_job_nobody_awaits_stops_holding_the_drain_after_a_grace() -> None:
    b = book(rules=CURIO_RULES)
    b.admit("a", 0.0)
    b.arrived(submit(1, "snap-1-7"), 0.0)
    b.returned(1, 0.5, Outcome.OK)
    b.arrived(await_(2, "snap-1-7"), 0.6)
    b.returned(2, 0.7, Outcome.CANCELLED)  # its awaiter left; the job is still the engine's
    b.stop_admitting("a", 1.0, drain_until=181.0)
    assert b.reading("a", 1.0, listed("snap-1-7")) == []  # finished, kept 30 s in /status
    for at in (31.0, 31.5, 35.5):
        assert b.reading("a", at, listed()) == []  # gone from /status: within its grace
    assert b.reading("a", 36.0, listed()) == [
        Abandoned(None, "a", DoorAbandon.JOB_NOT_LISTED, "snap-1-7")]
    assert b.in_flight("a") == 0


def test_an_await_of_an_abandoned_job_is_abandoned_with_it() -> None:
    b = book(rules=CURIO_RULES)
    b.admit("a", 0.0)
    b.arrived(submit(1, "snap-1-7"), 0.0)
    b.returned(1, 0.5, Outcome.OK)
    assert b.arrived(await_(2, "snap-1-7"), 0.6) == [Send(2, "a")]
    b.stop_admitting("a", 1.0, drain_until=181.0)
    b.reading("a", 1.0, listed())
    decisions = b.reading("a", 7.0, listed())
    assert decisions == [Abandoned(None, "a", DoorAbandon.JOB_NOT_LISTED, "snap-1-7"),
                         Abandoned(2, "a", DoorAbandon.JOB_NOT_LISTED, "snap-1-7")]
    assert b.in_flight("a") == 0


def test_an_abandoned_call_is_sent_to_the_next_process() -> None:
    """cuzk dropped it (a PoSt overwritten): the next process proves it, once."""
    b = book(rules=CURIO_RULES)
    b.admit("a", 0.0)
    b.arrived(prove(1, priority=HIGH, job="wdpost-1-[0]"), 0.0)
    b.stop_admitting("a", 1.0, drain_until=181.0)
    b.reading("a", 1.0, listed())
    assert len(b.reading("a", 1.5, listed())) == 1
    b.gone("a", 2.0, EngineEnd.DRAINED)
    assert sent(b.admit("a", 40.0)) == {1: "a"}


def test_a_late_answer_of_an_abandoned_call_is_an_ordinary_answer() -> None:
    b = book(rules=CURIO_RULES)
    b.admit("a", 0.0)
    b.arrived(prove(1, job="porep-1-1"), 0.0)
    b.stop_admitting("a", 1.0, drain_until=181.0)
    b.reading("a", 1.0, listed())
    b.reading("a", 1.5, listed())
    assert b.returned(1, 2.0, Outcome.OK) == []
    assert b.gone("a", 3.0, EngineEnd.DRAINED) == []
