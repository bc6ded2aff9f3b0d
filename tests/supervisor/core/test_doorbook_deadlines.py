"""The door's book keeps deadlines: a WinningPoSt is refused while its caller can still act
rather than proved late, goes to an engine draining for an operator's stop rather than wait
behind the drain, and never shares a cuzk engine's GPU queue key with another PoSt."""

from __future__ import annotations

from dataclasses import replace

from support.door_calls import (
    CRITICAL,
    CURIO_RULES,
    HIGH,
    NORMAL,
    book,
    prove,
    refused,
    sent,
)

from cuzkd.cuzk.reading import KindQueue, QueueReading
from cuzkd.states import DoorRefusal
from cuzkd.supervisor.core.doorbook import (
    Call,
    Code,
    DoorBook,
    DoorRules,
    EngineEnd,
    EngineReading,
    Hold,
    HoldCause,
    Outcome,
    Refuse,
    Send,
)

ONE_POST = DoorRules(deadlines=CURIO_RULES.deadlines, allowances=CURIO_RULES.allowances,
                     one_post=frozenset({"a", "b"}))


# -- 1. deadlines by kind -------------------------------------------------------------------

def test_a_held_winning_post_is_refused_once_it_can_no_longer_be_proved_in_time() -> None:
    """Deadline 20 s, proving allowance 5 s: refused at arrival + 15 s, not a moment before,
    with DEADLINE_EXCEEDED and a message that says why."""
    b = book(rules=CURIO_RULES)
    assert b.arrived(prove(1, priority=CRITICAL), 100.0) == [Hold(1, 115.0)]
    assert b.next_deadline() == 115.0
    assert b.expired(114.9) == []
    [refusal] = b.expired(115.0)
    assert isinstance(refusal, Refuse)
    assert (refusal.reason, refusal.code, refusal.held_for) == (
        DoorRefusal.DEADLINE, Code.DEADLINE_EXCEEDED, 15.0)
    assert "winning-post call that can no longer be proved by its deadline" in refusal.message
    assert "proving may take 5 s ([door] proving_allowance)" in refusal.message
    assert b.held_calls == 0 and b.next_deadline() is None


def test_the_caller_s_own_deadline_counts_when_it_is_earlier() -> None:
    b = book(rules=CURIO_RULES)
    assert b.arrived(prove(1, priority=CRITICAL, timeout=8.0), 0.0) == [Hold(1, 3.0)]
    assert b.arrived(prove(2, priority=CRITICAL, timeout=60.0), 0.0) == [Hold(2, 15.0)]
    assert refused(b.expired(3.0)) == {1: DoorRefusal.DEADLINE}


def test_a_call_of_a_kind_without_deadline_waits_its_hold_timeout_whatever_its_caller_s() -> None:
    """A PoRep has no deadline: its caller's own (Curio's 30 min) is the caller's business;
    the door holds it for hold_timeout as before."""
    b = book(rules=CURIO_RULES, hold_timeout=300.0)
    assert b.arrived(prove(1, timeout=60.0), 0.0) == [Hold(1, 300.0)]
    assert b.expired(299.0) == []
    assert refused(b.expired(300.0)) == {1: DoorRefusal.HOLD_TIMEOUT}


def test_a_winning_post_past_its_time_is_not_sent_again_after_a_crash() -> None:
    b = book(rules=CURIO_RULES)
    b.admit("a", 0.0)
    assert b.arrived(prove(1, priority=CRITICAL), 0.0) == [Send(1, "a", retain=True)]
    b.arrived(prove(2), 0.0)
    decisions = b.gone("a", 16.0, EngineEnd.OOM_KILLED)
    assert refused(decisions) == {1: DoorRefusal.DEADLINE}
    assert isinstance(decisions[1], Hold) and decisions[1].call == 2


def test_an_answer_is_late_past_its_kind_s_deadline_or_its_caller_s_if_earlier() -> None:
    b = book(rules=CURIO_RULES)
    winning = prove(1, priority=CRITICAL)
    assert not b.answered_late(winning, 100.0, 120.0)
    assert b.answered_late(winning, 100.0, 120.5)
    assert b.answered_late(prove(2, priority=CRITICAL, timeout=10.0), 100.0, 110.5)
    assert not b.answered_late(prove(3, timeout=10.0), 100.0, 500.0)  # no kind deadline
    status = Call(4, "GetStatus", 0, kind="winning-post")
    assert not b.answered_late(status, 100.0, 500.0)  # only Prove/SubmitProof are due


# -- the door's order ------------------------------------------------------------------------

def test_released_calls_go_by_kind_then_deadline_first() -> None:
    """Two WindowPoSts: the one whose caller's deadline is nearer goes first, though it came
    later; a WinningPoSt before both; fifty PoReps claiming CRITICAL after all of them."""
    b = book(rules=CURIO_RULES, calls=100)
    for call_id in range(1, 51):
        b.arrived(prove(call_id, priority=CRITICAL, kind="porep-c2"), 0.0)
    b.arrived(prove(51, priority=HIGH, timeout=900.0), 1.0)
    b.arrived(prove(52, priority=HIGH, timeout=300.0), 2.0)
    b.arrived(prove(53, priority=CRITICAL), 3.0)
    released = [d.call for d in b.admit("a", 4.0)]
    assert released[:4] == [53, 52, 51, 1]


def test_fifty_calls_claiming_critical_do_not_push_a_real_winning_post_out_of_a_full_hold(
        ) -> None:
    b = book(rules=CURIO_RULES, calls=50)
    for call_id in range(1, 51):
        assert isinstance(b.arrived(prove(call_id, priority=CRITICAL, kind="porep-c2"),
                                    0.0)[0], Hold)
    decisions = b.arrived(prove(51, priority=CRITICAL), 1.0)
    assert decisions[0] == Hold(51, 16.0)
    assert refused(decisions[1:]) == {50: DoorRefusal.HOLD_FULL_CALLS}
    assert refused(b.arrived(prove(52, priority=CRITICAL, kind="porep-c2"), 2.0)) == {
        52: DoorRefusal.HOLD_FULL_CALLS}  # another claim displaces nothing


def test_a_full_hold_displaces_a_call_past_its_deadline_first() -> None:
    b = book(calls=2)
    b.arrived(prove(1, priority=HIGH, timeout=5.0), 0.0)  # its caller gives up at 5 s
    b.arrived(prove(2), 0.0)
    decisions = b.arrived(prove(3), 6.0)
    assert isinstance(decisions[0], Hold) and refused(decisions[1:]) == {
        1: DoorRefusal.HOLD_FULL_CALLS}


# -- 2. draining is not closed to deadline work ----------------------------------------------

def test_a_winning_post_goes_to_an_engine_draining_for_a_restart_while_it_fits() -> None:
    b = book(rules=CURIO_RULES)
    b.admit("a", 0.0)
    b.arrived(prove(1), 0.0)
    assert b.stop_admitting("a", 1.0, drain_until=21.0) == []
    assert b.arrived(prove(2, priority=CRITICAL), 2.0) == [Send(2, "a", retain=True)]
    assert isinstance(b.arrived(prove(3), 2.0)[0], Hold)  # no PoRep for a draining engine
    assert b.in_flight("a") == 2  # the drain waits for it, within its own deadline
    # 5 s of proving no longer fit before the drain's end at 21 s: held, refused in time
    assert b.arrived(prove(4, priority=CRITICAL), 16.5) == [Hold(4, 31.5)]
    # nor a WindowPoSt's 120 s (its deadline is 20 min: it waits for the next process)
    assert b.arrived(prove(5, priority=HIGH), 16.5) == [Hold(5, 616.5)]


def test_a_held_deadline_call_goes_once_an_operator_s_stop_opens_the_drain() -> None:
    """The only engine is restarting (held calls), then the other's stop begins: the
    WinningPoSt goes to the draining one at once, the PoRep keeps waiting."""
    b = book(rules=CURIO_RULES)
    b.arrived(prove(1, priority=CRITICAL), 0.0)
    b.arrived(prove(2), 0.0)
    b.admit("a", 0.0)  # took both
    b.stop_admitting("b")
    b.arrived(prove(3, priority=CRITICAL), 1.0)  # to a
    b.stop_admitting("a", 2.0, drain_until=30.0)
    assert sent(b.arrived(prove(4, priority=CRITICAL), 3.0)) == {4: "a"}


def test_no_deadline_call_goes_to_an_engine_stopped_as_unhealthy_or_stalled() -> None:
    b = book(rules=CURIO_RULES)
    b.admit("a", 0.0)
    b.stop_admitting("a", 0.0)  # a health kill's stop: no drain for deadline calls
    assert b.arrived(prove(1, priority=CRITICAL), 1.0) == [Hold(1, 16.0)]


def test_an_admitting_engine_is_preferred_to_a_draining_one() -> None:
    b = book(rules=CURIO_RULES)
    b.admit("a", 0.0)
    b.admit("b", 0.0)
    b.stop_admitting("a", 0.0, drain_until=60.0)
    assert sent(b.arrived(prove(1, priority=CRITICAL), 1.0)) == {1: "b"}


def test_a_held_winning_post_goes_to_a_draining_engine_when_its_stop_begins() -> None:
    b = book(rules=CURIO_RULES)
    b.admit("a", 0.0)
    b.stop_admitting("a", 0.0)  # unhealthy: closed to it
    assert isinstance(b.arrived(prove(1, priority=CRITICAL), 1.0)[0], Hold)
    b.admit("b", 0.0)
    b.arrived(prove(9), 1.0)
    b.gone("a", 1.5, EngineEnd.STOPPED)
    assert b.held_calls == 0  # b took it when it was admitted


# -- 4. cuzk's PoSt defect avoided ----------------------------------------------------------

def warm(b: object, engine: str) -> None:
    """The engine's process has proved its first partitioned job (cuzk's job 0)."""
    assert isinstance(b, DoorBook)
    b.arrived(prove(900, job=f"porep-warm-{engine}"), 0.0)
    b.returned(900, 0.0, Outcome.OK)


def test_an_engine_gets_one_post_at_a_time_winning_first_then_window_by_age() -> None:
    b = book(rules=ONE_POST)
    b.admit("a", 0.0)
    warm(b, "a")
    assert sent(b.arrived(prove(1, priority=HIGH), 0.0)) == {1: "a"}  # a WindowPoSt
    assert b.arrived(prove(2, priority=HIGH), 1.0) == [
        Hold(2, 601.0, cause=HoldCause.POST_IN_FLIGHT)]
    assert b.arrived(prove(3, priority=CRITICAL), 2.0) == [
        Hold(3, 17.0, cause=HoldCause.POST_IN_FLIGHT)]
    assert sent(b.arrived(prove(4), 2.0)) == {4: "a"}  # a PoRep shares the engine
    assert b.returned(1, 3.0, Outcome.OK) == [Send(3, "a", retain=True, held_for=1.0,
                                                   serialized=True)]
    assert b.returned(3, 4.0, Outcome.OK) == [Send(2, "a", retain=True, held_for=3.0,
                                                   serialized=True)]


def test_an_engine_without_one_post_takes_posts_together() -> None:
    b = book(rules=CURIO_RULES)
    b.admit("a", 0.0)
    assert sent(b.arrived(prove(1, priority=HIGH), 0.0)) == {1: "a"}
    assert sent(b.arrived(prove(2, priority=CRITICAL), 0.0)) == {2: "a"}


def test_a_shared_door_sends_the_second_post_to_the_other_engine() -> None:
    b = book(rules=ONE_POST, engines=("a", "b"))
    b.admit("a", 0.0)
    b.admit("b", 0.0)
    assert sent(b.arrived(prove(1, priority=HIGH), 0.0)) == {1: "a"}
    assert sent(b.arrived(prove(2, priority=CRITICAL), 0.0)) == {2: "b"}


def test_no_post_beside_a_fresh_process_s_first_job_until_its_partition_0_left_the_queue(
        ) -> None:
    """cuzk numbers a process's first partitioned job 0: its partition 0 takes the PoSts' GPU
    queue key. A reading showing that partition on a GPU (or done) frees the PoSt slot."""
    b = book(rules=ONE_POST)
    b.admit("a", 0.0)
    assert sent(b.arrived(prove(1, job="porep-1-1"), 0.0)) == {1: "a"}
    assert b.wants_reading("a")
    assert b.arrived(prove(2, priority=CRITICAL), 1.0) == [
        Hold(2, 16.0, cause=HoldCause.POST_IN_FLIGHT)]
    assert b.reading("a", 2.0, EngineReading(frozenset({"porep-1-1"}))) == []
    assert b.reading("a", 3.0, EngineReading(frozenset({"porep-1-1"}),
                                             frozenset({"porep-1-1"}))) == [
        Send(2, "a", retain=True, held_for=2.0, serialized=True)]
    assert not b.wants_reading("a")
    b.returned(2, 4.0, Outcome.OK)
    assert sent(b.arrived(prove(3, priority=CRITICAL), 5.0)) == {3: "a"}  # the process is warm


def test_of_several_jobs_sent_at_once_cuzk_may_start_any_first(
        ) -> None:
    """cuzk's job 0 is the first it starts, whichever the door sent first, and ``/status``
    lists only started jobs: the PoSt slot is free once every listed job has its partition 0
    past the GPU queue -- not while one listed is short of it, nor on a reading listing none;
    and once a partitioned job's Prove has returned."""
    b = book(rules=ONE_POST)
    b.admit("a", 0.0)
    for n in (1, 2, 3):
        b.arrived(prove(n, job=f"porep-1-{n}"), 0.0)
    assert b.arrived(prove(9, priority=CRITICAL), 1.0)[0] == Hold(
        9, 16.0, cause=HoldCause.POST_IN_FLIGHT)
    assert b.reading("a", 2.0, EngineReading(frozenset())) == []  # none started yet
    started = frozenset({"porep-1-3", "porep-1-2"})  # it took the last sent first
    assert b.reading("a", 3.0, EngineReading(started, frozenset({"porep-1-3"}))) == []
    assert b.reading("a", 4.0, EngineReading(started, started)) == [
        Send(9, "a", retain=True, held_for=3.0, serialized=True)]
    fresh = book(rules=ONE_POST)
    fresh.admit("a", 0.0)
    for n in (1, 2):
        fresh.arrived(prove(n, job=f"porep-1-{n}"), 0.0)
    fresh.arrived(prove(9, priority=CRITICAL), 1.0)
    assert sent(fresh.returned(2, 9.0, Outcome.OK)) == {9: "a"}  # proved whole: no guard


def test_a_fresh_process_s_first_partitioned_job_waits_for_a_post_in_flight() -> None:
    b = book(rules=ONE_POST)
    b.admit("a", 0.0)
    assert sent(b.arrived(prove(1, priority=CRITICAL), 0.0)) == {1: "a"}
    assert b.arrived(prove(2), 0.1) == [Hold(2, 600.1, cause=HoldCause.POST_IN_FLIGHT)]
    assert sent(b.returned(1, 0.9, Outcome.OK)) == {2: "a"}
    b.returned(2, 100.0, Outcome.OK)  # a Prove's end: its partition 0 left the queue long ago
    assert sent(b.arrived(prove(3, priority=CRITICAL), 101.0)) == {3: "a"}


def test_a_first_job_refused_by_the_engine_leaves_the_process_fresh() -> None:
    b = book(rules=ONE_POST)
    b.admit("a", 0.0)
    b.arrived(prove(1), 0.0)
    b.returned(1, 0.5, Outcome.ERROR)  # cuzk may never have dispatched it: job 0 is unused
    b.arrived(prove(2, priority=CRITICAL), 1.0)
    assert b.arrived(prove(3), 1.0) == [Hold(3, 601.0, cause=HoldCause.POST_IN_FLIGHT)]


def test_a_post_waiting_its_turn_is_not_refused_for_the_hold_timeout_only_for_its_deadline(
        ) -> None:
    b = book(rules=ONE_POST, hold_timeout=60.0)
    b.admit("a", 0.0)
    b.arrived(prove(1, priority=HIGH), 0.0)  # a WindowPoSt proving for minutes
    assert b.arrived(prove(2, priority=HIGH, timeout=1100.0), 1.0) == [
        Hold(2, 61.0, cause=HoldCause.POST_IN_FLIGHT)]
    assert b.expired(61.0) == [Hold(2, 121.0, cause=HoldCause.POST_IN_FLIGHT)]
    assert refused(b.expired(981.0)) == {2: DoorRefusal.DEADLINE}  # 1101 less 120 s


def test_a_post_sent_again_after_a_crash_still_goes_alone() -> None:
    b = book(rules=ONE_POST)
    b.admit("a", 0.0)
    b.arrived(prove(1, priority=HIGH), 0.0)
    b.gone("a", 1.0, EngineEnd.OOM_KILLED)
    b.arrived(prove(2, priority=CRITICAL), 2.0)
    released = b.admit("a", 3.0)
    assert sent(released) == {2: "a"}  # WinningPoSt first; the WindowPoSt waits for it
    assert [d.cause for d in b.arrived(prove(3, priority=HIGH), 3.0)
            if isinstance(d, Hold)] == [HoldCause.POST_IN_FLIGHT]
    assert b.held_calls == 2


def test_a_post_job_submitted_keeps_the_slot_until_collected_or_its_deadline() -> None:
    b = book(rules=ONE_POST)
    b.admit("a", 0.0)
    warm(b, "a")
    b.arrived(replace(prove(1, priority=CRITICAL, job="winpost-1"), method="SubmitProof"), 1.0)
    b.returned(1, 1.1, Outcome.OK)
    assert isinstance(b.arrived(prove(2, priority=CRITICAL), 2.0)[0], Hold)
    assert b.next_deadline() == 17.0
    assert sent(b.expired(21.1)) == {}  # the job's slot ends at 21.1, the call's time at 17
    assert b.held_calls == 0


def test_readings_while_running_show_no_queue_and_abandon_nothing() -> None:
    b = book(rules=ONE_POST)
    b.admit("a", 0.0)
    b.arrived(prove(1, priority=HIGH), 0.0)
    empty = EngineReading(frozenset(), queues=QueueReading({"window-post": KindQueue(0, 0)}))
    assert b.reading("a", 1.0, empty) == [] and b.reading("a", 2.0, empty) == []
    assert b.in_flight("a") == 1


def test_a_normal_priority_winning_post_keeps_its_kind_s_deadline() -> None:
    b = book(rules=CURIO_RULES)
    assert b.arrived(prove(1, priority=NORMAL, kind="winning-post"), 0.0) == [Hold(1, 15.0)]
