"""Retries that harm no one, and one request id for one proof: after a crash the calls that
were in flight are suspects, sent again one at a time per engine, so a poison request costs
at most two crashes and no innocent call; a request id in flight is the door's once."""

from __future__ import annotations

from support.door_calls import CRITICAL, CURIO_RULES, book, prove, refused, sent, submit

from cuzkd.states import DoorRefusal
from cuzkd.supervisor.core.doorbook import (
    Call,
    Code,
    DoorRules,
    Echo,
    EngineEnd,
    Hold,
    HoldCause,
    Join,
    Outcome,
    Quarantine,
    Quarantined,
    Refuse,
    Send,
    Withdrawn,
)

CRASHED = EngineEnd.CRASHED
RULES = DoorRules(deadlines=CURIO_RULES.deadlines, allowances=CURIO_RULES.allowances,
                  quarantine=600.0)


# -- 5. suspects -------------------------------------------------------------------------------

def test_after_a_crash_each_suspect_is_sent_again_with_no_other_suspect_beside_it() -> None:
    b = book(rules=RULES)
    b.admit("a", 0.0)
    for call_id in (1, 2, 3):
        b.arrived(prove(call_id), 0.0)
    b.gone("a", 10.0, CRASHED)
    released = b.admit("a", 40.0)
    assert sent(released) == {1: "a"}
    assert sent(b.arrived(prove(4), 41.0)) == {4: "a"}  # a fresh call shares the engine
    assert b.held_calls == 2
    assert sent(b.returned(1, 50.0, Outcome.OK)) == {2: "a"}  # innocent: the next goes
    assert sent(b.returned(2, 60.0, Outcome.OK)) == {3: "a"}


def test_suspects_waiting_their_turn_are_held_as_such_and_not_refused_for_the_hold_timeout(
        ) -> None:
    b = book(rules=RULES, hold_timeout=60.0)
    b.admit("a", 0.0)
    b.arrived(prove(1), 0.0)
    b.arrived(prove(2), 0.0)
    b.gone("a", 1.0, CRASHED)
    b.admit("a", 2.0)
    assert b.expired(61.0) == [Hold(2, 121.0, cause=HoldCause.SUSPECT)]


def test_a_poison_request_costs_two_crashes_and_no_innocent_call() -> None:
    """Crash 1: the poison and two innocent PoReps in flight, all suspects. The poison goes
    again alone among suspects (a fresh call beside it) and crashes the engine again: its id
    is quarantined, the crash that made the others suspects is explained, they and the fresh
    call go at once, and the caller's re-sends are refused without reaching the engine."""
    b = book(rules=RULES)
    b.admit("a", 0.0)
    b.arrived(prove(1, job="porep-1-666"), 0.0)  # the poison
    b.arrived(prove(2, job="porep-1-2"), 0.0)
    b.arrived(prove(3, job="porep-1-3"), 0.0)
    b.gone("a", 5.0, CRASHED)  # crash 1
    assert sent(b.admit("a", 10.0)) == {1: "a"}
    assert sent(b.arrived(prove(4, job="porep-1-4"), 11.0)) == {4: "a"}
    decisions = b.gone("a", 15.0, CRASHED)  # crash 2
    assert decisions[0] == Quarantined(1, "porep-1-666", "a", 615.0)
    [refusal] = [d for d in decisions if isinstance(d, Refuse)]
    assert (refusal.call, refusal.reason, refusal.code) == (
        1, DoorRefusal.QUARANTINED, Code.FAILED_PRECONDITION)
    assert "'porep-1-666' is quarantined" in refusal.message
    assert "cuzkd door release" in refusal.message
    assert sent(b.admit("a", 20.0)) == {2: "a", 3: "a", 4: "a"}  # none a suspect now
    for again in (5, 6, 7, 8):  # the caller sends it again and again
        assert refused(b.arrived(prove(again, job="porep-1-666"), 21.0)) == {
            again: DoorRefusal.QUARANTINED}
    assert b.in_flight("a") == 3
    assert b.quarantined(21.0) == [Quarantine("porep-1-666", "a", 15.0, 615.0)]


def test_a_quarantine_ends_after_its_time_or_when_released() -> None:
    b = book(rules=RULES)
    b.admit("a", 0.0)
    b.arrived(prove(1, job="bad"), 0.0)
    b.gone("a", 1.0, CRASHED)
    b.admit("a", 2.0)
    b.gone("a", 3.0, CRASHED)
    b.admit("a", 4.0)
    assert refused(b.arrived(prove(2, job="bad"), 602.9)) == {2: DoorRefusal.QUARANTINED}
    assert sent(b.arrived(prove(3, job="bad"), 603.0)) == {3: "a"}
    b.gone("a", 604.0, CRASHED)
    b.admit("a", 605.0)
    b.gone("a", 606.0, CRASHED)
    assert [q.job for q in b.quarantined(607.0)] == ["bad"]
    assert b.release_quarantine("bad") and not b.release_quarantine("bad")
    b.admit("a", 608.0)
    assert sent(b.arrived(prove(4, job="bad"), 608.0)) == {4: "a"}


def test_an_oom_kill_and_cuzkd_s_own_kills_make_no_suspects() -> None:
    for end in (EngineEnd.OOM_KILLED, EngineEnd.STOPPED, EngineEnd.DRAINED):
        b = book(rules=RULES)
        b.admit("a", 0.0)
        b.arrived(prove(1), 0.0)
        b.arrived(prove(2), 0.0)
        b.gone("a", 1.0, end)
        assert sent(b.admit("a", 2.0)) == {1: "a", 2: "a"}, end


def test_a_lone_suspect_without_request_id_is_lost_not_quarantined() -> None:
    b = book(rules=RULES)
    b.admit("a", 0.0)
    b.arrived(Call(1, "Prove", 10, 2, "", "porep-c2"), 0.0)
    b.gone("a", 1.0, CRASHED)
    b.admit("a", 2.0)
    assert refused(b.gone("a", 3.0, CRASHED)) == {1: DoorRefusal.ENGINE_LOST}
    assert b.quarantined(3.0) == []


def test_suspects_spread_over_a_shared_door_s_engines() -> None:
    b = book(rules=RULES, engines=("a", "b"))
    b.admit("a", 0.0)
    b.arrived(prove(1), 0.0)
    b.arrived(prove(2), 0.0)
    b.admit("b", 0.5)
    assert sent(b.gone("a", 1.0, CRASHED)) == {1: "b"}  # 2 waits: b has a suspect
    assert sent(b.admit("a", 2.0)) == {2: "a"}
    assert b.returned(1, 3.0, Outcome.OK) == []


# -- 7. one request id, one proof ------------------------------------------------------------

def test_the_same_call_twice_is_proved_once_and_both_callers_get_the_answer() -> None:
    b = book(rules=RULES, engines=("a", "b"))
    b.admit("a", 0.0)
    b.admit("b", 0.0)
    assert sent(b.arrived(prove(1, job="porep-1-9", request=b"same"), 0.0)) == {1: "a"}
    assert b.arrived(prove(2, job="porep-1-9", request=b"same"), 0.1) == [Join(2, 1)]
    assert b.in_flight("a") == 1 and b.in_flight("b") == 0  # proved once
    assert b.returned(1, 5.0, Outcome.OK) == [Echo(2, 1)]
    assert b.returned(2, 5.0, Outcome.OK) == []  # it ended with the echo
    assert sent(b.arrived(prove(3, job="porep-1-9", request=b"same"), 6.0)) == {3: "a"}


def test_the_same_request_id_with_other_bytes_is_refused_already_exists() -> None:
    b = book(rules=RULES)
    b.admit("a", 0.0)
    b.arrived(prove(1, job="porep-1-9", request=b"one"), 0.0)
    [refusal] = b.arrived(prove(2, job="porep-1-9", request=b"two"), 0.1)
    assert isinstance(refusal, Refuse)
    assert (refusal.reason, refusal.code) == (DoorRefusal.ALREADY_EXISTS, Code.ALREADY_EXISTS)
    assert "'porep-1-9' is in flight behind cuzkd's door already" in refusal.message
    [refusal] = b.arrived(submit(3, "porep-1-9"), 0.2)  # another method: other bytes
    assert isinstance(refusal, Refuse) and refusal.reason is DoorRefusal.ALREADY_EXISTS
    assert b.in_flight("a") == 1


def test_a_joined_call_is_refused_with_its_leader() -> None:
    b = book(rules=RULES)
    b.arrived(prove(1, priority=CRITICAL, job="winpost-1", request=b"w"), 0.0)
    assert b.arrived(prove(2, priority=CRITICAL, job="winpost-1", request=b"w"), 1.0) == [
        Join(2, 1)]
    assert refused(b.expired(15.0)) == {1: DoorRefusal.DEADLINE, 2: DoorRefusal.DEADLINE}
    assert b.held_calls == 0


def test_when_the_leader_s_caller_leaves_the_next_caller_leads() -> None:
    b = book(rules=RULES)
    b.admit("a", 0.0)
    b.arrived(prove(1, job="j", request=b"r"), 0.0)
    b.arrived(prove(2, job="j", request=b"r"), 0.0)
    b.arrived(prove(3, job="j", request=b"r"), 0.0)
    assert b.returned(1, 1.0, Outcome.CANCELLED) == [Send(2, "a", retain=True)]
    assert b.returned(2, 2.0, Outcome.OK) == [Echo(3, 2)]


def test_a_held_leader_withdrawn_hands_its_place_to_its_follower() -> None:
    b = book(rules=RULES)
    b.arrived(prove(1, job="j", request=b"r"), 0.0)
    b.arrived(prove(2, job="j", request=b"r"), 0.0)
    decisions = b.returned(1, 1.0, Outcome.CANCELLED)
    assert decisions == [Withdrawn(1, 1.0), Hold(2, 601.0)]
    assert b.held_calls == 1


def test_a_follower_s_caller_leaving_changes_nothing_for_the_leader() -> None:
    b = book(rules=RULES)
    b.admit("a", 0.0)
    b.arrived(prove(1, job="j", request=b"r"), 0.0)
    b.arrived(prove(2, job="j", request=b"r"), 0.0)
    assert b.returned(2, 1.0, Outcome.CANCELLED) == []
    assert b.returned(1, 2.0, Outcome.OK) == []


def test_a_call_whose_link_broke_on_a_process_that_then_crashed_is_a_suspect_too() -> None:
    """The call saw its link go before the reaper saw the exit: the crash is its too, so it is
    not sent beside the other suspects of that crash, and a poison among them is found."""
    b = book(rules=RULES)
    b.admit("a", 0.0)
    b.arrived(prove(1, job="porep-1-666"), 0.0)
    b.arrived(prove(2), 0.0)
    assert isinstance(b.returned(1, 1.0, Outcome.BROKEN)[0], Hold)  # held for a next process
    b.gone("a", 1.1, CRASHED)
    assert sent(b.admit("a", 2.0)) == {1: "a"}  # two suspects: one at a time
    assert b.held_calls == 1
