"""The door's book with plain values on a virtual clock: where each call goes, which wait and
for how long, what a drain waits for, what a lost engine's calls become."""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import dataclass, field

import pytest

from cuzkd.states import DoorRefusal, DoorRetry
from cuzkd.supervisor.core.doorbook import (
    FOLLOW_JOB,
    Broadcast,
    Call,
    Code,
    Decision,
    DoorBook,
    FromCache,
    Hold,
    Outcome,
    Refuse,
    Send,
    Withdrawn,
)

LOW, NORMAL, HIGH, CRITICAL = 1, 2, 3, 4
MiB = 1 << 20


def book(*, hold_timeout: float = 600.0, calls: int = 8, nbytes: int = 100 * MiB,
         retry: int = 60 * MiB, engines: tuple[str, ...] = ()) -> DoorBook:
    return DoorBook(hold_timeout=hold_timeout, hold_max_calls=calls, hold_max_bytes=nbytes,
                    retry_max_bytes=retry, engines=engines)


def prove(call_id: int, *, priority: int = NORMAL, size: int = 1000, job: str = "") -> Call:
    return Call(call_id, "Prove", size, priority, job or f"porep-1000-{call_id}")


def sent(decisions: list[Decision]) -> dict[int, str]:
    return {d.call: d.engine for d in decisions if isinstance(d, Send)}


def refused(decisions: list[Decision]) -> dict[int, DoorRefusal]:
    return {d.call: d.reason for d in decisions if isinstance(d, Refuse)}


def test_a_call_goes_to_the_admitting_engine_with_the_fewest_in_flight() -> None:
    b = book()
    b.admitting("a", 0.0)
    b.admitting("b", 0.0)
    assert b.arrived(prove(1), 0.0) == [Send(1, "a", retain=True)]  # a tie: by name
    assert sent(b.arrived(prove(2), 0.0)) == {2: "b"}
    assert sent(b.arrived(prove(3), 0.0)) == {3: "a"}
    b.returned(2, 1.0, Outcome.OK)
    b.returned(3, 1.0, Outcome.OK)
    assert sent(b.arrived(prove(4), 1.0)) == {4: "b"}  # a has call 1, b nothing
    assert (b.in_flight("a"), b.in_flight("b")) == (1, 1)


def test_with_no_engine_up_calls_are_held_then_released_critical_high_then_by_arrival() -> None:
    b = book()
    priorities = [NORMAL, LOW, HIGH, CRITICAL, 0, HIGH, CRITICAL, 9]  # 9: no cuzk value
    for call_id, priority in enumerate(priorities, 1):
        assert b.arrived(prove(call_id, priority=priority), float(call_id)) == [
            Hold(call_id, call_id + 600.0)]
    assert (b.held_calls, b.held_bytes) == (8, 8000)
    released = b.admitting("a", 20.0)
    assert [d.call for d in released] == [4, 7, 3, 6, 1, 2, 5, 8]
    assert all(isinstance(d, Send) and d.engine == "a" for d in released)
    assert {d.call: d.held_for for d in released if isinstance(d, Send)}[4] == 16.0
    assert (b.held_calls, b.held_bytes, b.in_flight("a")) == (0, 0, 8)


def test_get_status_and_get_metrics_are_never_held_but_answered_from_the_cache() -> None:
    b = book()
    assert b.arrived(Call(1, "GetStatus", 0), 0.0) == [FromCache(1)]
    assert b.arrived(Call(2, "GetMetrics", 0), 0.0) == [FromCache(2)]
    assert b.arrived(Call(2, "GetMetrics", 0), 0.5) == [FromCache(2)]  # it ended: number free
    assert b.held_calls == 0
    b.admitting("a", 1.0)
    assert b.arrived(Call(3, "GetStatus", 0), 1.0) == [Send(3, "a")]  # kept for no retry
    assert b.returned(3, 1.5, Outcome.BROKEN) == [FromCache(3)]  # its engine was lost under it
    b.arrived(Call(5, "GetStatus", 0), 1.5)
    assert b.gone("a", 1.6, crashed=True) == [FromCache(5)]
    b.admitting("a", 1.7)
    b.stop_admitting("a")
    assert b.arrived(Call(4, "GetMetrics", 0), 2.0) == [FromCache(4)]
    assert b.in_flight("a") == 0


# -- several engines behind one door ----------------------------------------------------------

def test_a_common_door_asks_every_admitting_engine_for_status_metrics_and_srs() -> None:
    b = book(engines=("gpu1", "gpu0"))
    b.admitting("gpu0", 0.0)
    b.admitting("gpu1", 0.0)
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
    b.admitting("a", 0.0)
    assert b.arrived(Call(1, "GetStatus", 0), 0.0) == [Send(1, "a")]
    assert b.arrived(Call(2, "PreloadSRS", 0), 0.0) == [Send(2, "a")]


def test_a_rolling_restart_of_a_common_door_holds_nothing_and_loses_nothing() -> None:
    """gpu0 stops (drained), its process ends, a new one starts; then gpu1 the same. Every
    call meanwhile goes at once to the engine that admits, the drained one's jobs finish."""
    b = book(engines=("gpu0", "gpu1"))
    b.admitting("gpu0", 0.0)
    b.admitting("gpu1", 0.0)
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
        assert b.gone(stopping, 2.0, crashed=False) == []  # drained: nothing to place again
        assert b.arrived(Call(call, "GetStatus", 0), 2.5) == [Broadcast(call, (other,))]
        call += 1
        b.admitting(stopping, 3.0)
        on[stopping] = []


def test_a_common_door_with_every_engine_out_releases_critical_then_high_then_spreads(
        ) -> None:
    b = book(engines=("a", "b"))
    for engine in ("a", "b"):
        b.admitting(engine, 0.0)
        b.stop_admitting(engine)  # both stopping at once (a restart of everything)
    for call_id, priority in enumerate([LOW, NORMAL, HIGH, CRITICAL], 1):
        assert b.arrived(prove(call_id, priority=priority), 1.0) == [
            Hold(call_id, 601.0)]
    released = b.admitting("b", 2.0)
    assert [(d.call, d.engine) for d in released if isinstance(d, Send)] == [
        (4, "b"), (3, "b"), (1, "b"), (2, "b")]
    assert b.admitting("a", 3.0) == []
    # b has the four released: a takes the new calls until they are even, then in turn
    placed = [sent(b.arrived(prove(i), 3.0))[i] for i in range(5, 12)]
    assert placed == ["a", "a", "a", "a", "a", "b", "a"]


def test_a_common_door_with_no_engine_up_caches_reads_and_holds_a_preload_for_every_engine(
        ) -> None:
    b = book(engines=("a", "b"))
    assert b.arrived(Call(1, "GetStatus", 0), 0.0) == [FromCache(1)]
    assert b.arrived(Call(2, "PreloadSRS", 40), 0.0) == [Hold(2, 600.0)]
    assert b.arrived(prove(3, priority=CRITICAL), 1.0) == [Hold(3, 601.0)]
    assert b.admitting("b", 5.0) == [Send(3, "b", retain=True, held_for=4.0),
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
    assert [d.call for d in b.admitting("a", 3.0)] == [5, 1, 2]


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
    assert b.held_calls == 0 and b.admitting("a", 5.0) == []
    assert b.returned(1, 6.0, Outcome.OK) == []  # ended already: nothing more


def test_a_late_report_of_a_replaced_attempt_does_not_end_the_held_call() -> None:
    b = book()
    b.admitting("a", 0.0)
    b.arrived(prove(1), 0.0)
    assert b.gone("a", 1.0, crashed=True) == [Hold(1, 601.0, DoorRetry.CRASH)]
    assert b.returned(1, 1.5, Outcome.BROKEN) == []  # the attempt on a's ended process
    assert b.held_calls == 1
    assert sent(b.admitting("a", 2.0)) == {1: "a"}


def submit(call_id: int, job: str, *, size: int = 1000) -> Call:
    return Call(call_id, "SubmitProof", size, NORMAL, job)


def await_(call_id: int, job: str) -> Call:
    return Call(call_id, "AwaitProof", 10, 0, job)


def test_a_drain_sees_zero_in_flight_only_once_every_call_and_job_of_the_engine_returned() -> None:
    b = book()
    b.admitting("a", 0.0)
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
    assert b.gone("a", 7.0, crashed=False) == []
    assert sent(b.admitting("a", 8.0)) == {3: "a"}


def test_an_await_of_a_job_no_engine_holds_is_not_found() -> None:
    b = book()
    b.admitting("a", 0.0)
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
    b.admitting("b", 2.0)
    b.admitting("a", 2.0)  # fewer in flight than b after the release: the job stays on b
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
    b.admitting("a", 0.0)
    b.admitting("b", 0.0)
    b.arrived(submit(1, ""), 0.0)
    b.arrived(prove(2), 0.0)  # on b
    b.returned(1, 1.0, Outcome.OK, job="uuid-1")
    assert b.in_flight("a") == 1
    assert b.arrived(await_(3, "uuid-1"), 2.0) == [Send(3, "a")]


def test_a_failed_submit_leaves_no_job_behind() -> None:
    b = book()
    b.admitting("a", 0.0)
    b.arrived(submit(1, "j"), 0.0)
    assert b.arrived(await_(2, "j"), 0.0) == [Send(2, "a")]  # pipelined: the submit is on a
    b.returned(1, 1.0, Outcome.ERROR)
    b.returned(2, 1.0, Outcome.ERROR)  # cuzk's NOT_FOUND
    assert b.in_flight("a") == 0
    assert refused(b.arrived(await_(3, "j"), 2.0)) == {3: DoorRefusal.UNKNOWN_JOB}


def test_a_crash_sends_a_retained_prove_once_more_and_a_second_crash_fails_it() -> None:
    b = book()
    b.admitting("a", 0.0)
    b.admitting("b", 0.0)
    assert b.arrived(prove(1, size=50 * MiB), 0.0) == [Send(1, "a", retain=True)]
    assert b.retained_bytes == 50 * MiB
    assert b.gone("a", 5.0, crashed=True) == [Send(1, "b", retry=DoorRetry.CRASH)]
    assert b.retained_bytes == 0  # sent the last time: its bytes may go
    assert (b.in_flight("a"), b.in_flight("b")) == (0, 1)
    [refusal] = b.gone("b", 6.0, crashed=True)
    assert isinstance(refusal, Refuse) and refusal.reason is DoorRefusal.ENGINE_LOST
    assert "ended under the call again" in refusal.message
    assert b.in_flight("b") == 0


def test_a_crash_with_no_other_engine_holds_the_retry_for_the_next_process() -> None:
    b = book(hold_timeout=600.0)
    b.admitting("a", 0.0)
    b.arrived(prove(1, priority=LOW), 0.0)
    b.arrived(prove(2, priority=HIGH), 1.0)
    assert b.gone("a", 10.0, crashed=True) == [Hold(1, 610.0, DoorRetry.CRASH),
                                                Hold(2, 610.0, DoorRetry.CRASH)]
    b.arrived(prove(3, priority=HIGH), 11.0)
    released = b.admitting("a", 40.0)
    assert [(d.call, d.held_for, d.retry) for d in released if isinstance(d, Send)] == [
        (2, 30.0, None), (3, 29.0, None), (1, 30.0, None)]  # a retry is counted on its Hold
    # HIGH first, then arrival order (a retry keeps its place)
    assert b.retained_bytes == 1000  # call 3's only: 1 and 2 are on their last sending


def test_a_crash_fails_what_cannot_be_sent_again_and_forgets_the_jobs_it_had() -> None:
    b = book(retry=1500)
    b.admitting("a", 0.0)
    assert b.arrived(prove(1), 0.0) == [Send(1, "a", retain=True)]
    assert b.arrived(prove(2), 0.0) == [Send(2, "a", retain=False)]  # over retry_max_bytes
    b.arrived(Call(3, "PreloadSRS", 20), 0.0)
    b.arrived(submit(4, "j"), 0.0)  # over the retry bound too
    b.returned(4, 1.0, Outcome.OK)
    b.arrived(await_(5, "j"), 1.0)
    decisions = b.gone("a", 2.0, crashed=True)
    assert refused(decisions) == {2: DoorRefusal.RETRY_FULL, 3: DoorRefusal.ENGINE_LOST,
                                  5: DoorRefusal.ENGINE_LOST}
    assert [d for d in decisions if isinstance(d, Hold)] == [Hold(1, 602.0, DoorRetry.CRASH)]
    b.admitting("a", 3.0)
    assert refused(b.arrived(await_(6, "j"), 3.0)) == {6: DoorRefusal.UNKNOWN_JOB}


def test_a_job_its_engine_had_when_it_crashed_is_unknown_to_the_next_process() -> None:
    b = book()
    b.admitting("a", 0.0)
    b.arrived(submit(1, "j"), 0.0)
    b.returned(1, 1.0, Outcome.OK)
    assert b.gone("a", 2.0, crashed=True) == []
    b.admitting("a", 3.0)
    assert refused(b.arrived(await_(2, "j"), 3.0)) == {2: DoorRefusal.UNKNOWN_JOB}


def test_a_failed_proof_is_an_ordinary_return_and_never_sent_again() -> None:
    b = book()
    b.admitting("a", 0.0)
    b.arrived(prove(1), 0.0)
    assert b.returned(1, 1.0, Outcome.OK) == []  # whatever its status: FAILED included
    assert b.retained_bytes == 0 and b.in_flight("a") == 0
    assert b.gone("a", 2.0, crashed=True) == []


def test_a_broken_call_goes_to_another_process_never_back_to_the_one_that_broke_it() -> None:
    b = book()
    b.admitting("a", 0.0)
    b.arrived(submit(1, "j"), 0.0)
    b.arrived(prove(2), 0.0)
    assert b.returned(1, 1.0, Outcome.BROKEN) == [Hold(1, 601.0, DoorRetry.BROKEN)]
    assert b.in_flight("a") == 1
    assert b.arrived(await_(5, "j"), 1.0) == [Hold(5, 601.0)]  # follows its submit, not to a
    assert sent(b.arrived(prove(3), 2.0)) == {3: "a"}  # others still go to a
    assert b.gone("a", 3.0, crashed=True)[0] == Hold(2, 603.0, DoorRetry.CRASH)
    assert sent(b.admitting("a", 30.0)) == {1: "a", 2: "a", 3: "a", 5: "a"}  # a's next one
    b.returned(1, 31.0, Outcome.OK)
    assert b.arrived(await_(4, "j"), 31.0) == [Send(4, "a")]


def test_a_job_goes_where_its_broken_submit_is_sent_again() -> None:
    b = book()
    b.admitting("a", 0.0)
    b.arrived(submit(1, "j"), 0.0)
    b.returned(1, 1.0, Outcome.OK)
    b.admitting("b", 1.0)
    assert b.arrived(submit(2, "j"), 2.0) == [Send(2, "a", retain=True)]  # a has the job
    assert b.returned(2, 3.0, Outcome.BROKEN) == [Send(2, "b", retry=DoorRetry.BROKEN)]
    assert (b.in_flight("a"), b.in_flight("b")) == (0, 1)  # a's drain does not wait for it
    b.returned(2, 4.0, Outcome.OK)
    assert b.arrived(await_(3, "j"), 5.0) == [Send(3, "b")]


def test_a_broken_call_moves_to_another_engine_at_once_when_one_admits() -> None:
    b = book()
    b.admitting("a", 0.0)
    b.admitting("b", 0.0)
    b.arrived(prove(1), 0.0)
    assert b.returned(1, 1.0, Outcome.BROKEN) == [Send(1, "b", retry=DoorRetry.BROKEN)]
    assert refused(b.returned(1, 2.0, Outcome.BROKEN)) == {1: DoorRefusal.ENGINE_LOST}


def test_shutdown_refuses_the_held_and_the_new_but_lets_jobs_be_collected() -> None:
    b = book()
    b.admitting("a", 0.0)
    b.arrived(submit(1, "j"), 0.0)
    b.returned(1, 1.0, Outcome.OK)
    b.arrived(prove(2), 1.0)  # in flight: the drain's to wait for
    b.stop_admitting("a")
    b.arrived(prove(3), 2.0)
    b.arrived(prove(4, priority=CRITICAL), 2.0)
    decisions = b.shutting_down(3.0)
    assert [(d.call, d.reason, d.held_for) for d in decisions if isinstance(d, Refuse)] == [
        (4, DoorRefusal.SHUTTING_DOWN, 1.0), (3, DoorRefusal.SHUTTING_DOWN, 1.0)]
    assert refused(b.arrived(prove(5), 4.0)) == {5: DoorRefusal.SHUTTING_DOWN}
    assert refused(b.arrived(Call(6, "GetStatus", 0), 4.0)) == {6: DoorRefusal.SHUTTING_DOWN}
    assert b.arrived(await_(7, "j"), 4.0) == [Send(7, "a")]
    b.returned(7, 5.0, Outcome.OK)
    b.returned(2, 5.0, Outcome.OK)
    assert b.in_flight("a") == 0


def test_a_retry_due_during_shutdown_is_refused() -> None:
    b = book()
    b.admitting("a", 0.0)
    b.arrived(prove(1), 0.0)
    b.stop_admitting("a")
    b.shutting_down(1.0)
    assert refused(b.gone("a", 2.0, crashed=False)) == {1: DoorRefusal.SHUTTING_DOWN}


# -- every call accounted for exactly once, through crashes -----------------------------------

METHODS = ["Prove"] * 12 + ["SubmitProof", "AwaitProof", "CancelProof", "GetStatus",
                            "PreloadSRS"]
OUTCOMES = [Outcome.OK] * 6 + [Outcome.ERROR, Outcome.CANCELLED, Outcome.BROKEN]


@dataclass
class Shell:
    """The door's shell as the book sees it: carries decisions out and checks each one."""

    book: DoorBook
    #: call -> the engine it is on, or "held"
    where: dict[int, str] = field(default_factory=dict)
    until: dict[int, float] = field(default_factory=dict)
    sendings: Counter[int] = field(default_factory=Counter)
    endings: Counter[int] = field(default_factory=Counter)
    jobs: dict[str, str] = field(default_factory=dict)
    #: every refusal and retry reason seen
    reasons: set[DoorRefusal | DoorRetry] = field(default_factory=set)

    def carry_out(self, decisions: list[Decision]) -> None:
        for d in decisions:
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
            else:
                self.end(d.call)
        b = self.book
        limits = self.book.limits
        assert b.held_calls <= limits.hold_max_calls and b.held_bytes <= limits.hold_max_bytes
        assert 0 <= b.retained_bytes <= limits.retry_max_bytes
        assert b.held_calls == sum(place == "held" for place in self.where.values())

    def end(self, call_id: int) -> None:
        self.endings[call_id] += 1
        self.where.pop(call_id, None)

    def on(self, engine: str) -> list[int]:
        return sorted(c for c, place in self.where.items() if place == engine)


@pytest.mark.parametrize("behind_one_door", [(), ("a", "b")],
                         ids=["two doors' worth", "one door for both"])
def test_ten_thousand_calls_through_two_crashing_engines_each_end_exactly_once(
        behind_one_door: tuple[str, ...]) -> None:
    rng = random.Random(25)
    b = book(hold_timeout=30.0, calls=40, nbytes=40_000, retry=30_000, engines=behind_one_door)
    shell = Shell(b)
    engines = {"a": False, "b": False}  # admitting?
    calls: dict[int, Call] = {}
    now = 0.0
    for call_id in range(1, 10_001):
        now += rng.expovariate(4.0)
        shell.carry_out(b.expired(now))
        assert all(shell.until[c] > now for c, p in shell.where.items() if p == "held")
        method = rng.choice(METHODS)
        job = (rng.choice(list(shell.jobs) or ["none"]) if method in FOLLOW_JOB
               else f"job-{call_id}")
        calls[call_id] = call = Call(call_id, method, rng.randint(0, 3000), rng.randint(0, 4),
                                     job)
        shell.carry_out(b.arrived(call, now))
        for _ in range(rng.randint(0, 2)):  # engines answer some calls
            engine = rng.choice(list(engines))
            if on := shell.on(engine):
                answered = rng.choice(on)
                outcome = rng.choice(OUTCOMES)
                if outcome is not Outcome.BROKEN:
                    shell.end(answered)
                    if calls[answered].method == "SubmitProof" and outcome is Outcome.OK:
                        shell.jobs[calls[answered].job] = engine
                shell.carry_out(b.returned(answered, now, outcome))
        if (held := shell.on("held")) and rng.random() < 0.02:  # a caller gives up
            shell.carry_out(b.returned(rng.choice(held), now, Outcome.CANCELLED))
        roll, engine = rng.random(), rng.choice(list(engines))
        if roll < 0.01:  # the process ends: crashed, or after its stop
            shell.carry_out(b.gone(engine, now, crashed=rng.random() < 0.7))
            assert shell.on(engine) == [] and b.in_flight(engine) == 0
            engines[engine] = False
            shell.jobs = {j: e for j, e in shell.jobs.items() if e != engine}
        elif roll < 0.02 and not engines[engine]:
            engines[engine] = True
            shell.carry_out(b.admitting(engine, now))
        elif roll < 0.025:
            b.stop_admitting(engine)
            engines[engine] = False
        for engine in engines:
            assert b.in_flight(engine) >= len(shell.on(engine))
    shell.carry_out(b.shutting_down(now))
    calls[0] = Call(0, "Prove", 10, CRITICAL, "late")
    late = b.arrived(calls[0], now)
    assert refused(late) == {0: DoorRefusal.SHUTTING_DOWN}
    shell.carry_out(late)
    for engine in engines:  # the shutdown's drain: the engines answer everything they have
        for call_id in shell.on(engine):
            shell.end(call_id)
            shell.carry_out(b.returned(call_id, now, Outcome.OK))
        shell.carry_out(b.gone(engine, now, crashed=False))
    assert set(shell.endings) == set(calls)
    assert set(shell.endings.values()) == {1}
    assert shell.where == {} and b.held_calls == b.held_bytes == b.retained_bytes == 0
    assert sum(n == 2 for n in shell.sendings.values()) > 50  # retries did happen
    assert shell.reasons == {*DoorRefusal, *DoorRetry}  # each word is a decision the book makes


@pytest.mark.parametrize("crashed, why", [(True, DoorRetry.CRASH), (False, DoorRetry.STOP)])
def test_the_retry_says_whether_the_engine_crashed_or_was_stopped(crashed: bool,
                                                                   why: DoorRetry) -> None:
    b = book()
    b.admitting("a", 0.0)
    b.admitting("b", 0.0)
    b.arrived(prove(1), 0.0)
    assert b.gone("a", 1.0, crashed=crashed) == [Send(1, "b", retry=why)]
