"""The door keeps deadlines, end to end: a real ``cuzkd run`` in front of the cuzk stand-in
(which loses a PoSt queued beside another, as cuzk does), callers dialling the door as Curio
does.

One supervisor for the module, one engine behind its door; the stand-in's knobs make some
request ids special: ``porep-poison`` crashes the engine each time it is proved,
``porep-busy`` is answered UNAVAILABLE by the live engine itself, ``porep-never`` is accepted
and never answered. Every wait is on an event (a call's end, a log event, a state), never a
sleep.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import grpc
import pytest
from support.cuzk_harness import cuzk_engine
from support.door_under_test import Door, prove_later
from support.supervisor_harness import start_supervisor, write_config
from support.waiting import wait_until

from cuzkd.cuzk import proving_pb2 as pb

#: a PoRep C2 job in ~2.3 s (long enough to drain for), a PoSt in 0.3 s
KNOBS = {"CUZK_STANDIN_SYNTH_SECS": "2", "CUZK_STANDIN_GPU_SECS": "0.05",
         "CUZK_STANDIN_POST_SECS": "0.3", "CUZK_STANDIN_NVIDIA_SMI_SECS": "0",
         "CUZK_STANDIN_CRASH_ON": "porep-poison", "CUZK_STANDIN_UNAVAILABLE": "porep-busy",
         "CUZK_STANDIN_NEVER_ANSWER": "porep-never"}
COMPLETED = pb.AwaitProofResponse.COMPLETED


@pytest.fixture(scope="module")
def door(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Door]:
    tmp = tmp_path_factory.mktemp("deadlines")
    table, address = cuzk_engine(tmp, "cz", env=KNOBS, door="", backoff_initial="100ms",
                                 stop_timeout="2s", drain_timeout="60s")
    # the stand-in proves a PoSt in 0.3 s: 1 s of allowance fits any drain
    sup = start_supervisor(write_config(
        tmp, [table], supervisor={"shutdown_grace": "5s"},
        door={"proving_allowance": {"winning-post": "1s", "window-post": "1s"}}))
    try:
        yield Door(tmp, sup, address)
    finally:
        sup.stop()


class Restart(threading.Thread):
    """``POST /v1/engines/cz/restart`` in a thread: it answers once the new process runs."""

    def __init__(self, door: Door) -> None:
        super().__init__(daemon=True)
        self._door = door
        self.answered: float | None = None
        self.status: int | None = None

    def run(self) -> None:
        self.status, _ = self._door.sup.request("POST", "/v1/engines/cz/restart", timeout=120)
        self.answered = time.monotonic()


def test_a_winning_post_sent_during_a_restart_is_proved_by_the_draining_engine(
        door: Door) -> None:
    """A PoRep holds the restart's drain for seconds; a WinningPoSt sent meanwhile goes to the
    draining engine at once and is proved in its own time, not after the drain. (The process
    has proved a PoRep before: a fresh one keeps PoSts away from its first PoRep's partition
    0, which shares their GPU queue key -- tests/supervisor/core/test_doorbook_deadlines.py.)"""
    pid = door.running()
    with door.channel() as channel:
        assert prove_later(channel, "porep-c2", "porep-1000-0").result(30).result.status \
            == COMPLETED
        porep = prove_later(channel, "porep-c2", "porep-1000-1")
        wait_until(lambda: door.said("proof job started", "porep-1000-1"), 10,
                   "the PoRep on the engine")
        restart = Restart(door)
        restart.start()
        wait_until(lambda: door.sup.events("engine_drain_requested", pid=pid), 20, "the drain")
        sent = time.monotonic()
        winning = prove_later(channel, "winning-post", "winpost-1000-ab12").result(20)
        proved = time.monotonic()
        restart.join(60)
        assert porep.result(30).result.status == COMPLETED
    assert winning.result.status == COMPLETED
    assert proved - sent < 2.0, "the WinningPoSt waited"
    assert restart.status == 200 and restart.answered is not None
    assert proved < restart.answered, "it waited for the new process"
    assert door.running() != pid
    assert [d["result"] for d in door.sup.events("engine_drained", pid=pid)] == ["clean"]


def test_a_call_cuzk_will_never_answer_does_not_hold_a_restart_to_its_drain_timeout(
        door: Door) -> None:
    """cuzk dropped the call (accepted, never answered): the drain stops waiting for it two
    status reads after the engine shows it no longer has it, not at drain_timeout (60 s)."""
    pid = door.running()
    with door.channel() as channel:
        never = prove_later(channel, "porep-c2", "porep-never", timeout=120)
        wait_until(lambda: door.said("proof request queued", "porep-never"), 10,
                   "the call on the engine")
        asked = time.monotonic()
        status, body = door.sup.request("POST", "/v1/engines/cz/restart", timeout=120)
        took = time.monotonic() - asked
        never.cancel()
    assert status == 200, body
    assert took < 15, f"the restart took {took:.1f} s: the drain waited for the dropped call"
    abandoned = door.sup.events("door_drain_abandoned", engine="cz")
    assert [(a["reason"], a["request_id"]) for a in abandoned] == [("not_listed",
                                                                     "porep-never")]
    assert [d["result"] for d in door.sup.events("engine_drained", pid=pid)] == ["clean"]


def test_an_engines_own_unavailable_is_its_answer_not_a_broken_link(door: Door) -> None:
    """A live engine answers UNAVAILABLE: relayed at once, not held for a next process that
    never comes; the engine is not touched."""
    pid = door.running()
    retries = len(door.sup.events("door_retry_deferred") + door.sup.events("door_call_retried"))
    with door.channel() as channel:
        asked = time.monotonic()
        with pytest.raises(grpc.RpcError) as busy:
            prove_later(channel, "porep-c2", "porep-busy").result(30)
        took = time.monotonic() - asked
    assert busy.value.code() is grpc.StatusCode.UNAVAILABLE
    assert "proving engine busy" in busy.value.details()
    assert took < 5.0
    assert door.running() == pid
    assert len(door.sup.events("door_retry_deferred")
               + door.sup.events("door_call_retried")) == retries


def test_posts_go_to_a_cuzk_one_at_a_time_and_none_is_lost(door: Door) -> None:
    """Four PoSts at once: cuzk's two GPU workers would take two, and the fourth would
    overwrite the third in its GPU queue (a Prove that never returns). The door sends them one
    at a time, WinningPoSt first; every one is proved."""
    door.running()
    with door.channel() as channel:
        calls = [prove_later(channel, "window-post", f"wdpost-1000-[{i} 0] dl 7")
                 for i in range(3)]
        calls.append(prove_later(channel, "winning-post", "winpost-1000-cd34"))
        replies = [call.result(20) for call in calls]
    assert [r.result.status for r in replies] == [COMPLETED] * 4
    waits = door.sup.events("door_call_refused")
    assert not [w for w in waits if w["reason"] == "deadline"]


def test_a_poison_request_costs_two_crashes_and_no_innocent_call(door: Door) -> None:
    """The poison and two innocent PoReps are in flight when it crashes the engine: the three
    are suspects, sent again one at a time; the poison goes first, crashes the engine alone
    and is quarantined, the innocents are proved. Its caller sends it again and again: refused
    without reaching the engine. ``cuzkd status`` lists it; ``cuzkd door release`` ends it."""
    door.running()
    crashes = len(door.sup.events("engine_exit_unexpected"))
    with door.channel() as channel:
        poison = prove_later(channel, "porep-c2", "porep-poison")
        innocent = [prove_later(channel, "porep-c2", f"porep-1000-{i}") for i in (7, 8)]
        with pytest.raises(grpc.RpcError) as quarantined:
            poison.result(60)
        again = []
        for _ in range(3):
            with pytest.raises(grpc.RpcError) as refused:
                prove_later(channel, "porep-c2", "porep-poison").result(10)
            again.append(refused.value.code())
        assert [call.result(60).result.status for call in innocent] == [COMPLETED] * 2
    assert quarantined.value.code() is grpc.StatusCode.FAILED_PRECONDITION
    assert "'porep-poison' is quarantined" in quarantined.value.details()
    assert again == [grpc.StatusCode.FAILED_PRECONDITION] * 3
    exits = door.sup.events("engine_exit_unexpected")[crashes:]
    assert [e["cause"] for e in exits] == ["signal_SIGSEGV"] * 2
    [event] = door.sup.events("door_request_quarantined")
    assert event["request_id"] == "porep-poison"
    assert "quarantined: 'porep-poison' (door cz, crashed engine cz" in door.cli("status")
    assert door.cli("door", "release", "porep-poison").startswith("released 'porep-poison'")
    assert "quarantined" not in door.cli("door")
