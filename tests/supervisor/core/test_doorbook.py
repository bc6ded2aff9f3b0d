"""The door's book with plain values on a virtual clock: where each call goes, which wait and
for how long, what a drain waits for, what a lost engine's calls become."""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import dataclass, field

import pytest
from support.door_calls import (
    CRITICAL,
    HIGH,
    LOW,
    NORMAL,
    MiB,
    await_,
    book,
    prove,
    refused,
    sent,
    submit,
)

from cuzkd.cuzk.reading import KindQueue, QueueReading
from cuzkd.states import DoorAbandon, DoorRefusal, DoorRetry
from cuzkd.supervisor.core.doorbook import (
    FOLLOW_JOB,
    Abandoned,
    Broadcast,
    Call,
    Code,
    Decision,
    DoorBook,
    DoorRules,
    EngineEnd,
    EngineReading,
    FromCache,
    Hold,
    Join,
    Outcome,
    Quarantined,
    Refuse,
    Send,
    Withdrawn,
)

CRASHED, OOM = EngineEnd.CRASHED, EngineEnd.OOM_KILLED


def test_a_call_goes_to_the_admitting_engine_with_the_fewest_in_flight() -> None:
    b = book()
    b.admit("a", 0.0)
    b.admit("b", 0.0)
    assert b.arrived(prove(1), 0.0) == [Send(1, "a", retain=True)]  # a tie: by name
    assert sent(b.arrived(prove(2), 0.0)) == {2: "b"}
    assert sent(b.arrived(prove(3), 0.0)) == {3: "a"}
    b.returned(2, 1.0, Outcome.OK)
    b.returned(3, 1.0, Outcome.OK)
    assert sent(b.arrived(prove(4), 1.0)) == {4: "b"}  # a has call 1, b nothing
    assert (b.in_flight("a"), b.in_flight("b")) == (1, 1)


def test_with_no_engine_up_calls_are_held_then_released_by_kind_as_curio_sends_them() -> None:
    """WinningPoSt, WindowPoSt, then the rest, each in arrival order; a claimed priority may
    lower a call's place (LOW after NORMAL), never raise it (a PoRep claiming CRITICAL)."""
    b = book()
    calls = [("porep-c2", NORMAL), ("porep-c2", LOW), ("window-post", HIGH),
             ("winning-post", CRITICAL), ("porep-c2", 0), ("porep-c2", CRITICAL),
             ("winning-post", LOW), ("snap-update", 9)]  # 9: no cuzk value
    for call_id, (kind, priority) in enumerate(calls, 1):
        assert b.arrived(prove(call_id, priority=priority, kind=kind), float(call_id)) == [
            Hold(call_id, call_id + 600.0)]
    assert (b.held_calls, b.held_bytes) == (8, 8000)
    released = b.admit("a", 20.0)
    assert [d.call for d in released] == [4, 3, 1, 5, 6, 8, 2, 7]
    assert all(isinstance(d, Send) and d.engine == "a" for d in released)
    assert {d.call: d.held_for for d in released if isinstance(d, Send)}[4] == 16.0
    assert (b.held_calls, b.held_bytes, b.in_flight("a")) == (0, 0, 8)


def test_get_status_and_get_metrics_are_never_held_but_answered_from_the_cache() -> None:
    b = book()
    assert b.arrived(Call(1, "GetStatus", 0), 0.0) == [FromCache(1)]
    assert b.arrived(Call(2, "GetMetrics", 0), 0.0) == [FromCache(2)]
    assert b.arrived(Call(2, "GetMetrics", 0), 0.5) == [FromCache(2)]  # it ended: number free
    assert b.held_calls == 0
    b.admit("a", 1.0)
    assert b.arrived(Call(3, "GetStatus", 0), 1.0) == [Send(3, "a")]  # kept for no retry
    assert b.returned(3, 1.5, Outcome.BROKEN) == [FromCache(3)]  # its engine was lost under it
    b.arrived(Call(5, "GetStatus", 0), 1.5)
    assert b.gone("a", 1.6, CRASHED) == [FromCache(5)]
    b.admit("a", 1.7)
    b.stop_admitting("a")
    assert b.arrived(Call(4, "GetMetrics", 0), 2.0) == [FromCache(4)]
    assert b.in_flight("a") == 0


# -- several engines behind one door ----------------------------------------------------------

def test_a_common_door_asks_every_admitting_engine_for_status_metrics_and_srs() -> None:
    b = book(engines=("gpu1", "gpu0"))
    b.admit("gpu0", 0.0)
    b.admit("gpu1", 0.0)
    assert b.arrived(Call(1, "GetStatus", 0), 0.0) == [Broadcast(1, ("gpu1", "gpu0"))]
    assert b.arrived(Call(2, "GetMetrics", 0), 0.0) == [Broadcast(2, ("gpu1", "gpu0"))]
    assert b.arrived(Call(3, "PreloadSRS", 40), 0.0) == [Broadcast(3, ("gpu1", "gpu0"))]
    assert b.in_flight("gpu0") == b.in_flight("gpu1") == 0  # no engine's work: ended here
    assert sent(b.arrived(Call(4, "EvictSRS", 40), 0.0)) == {4: "gpu0"}  # one engine's
    b.stop_admitting("gpu1")  # its stop began: only the other is asked
    assert b.arrived(Call(5, "GetStatus", 0), 1.0) == [Broadcast(5, ("gpu0",))]
    assert b.arrived(Call(1, "GetStatus", 0), 1.0) == [Broadcast(1, ("gpu0",))]  # number free


def test_a_door_with_one_engine_sends_status_reads_to_it_as_before() -> None:
    b = book(engines=("a",))
    b.admit("a", 0.0)
    assert b.arrived(Call(1, "GetStatus", 0), 0.0) == [Send(1, "a")]
    assert b.arrived(Call(2, "PreloadSRS", 0), 0.0) == [Send(2, "a")]


def test_a_rolling_restart_of_a_common_door_holds_nothing_and_loses_nothing() -> None:
    """gpu0 stops (drained), its process ends, a new one starts; then gpu1 the same. Every
    call meanwhile goes at once to the engine that admits, the drained one's jobs finish."""
    b = book(engines=("gpu0", "gpu1"))
    b.admit("gpu0", 0.0)
    b.admit("gpu1", 0.0)
    on = {"gpu0": [1], "gpu1": []}
    assert sent(b.arrived(prove(1), 0.0)) == {1: "gpu0"}
    call = 2
    for stopping, other in (("gpu0", "gpu1"), ("gpu1", "gpu0")):
        b.stop_admitting(stopping)
        for _ in range(3):
            decisions = b.arrived(prove(call, priority=CRITICAL if call % 2 else LOW), 1.0)
            assert sent(decisions) == {call: other} and b.held_calls == 0
            on[other].append(call)
            call += 1
        assert b.in_flight(stopping) == len(on[stopping]) > 0  # what its drain waits for
        for done in on.pop(stopping):
            assert b.returned(done, 2.0, Outcome.OK) == []
        assert b.in_flight(stopping) == 0
        assert b.gone(stopping, 2.0, EngineEnd.DRAINED) == []  # drained: nothing to place again
        assert b.arrived(Call(call, "GetStatus", 0), 2.5) == [Broadcast(call, (other,))]
        call += 1
        b.admit(stopping, 3.0)
        on[stopping] = []


def test_a_common_door_with_every_engine_out_releases_winning_window_then_rest_and_spreads(
        ) -> None:
    b = book(engines=("a", "b"))
    for engine in ("a", "b"):
        b.admit(engine, 0.0)
        b.stop_admitting(engine)  # both stopping at once (a restart of everything)
    for call_id, priority in enumerate([LOW, NORMAL, HIGH, CRITICAL], 1):
        assert b.arrived(prove(call_id, priority=priority), 1.0) == [
            Hold(call_id, 601.0)]
    released = b.admit("b", 2.0)
    assert [(d.call, d.engine) for d in released if isinstance(d, Send)] == [
        (4, "b"), (3, "b"), (2, "b"), (1, "b")]  # LOW after NORMAL
    assert b.admit("a", 3.0) == []
    # b has the four released: a takes the new calls until they are even, then in turn
    placed = [sent(b.arrived(prove(i), 3.0))[i] for i in range(5, 12)]
    assert placed == ["a", "a", "a", "a", "a", "b", "a"]


def test_a_common_door_with_no_engine_up_caches_reads_and_holds_a_preload_for_every_engine(
        ) -> None:
    b = book(engines=("a", "b"))
    assert b.arrived(Call(1, "GetStatus", 0), 0.0) == [FromCache(1)]
    assert b.arrived(Call(2, "PreloadSRS", 40), 0.0) == [Hold(2, 600.0)]
    assert b.arrived(prove(3, priority=CRITICAL), 1.0) == [Hold(3, 601.0)]
    assert b.admit("b", 5.0) == [Send(3, "b", retain=True, held_for=4.0),
                                     Broadcast(2, ("b",), held_for=5.0)]
    assert b.held_calls == 0


def test_a_full_door_refuses_the_newcomer_but_a_critical_call_displaces_the_last_one() -> None:
    b = book(calls=3)
    for call_id in (1, 2, 3):
        b.arrived(prove(call_id), 0.0)
    [refusal] = b.arrived(prove(4), 1.0)
    assert isinstance(refusal, Refuse)
    assert (refusal.reason, refusal.code) == (DoorRefusal.HOLD_FULL_CALLS, Code.UNAVAILABLE)
    assert "hold_max_calls 3" in refusal.message
    winning = b.arrived(prove(5, priority=CRITICAL, size=10), 2.0)
    assert winning[0] == Hold(5, 602.0)
    assert refused(winning[1:]) == {3: DoorRefusal.HOLD_FULL_CALLS}  # released last: refused
    assert [d.call for d in b.admit("a", 3.0)] == [5, 1, 2]


def test_held_bytes_are_bounded_and_a_call_larger_than_the_bound_is_refused_whole() -> None:
    b = book(calls=100, nbytes=100 * MiB)
    assert isinstance(b.arrived(prove(1, size=60 * MiB), 0.0)[0], Hold)
    assert refused(b.arrived(prove(2, size=50 * MiB), 0.0)) == {2: DoorRefusal.HOLD_FULL_BYTES}
    assert refused(b.arrived(prove(3, size=101 * MiB, priority=CRITICAL), 0.0)) == {
        3: DoorRefusal.HOLD_FULL_BYTES}  # displacing every call would still not make room
    assert b.held_calls == 1  # nothing displaced for a call that is refused anyway
    high = b.arrived(prove(4, size=50 * MiB, priority=HIGH), 0.0)
    assert isinstance(high[0], Hold) and refused(high[1:]) == {1: DoorRefusal.HOLD_FULL_BYTES}
    assert b.held_bytes == 50 * MiB


def test_a_held_call_is_refused_at_its_hold_timeout_and_not_before() -> None:
    b = book(hold_timeout=300.0)
    b.arrived(prove(1), 10.0)
    b.arrived(prove(2), 20.0)
    assert b.next_deadline() == 310.0
    assert b.expired(309.9) == []
    [refusal] = b.expired(310.0)
    assert isinstance(refusal, Refuse) and refusal.call == 1
    assert (refusal.reason, refusal.held_for) == (DoorRefusal.HOLD_TIMEOUT, 300.0)
    assert "hold_timeout (300 s)" in refusal.message
    assert b.next_deadline() == 320.0
    assert refused(b.expired(400.0)) == {2: DoorRefusal.HOLD_TIMEOUT}
    assert b.next_deadline() is None and b.held_calls == 0


def test_a_call_number_in_use_is_the_shell_s_error_and_changes_nothing() -> None:
    b = book()
    b.arrived(prove(1), 0.0)
    with pytest.raises(ValueError, match="call 1 arrived while"):
        b.arrived(prove(1, size=5), 0.0)
    assert (b.held_calls, b.held_bytes) == (1, 1000)


def test_a_caller_leaving_while_held_withdraws_its_call() -> None:
    b = book()
    b.arrived(prove(1), 0.0)
    assert b.returned(1, 4.0, Outcome.CANCELLED) == [Withdrawn(1, 4.0)]
    assert b.held_calls == 0 and b.admit("a", 5.0) == []
    assert b.returned(1, 6.0, Outcome.OK) == []  # ended already: nothing more


def test_a_late_report_of_a_replaced_attempt_does_not_end_the_held_call() -> None:
    b = book()
    b.admit("a", 0.0)
    b.arrived(prove(1), 0.0)
    assert b.gone("a", 1.0, CRASHED) == [Hold(1, 601.0, DoorRetry.CRASH)]
    assert b.returned(1, 1.5, Outcome.BROKEN) == []  # the attempt on a's ended process
    assert b.held_calls == 1
    assert sent(b.admit("a", 2.0)) == {1: "a"}


def test_a_drain_sees_zero_in_flight_only_once_every_call_and_job_of_the_engine_returned() -> None:
    b = book()
    b.admit("a", 0.0)
    b.arrived(prove(1), 0.0)
    b.arrived(submit(2, "snap-1-7"), 0.0)
    b.stop_admitting("a")
    assert not b.admits("a")
    assert isinstance(b.arrived(prove(3), 1.0)[0], Hold)  # no new call for a stopping engine
    assert b.in_flight("a") == 2
    b.returned(1, 2.0, Outcome.OK)
    b.returned(2, 2.0, Outcome.OK)
    assert b.in_flight("a") == 1  # the job it accepted: nobody has collected it
    assert b.arrived(await_(4, "snap-1-7"), 3.0) == [Send(4, "a")]  # affinity, though stopping
    assert b.in_flight("a") == 2
    b.returned(4, 4.0, Outcome.CANCELLED)  # the caller left: the job is still in the engine
    assert b.in_flight("a") == 1
    assert b.arrived(await_(5, "snap-1-7"), 5.0) == [Send(5, "a")]
    b.returned(5, 6.0, Outcome.OK)
    assert b.in_flight("a") == 0
    assert b.gone("a", 7.0, EngineEnd.DRAINED) == []
    assert sent(b.admit("a", 8.0)) == {3: "a"}


def test_an_await_of_a_job_no_engine_holds_is_not_found() -> None:
    b = book()
    b.admit("a", 0.0)
    [refusal] = b.arrived(await_(1, "porep-[1 2]" + "x" * 500), 0.0)
    assert isinstance(refusal, Refuse)
    assert (refusal.reason, refusal.code) == (DoorRefusal.UNKNOWN_JOB, Code.NOT_FOUND)
    assert "'porep-[1 2]xxx" in refusal.message and len(refusal.message) < 200


def test_awaits_follow_their_job_to_the_engine_that_took_its_submit_even_when_held() -> None:
    b = book()
    assert isinstance(b.arrived(submit(1, "j"), 0.0)[0], Hold)
    assert isinstance(b.arrived(await_(2, "j"), 1.0)[0], Hold)  # follows its held submit
    b.arrived(await_(9, "j"), 1.0)
    assert b.returned(9, 1.5, Outcome.CANCELLED) == [Withdrawn(9, 0.5)]  # the others stay
    b.admit("b", 2.0)
    b.admit("a", 2.0)  # fewer in flight than b after the release: the job stays on b
    assert b.in_flight("b") == 2
    b.returned(1, 3.0, Outcome.OK)
    assert b.arrived(await_(3, "j"), 3.0) == [Send(3, "b")]
    assert b.in_flight("a") == 0


def test_awaits_held_for_a_submit_that_is_refused_are_refused_with_it() -> None:
    b = book(hold_timeout=60.0)
    b.arrived(submit(1, "j"), 0.0)
    b.arrived(await_(2, "j"), 30.0)
    assert refused(b.expired(60.0)) == {1: DoorRefusal.HOLD_TIMEOUT, 2: DoorRefusal.UNKNOWN_JOB}
    assert b.held_calls == 0


def test_a_submit_without_request_id_is_tracked_by_the_job_id_of_its_reply() -> None:
    b = book()
    b.admit("a", 0.0)
    b.admit("b", 0.0)
    b.arrived(submit(1, ""), 0.0)
    b.arrived(prove(2), 0.0)  # on b
    b.returned(1, 1.0, Outcome.OK, job="uuid-1")
    assert b.in_flight("a") == 1
    assert b.arrived(await_(3, "uuid-1"), 2.0) == [Send(3, "a")]


def test_a_failed_submit_leaves_no_job_behind() -> None:
    b = book()
    b.admit("a", 0.0)
    b.arrived(submit(1, "j"), 0.0)
    assert b.arrived(await_(2, "j"), 0.0) == [Send(2, "a")]  # pipelined: the submit is on a
    b.returned(1, 1.0, Outcome.ERROR)
    b.returned(2, 1.0, Outcome.ERROR)  # cuzk's NOT_FOUND
    assert b.in_flight("a") == 0
    assert refused(b.arrived(await_(3, "j"), 2.0)) == {3: DoorRefusal.UNKNOWN_JOB}


def test_an_oom_kill_sends_a_retained_prove_once_more_and_a_second_one_fails_it() -> None:
    b = book()
    b.admit("a", 0.0)
    b.admit("b", 0.0)
    assert b.arrived(prove(1, size=50 * MiB), 0.0) == [Send(1, "a", retain=True)]
    assert b.retained_bytes == 50 * MiB
    assert b.gone("a", 5.0, OOM) == [Send(1, "b", retry=DoorRetry.CRASH)]
    assert b.retained_bytes == 0  # sent the last time: its bytes may go
    assert (b.in_flight("a"), b.in_flight("b")) == (0, 1)
    [refusal] = b.gone("b", 6.0, OOM)
    assert isinstance(refusal, Refuse) and refusal.reason is DoorRefusal.ENGINE_LOST
    assert "ended under the call again" in refusal.message
    assert b.in_flight("b") == 0


def test_a_crash_with_no_other_engine_holds_the_retry_for_the_next_process() -> None:
    b = book(hold_timeout=600.0)
    b.admit("a", 0.0)
    b.arrived(prove(1, priority=LOW), 0.0)
    b.arrived(prove(2, priority=HIGH), 1.0)
    assert b.gone("a", 10.0, OOM) == [Hold(1, 610.0, DoorRetry.CRASH),
                                                Hold(2, 610.0, DoorRetry.CRASH)]
    b.arrived(prove(3, priority=HIGH), 11.0)
    released = b.admit("a", 40.0)
    assert [(d.call, d.held_for, d.retry) for d in released if isinstance(d, Send)] == [
        (2, 30.0, None), (3, 29.0, None), (1, 30.0, None)]  # a retry is counted on its Hold
    # HIGH first, then arrival order (a retry keeps its place)
    assert b.retained_bytes == 1000  # call 3's only: 1 and 2 are on their last sending


def test_a_crash_fails_what_cannot_be_sent_again_and_forgets_the_jobs_it_had() -> None:
    b = book(retry=1500)
    b.admit("a", 0.0)
    assert b.arrived(prove(1), 0.0) == [Send(1, "a", retain=True)]
    assert b.arrived(prove(2), 0.0) == [Send(2, "a", retain=False)]  # over retry_max_bytes
    b.arrived(Call(3, "PreloadSRS", 20), 0.0)
    b.arrived(submit(4, "j"), 0.0)  # over the retry bound too
    b.returned(4, 1.0, Outcome.OK)
    b.arrived(await_(5, "j"), 1.0)
    decisions = b.gone("a", 2.0, CRASHED)
    assert refused(decisions) == {2: DoorRefusal.RETRY_FULL, 3: DoorRefusal.ENGINE_LOST,
                                  5: DoorRefusal.ENGINE_LOST}
    assert [d for d in decisions if isinstance(d, Hold)] == [Hold(1, 602.0, DoorRetry.CRASH)]
    b.admit("a", 3.0)
    assert refused(b.arrived(await_(6, "j"), 3.0)) == {6: DoorRefusal.UNKNOWN_JOB}


def test_a_job_its_engine_had_when_it_crashed_is_unknown_to_the_next_process() -> None:
    b = book()
    b.admit("a", 0.0)
    b.arrived(submit(1, "j"), 0.0)
    b.returned(1, 1.0, Outcome.OK)
    assert b.gone("a", 2.0, CRASHED) == []
    b.admit("a", 3.0)
    assert refused(b.arrived(await_(2, "j"), 3.0)) == {2: DoorRefusal.UNKNOWN_JOB}


def test_a_failed_proof_is_an_ordinary_return_and_never_sent_again() -> None:
    b = book()
    b.admit("a", 0.0)
    b.arrived(prove(1), 0.0)
    assert b.returned(1, 1.0, Outcome.OK) == []  # whatever its status: FAILED included
    assert b.retained_bytes == 0 and b.in_flight("a") == 0
    assert b.gone("a", 2.0, CRASHED) == []


def test_a_broken_call_goes_to_another_process_never_back_to_the_one_that_broke_it() -> None:
    b = book()
    b.admit("a", 0.0)
    b.arrived(submit(1, "j"), 0.0)
    b.arrived(prove(2), 0.0)
    assert b.returned(1, 1.0, Outcome.BROKEN) == [Hold(1, 601.0, DoorRetry.BROKEN)]
    assert b.in_flight("a") == 1
    assert b.arrived(await_(5, "j"), 1.0) == [Hold(5, 601.0)]  # follows its submit, not to a
    assert sent(b.arrived(prove(3), 2.0)) == {3: "a"}  # others still go to a
    assert b.gone("a", 3.0, OOM)[0] == Hold(2, 603.0, DoorRetry.CRASH)
    assert sent(b.admit("a", 30.0)) == {1: "a", 2: "a", 3: "a", 5: "a"}  # a's next one
    b.returned(1, 31.0, Outcome.OK)
    assert b.arrived(await_(4, "j"), 31.0) == [Send(4, "a")]


def test_a_job_goes_where_its_broken_submit_is_sent_again() -> None:
    b = book()
    b.admit("a", 0.0)
    b.arrived(submit(1, "j"), 0.0)
    b.returned(1, 1.0, Outcome.OK)
    b.admit("b", 1.0)
    assert b.arrived(submit(2, "j"), 2.0) == [Send(2, "a", retain=True)]  # a has the job
    assert b.returned(2, 3.0, Outcome.BROKEN) == [Send(2, "b", retry=DoorRetry.BROKEN)]
    assert (b.in_flight("a"), b.in_flight("b")) == (0, 1)  # a's drain does not wait for it
    b.returned(2, 4.0, Outcome.OK)
    assert b.arrived(await_(3, "j"), 5.0) == [Send(3, "b")]


def test_a_broken_call_moves_to_another_engine_at_once_when_one_admits() -> None:
    b = book()
    b.admit("a", 0.0)
    b.admit("b", 0.0)
    b.arrived(prove(1), 0.0)
    assert b.returned(1, 1.0, Outcome.BROKEN) == [Send(1, "b", retry=DoorRetry.BROKEN)]
    assert refused(b.returned(1, 2.0, Outcome.BROKEN)) == {1: DoorRefusal.ENGINE_LOST}


def test_at_shutdown_the_door_serves_on_and_refuses_what_it_still_has_when_it_closes() -> None:
    """cuzkd's shutdown drains the engines like any operator's stop: the door holds new calls
    (and sends deadline calls to a draining engine), lets jobs be collected, and refuses only
    what is still held or in flight when it closes, naming the restart."""
    b = book()
    b.admit("a", 0.0)
    b.arrived(submit(1, "j"), 0.0)
    b.returned(1, 1.0, Outcome.OK)
    b.arrived(prove(2), 1.0)  # in flight: the drain's to wait for
    b.stop_admitting("a", 2.0, drain_until=22.0)
    assert isinstance(b.arrived(prove(3), 2.0)[0], Hold)
    assert b.arrived(Call(6, "GetStatus", 0), 2.0) == [FromCache(6)]
    assert b.arrived(await_(7, "j"), 4.0) == [Send(7, "a")]
    b.returned(7, 5.0, Outcome.OK)
    b.returned(2, 5.0, Outcome.OK)
    assert b.in_flight("a") == 0
    b.arrived(prove(8), 6.0)
    b.gone("a", 6.5, EngineEnd.DRAINED)
    decisions = b.closed(7.0)
    assert [(d.call, d.reason, d.code, d.held_for) for d in decisions
            if isinstance(d, Refuse)] == [(3, DoorRefusal.SHUTTING_DOWN, Code.UNAVAILABLE, 5.0),
                                          (8, DoorRefusal.SHUTTING_DOWN, Code.UNAVAILABLE, 1.0)]
    assert all("cuzkd stopped (a restart or a stop)" in d.message for d in decisions
               if isinstance(d, Refuse))
    assert b.held_calls == 0


def test_a_call_still_on_an_engine_when_the_door_closes_is_refused_naming_it() -> None:
    b = book()
    b.admit("a", 0.0)
    b.arrived(prove(1), 0.0)
    [refusal] = b.closed(1.0)
    assert isinstance(refusal, Refuse) and refusal.reason is DoorRefusal.SHUTTING_DOWN
    assert "in flight on engine a" in refusal.message and refusal.held_for is None
    assert b.in_flight("a") == 0


# -- every call accounted for exactly once, through crashes -----------------------------------

METHODS = ["Prove"] * 12 + ["SubmitProof", "AwaitProof", "CancelProof", "GetStatus",
                            "PreloadSRS"]
OUTCOMES = [Outcome.OK] * 6 + [Outcome.ERROR, Outcome.CANCELLED, Outcome.BROKEN]
KINDS = ["porep-c2"] * 4 + ["snap-update", "window-post", "winning-post"]
#: how processes end in the random runs: crashes most (suspects, quarantines), every end once
ENDS = [CRASHED] * 5 + list(EngineEnd)
RULES = DoorRules(deadlines={"winning-post": 20.0, "window-post": 60.0},
                  allowances={"winning-post": 5.0, "window-post": 10.0}, quarantine=30.0,
                  one_post=frozenset({"a"}))


@dataclass
class Shell:
    """The door's shell as the book sees it: carries decisions out and checks each one."""

    book: DoorBook
    calls: dict[int, Call] = field(default_factory=dict)
    #: call -> the engine it is on, "held", or "join" (waiting for another call's answer)
    where: dict[int, str] = field(default_factory=dict)
    until: dict[int, float] = field(default_factory=dict)
    sendings: Counter[int] = field(default_factory=Counter)
    endings: Counter[int] = field(default_factory=Counter)
    jobs: dict[str, str] = field(default_factory=dict)
    #: every refusal, retry and abandon reason seen, and the kinds of decisions
    reasons: set[object] = field(default_factory=set)
    decided: set[str] = field(default_factory=set)

    def carry_out(self, decisions: list[Decision]) -> None:
        for d in decisions:
            self.decided.add(type(d).__name__)
            if d.call is None:
                continue
            assert self.endings[d.call] == 0, f"call {d.call} decided after it ended"
            if isinstance(d, Refuse):
                self.reasons.add(d.reason)
            elif isinstance(d, Send | Hold) and d.retry is not None:
                self.reasons.add(d.retry)
            if isinstance(d, Send):
                self.sendings[d.call] += 1
                assert self.sendings[d.call] <= 2, f"call {d.call} sent a third time"
                self.where[d.call] = d.engine
            elif isinstance(d, Hold):
                self.where[d.call], self.until[d.call] = "held", d.until
            elif isinstance(d, Join):
                self.where[d.call] = "join"
            elif isinstance(d, Abandoned):
                self.reasons.add(d.reason)
                assert self.where.get(d.call) == d.engine
            elif not isinstance(d, Quarantined):
                self.end(d.call)
        b = self.book
        limits = self.book.limits
        assert b.held_calls <= limits.hold_max_calls and b.held_bytes <= limits.hold_max_bytes
        assert 0 <= b.retained_bytes <= limits.retry_max_bytes
        assert b.held_calls == sum(place == "held" for place in self.where.values())
        posts = [c for c in self.on("a") if self.calls[c].method in ("Prove", "SubmitProof")
                 and self.calls[c].kind.endswith("post")]
        assert len(posts) <= 1, f"PoSt calls {posts} on a, which gets one at a time"

    def end(self, call_id: int) -> None:
        self.endings[call_id] += 1
        self.where.pop(call_id, None)

    def on(self, engine: str) -> list[int]:
        return sorted(c for c, place in self.where.items() if place == engine)


def random_call(rng: random.Random, call_id: int, shell: Shell) -> Call:
    method = rng.choice(METHODS)
    kind = rng.choice(KINDS) if method in ("Prove", "SubmitProof") else ""
    if method in FOLLOW_JOB:
        job = rng.choice(list(shell.jobs) or ["none"])
    elif rng.random() < 0.1 and shell.calls:  # a request id in flight again
        job = rng.choice(list(shell.calls.values())).job
    else:
        job = f"job-{call_id}"
    request = rng.choice([b"x", b"y"])
    return Call(call_id, method, rng.randint(0, 3000), rng.randint(0, 4), job, kind,
                rng.choice([None, 15.0, 120.0]), request)


def random_reading(rng: random.Random, shell: Shell, engine: str) -> EngineReading:
    jobs = frozenset(shell.calls[c].job for c in shell.on(engine) if rng.random() < 0.8)
    queues = QueueReading({kind: KindQueue(int(rng.random() < 0.05), int(rng.random() < 0.05))
                           for kind in set(KINDS)})
    return EngineReading(jobs, frozenset(j for j in jobs if rng.random() < 0.5), queues)


@pytest.mark.parametrize("behind_one_door", [(), ("a", "b")],
                         ids=["two doors' worth", "one door for both"])
def test_ten_thousand_calls_through_two_crashing_engines_each_end_exactly_once(
        behind_one_door: tuple[str, ...]) -> None:
    rng = random.Random(25)
    b = book(hold_timeout=30.0, calls=25, nbytes=40_000, retry=30_000, engines=behind_one_door,
             rules=RULES)
    shell = Shell(b)
    engines = {"a": False, "b": False}  # admitting?
    now = 0.0
    for call_id in range(1, 10_001):
        now += rng.expovariate(4.0)
        shell.carry_out(b.expired(now))
        assert all(shell.until[c] > now for c, p in shell.where.items() if p == "held")
        call = shell.calls[call_id] = random_call(rng, call_id, shell)
        shell.carry_out(b.arrived(call, now))
        for _ in range(rng.randint(0, 2)):  # engines answer some calls
            engine = rng.choice(list(engines))
            if on := shell.on(engine):
                answered = rng.choice(on)
                outcome = rng.choice(OUTCOMES)
                if outcome is not Outcome.BROKEN:
                    shell.end(answered)
                    if shell.calls[answered].method == "SubmitProof" and outcome is Outcome.OK:
                        shell.jobs[shell.calls[answered].job] = engine
                shell.carry_out(b.returned(answered, now, outcome))
        waiting = [c for c, place in shell.where.items() if place in ("held", "join")]
        if waiting and rng.random() < 0.02:  # a caller gives up
            gone = rng.choice(waiting)
            if shell.where[gone] == "join":
                shell.end(gone)
            shell.carry_out(b.returned(gone, now, Outcome.CANCELLED))
        roll, engine = rng.random(), rng.choice(list(engines))
        if roll < 0.01:  # the process ends: crashed, or after its stop
            shell.carry_out(b.gone(engine, now, rng.choice(ENDS)))
            assert shell.on(engine) == [] and b.in_flight(engine) == 0
            engines[engine] = False
            shell.jobs = {j: e for j, e in shell.jobs.items() if e != engine}
        elif roll < 0.02 and not engines[engine]:
            engines[engine] = True
            shell.carry_out(b.admit(engine, now))
        elif roll < 0.025:
            drain = rng.choice([None, now + rng.uniform(0, 30)])
            shell.carry_out(b.stop_admitting(engine, now, drain))
            engines[engine] = False
        for engine, admitting in engines.items():  # drains read their engines
            if not admitting and rng.random() < 0.5:
                shell.carry_out(b.reading(engine, now, random_reading(rng, shell, engine)))
        for engine in engines:
            assert b.in_flight(engine) <= len(shell.on(engine)) + len(shell.jobs)
    for engine in engines:  # the shutdown's drain: the engines answer some of what they have
        for call_id in shell.on(engine)[::2]:
            shell.end(call_id)
            shell.carry_out(b.returned(call_id, now, Outcome.OK))
        shell.carry_out(b.gone(engine, now, EngineEnd.DRAINED))
    shell.carry_out(b.closed(now))
    assert set(shell.endings) == set(shell.calls)
    assert set(shell.endings.values()) == {1}
    assert shell.where == {} and b.held_calls == b.held_bytes == b.retained_bytes == 0
    assert sum(n == 2 for n in shell.sendings.values()) > 50  # retries did happen
    # each word is a decision the book makes
    assert shell.reasons == {*DoorRefusal, *DoorRetry, *DoorAbandon}
    assert shell.decided == {"Send", "Hold", "Refuse", "FromCache", "Broadcast", "Withdrawn",
                             "Join", "Echo", "Abandoned", "Quarantined"} - (
        set() if behind_one_door else {"Broadcast"})


@pytest.mark.parametrize("end, why", [(CRASHED, DoorRetry.CRASH), (OOM, DoorRetry.CRASH),
                                      (EngineEnd.STOPPED, DoorRetry.STOP),
                                      (EngineEnd.DRAINED, DoorRetry.STOP)])
def test_the_retry_says_whether_the_engine_crashed_or_was_stopped(end: EngineEnd,
                                                                   why: DoorRetry) -> None:
    b = book()
    b.admit("a", 0.0)
    b.admit("b", 0.0)
    b.arrived(prove(1), 0.0)
    assert b.gone("a", 1.0, end) == [Send(1, "b", retry=why)]
