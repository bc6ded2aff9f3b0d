"""The front door end to end: a real ``cuzkd run`` serving Curio's address in front of the cuzk
stand-in, callers dialling the door as Curio does.

One supervisor for the module (the shutdown test, last, ends it): the stand-in's TOML says
``[daemon] listen`` at the door's address, cuzkd starts it with ``--listen`` on its private
socket. Every wait is on an event (a call's end, a log event, a state), never a sleep.
"""

from __future__ import annotations

import os
import signal
import time
from collections import Counter
from collections.abc import Iterator

import grpc
import pytest
from support.cuzk_harness import LoadThread, cuzk_engine
from support.door_under_test import MIB, SERVICE, Door, prove_later, prove_request
from support.supervisor_harness import start_supervisor, write_config
from support.waiting import wait_until

from cuzkd.cuzk import proving_pb2 as pb

#: a PoRep C2 job in 0.45 s, a PoSt in 3 s: long enough to be caught in flight, and to outlast
#: the shutdown test's steps on a loaded machine (a drain that ends before its WinningPoSt is
#: sent leaves no draining engine to prove it)
KNOBS = {"CUZK_STANDIN_SYNTH_SECS": "0.2", "CUZK_STANDIN_GPU_SECS": "0.05",
         "CUZK_STANDIN_POST_SECS": "3"}
@pytest.fixture(scope="module")
def door(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Door]:
    tmp = tmp_path_factory.mktemp("door")
    table, address = cuzk_engine(tmp, "cz", env=KNOBS, door="", backoff_initial="100ms",
                                 stop_timeout="1s", drain_timeout="15s")
    # a PoSt of the stand-in is proved in 3 s: 4 s of allowance fit a drain
    sup = start_supervisor(write_config(tmp, [table], supervisor={"shutdown_grace": "20s"},
                                        door={"proving_allowance": {"winning-post": "4s",
                                                                    "window-post": "4s"}}))
    try:
        yield Door(tmp, sup, address)
    finally:
        sup.stop()


def engine_holds(channel: grpc.Channel, job_id: str) -> bool:
    """The engine's GetStatus, through the door, names ``job_id`` on a GPU."""
    status = channel.unary_unary(SERVICE + "GetStatus",
                                 request_serializer=pb.GetStatusRequest.SerializeToString,
                                 response_deserializer=pb.GetStatusResponse.FromString)
    reply = status(pb.GetStatusRequest(), timeout=10)
    return any(gpu.current_job_id == job_id for gpu in reply.gpus)


def test_a_restart_under_load_fails_no_call_and_loses_no_proof(door: Door) -> None:
    """Curio-like callers keep four jobs in flight through a ``cuzkd restart``: the stop
    drains through the door (no call in flight when SIGTERM goes), the calls sent meanwhile
    wait in the door, and every call completes."""
    pid = door.running()
    load = LoadThread(door.address, ["porep-c2", "snap-update"], lambda load: load.steady(4))
    try:
        wait_until(lambda: sum(s.outcome == "completed" for s in load.sent) >= 2, 30,
                   "calls completed before the restart")
        restarted = time.monotonic()
        status, body = door.sup.request("POST", "/v1/engines/cz/restart", timeout=60)
        assert status == 200, body
        assert door.running() != pid
        wait_until(lambda: sum(s.outcome == "completed" and s.sent > restarted
                               for s in load.sent) >= 2, 30, "calls completed after it")
    finally:
        sent = load.stop()
    outcomes = Counter(s.outcome for s in sent if s.outcome)  # "": cancelled at the end
    assert set(outcomes) == {"completed"}, outcomes
    assert any(s.sent < restarted and s.ended is not None and s.ended > restarted
               for s in sent), "no call spanned the restart"
    drained = door.sup.events("engine_drained", engine="cz", pid=pid)
    assert [(d["mode"], d["result"]) for d in drained] == [("door", "clean")]
    assert not door.sup.events("engine_jobs_lost")
    # measured by the door: the proofs, and the calls held through the restart
    completed = door.metric("cuzkd_door_proofs_total", door="cz", proof_kind="porep-c2",
                            result="completed")
    assert completed >= sum(s.outcome == "completed" and s.kind == "porep-c2" for s in sent)
    assert door.metric("cuzkd_door_hold_duration_seconds_count", door="cz",
                       outcome="placed") >= 1


def test_a_sigkill_under_a_prove_is_retried_once_and_succeeds(door: Door) -> None:
    """The engine dies under a call (SIGKILL: a crash, an OOM kill or a stall kill look the
    same to the door): the door sends the same request to the next process, and the caller
    sees only its proof."""
    pid = door.running()
    with door.channel() as channel:
        call = prove_later(channel, "winning-post", "winning-1000-[7]")
        wait_until(lambda: engine_holds(channel, "winning-1000-[7]"), 20, "the job on a GPU")
        os.kill(pid, signal.SIGKILL)
        reply = call.result(60)
    assert reply.result.status == pb.AwaitProofResponse.COMPLETED
    assert reply.result.job_id == "winning-1000-[7]"
    assert door.running() != pid
    retried = [*door.sup.events("door_retry_deferred"), *door.sup.events("door_call_retried")]
    assert [r["reason"] for r in retried] == ["crash"], retried
    assert door.metric("cuzkd_door_retries_total", door="cz", reason="crash") == 1


def test_bad_input_gets_a_clear_status_and_harms_neither_engine_nor_callers(door: Door) -> None:
    """An unknown method, bytes that are not the method's message and a message over cuzk's
    128 MiB limit are answered by the door with a clear status; the engine never sees them,
    and a good call right after completes on the same process."""
    pid = door.running()
    with door.channel() as channel:
        for path in (SERVICE + "Unknown", "/grpc.health.v1.Health/Check"):
            with pytest.raises(grpc.RpcError) as unknown:
                channel.unary_unary(path)(b"", timeout=10)
            assert unknown.value.code() is grpc.StatusCode.UNIMPLEMENTED
            assert "cuzk.v1.ProvingEngine" in unknown.value.details()
        with pytest.raises(grpc.RpcError) as garbage:
            channel.unary_unary(SERVICE + "Prove")(b"\xff\xff\xff\xff", timeout=10)
        assert garbage.value.code() is grpc.StatusCode.INVALID_ARGUMENT
        assert "cuzk.v1.ProveRequest" in garbage.value.details()
        too_big = prove_request("porep-c2", "porep-1000-999")
        too_big.submit.vanilla_proof = b"\0" * (128 * MIB + 1)
        with pytest.raises(grpc.RpcError) as over:
            channel.unary_unary(SERVICE + "Prove")(too_big.SerializeToString(), timeout=30)
        assert over.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
        reply = prove_later(channel, "porep-c2", "porep-1000-1000").result(60)
    assert reply.result.status == pb.AwaitProofResponse.COMPLETED
    assert door.running() == pid


def test_a_door_whose_address_already_answers_refuses_to_start(door: Door) -> None:
    """An old cuzk unit still enabled answers at Curio's address: a second door there would
    split Curio's calls, so cuzkd refuses to start, naming the address."""
    other = door.tmp / "other"
    other.mkdir()
    table, _ = cuzk_engine(other, "cz", door=door.address)
    second = start_supervisor(write_config(other, [table]), wait=False)
    try:
        assert second.proc.wait(30) == 1
    finally:
        second.close()
    failed = second.events("supervisor_start_failed")
    assert failed and door.address in failed[0]["error"], second.log_text()
    assert "already answers" in failed[0]["error"]
    assert not second.events("engine_spawned")


def test_at_shutdown_the_door_serves_on_deadline_calls_go_to_the_draining_engine(
        door: Door) -> None:
    """Last: it ends the module's supervisor. A WindowPoSt is on the GPU when SIGTERM comes:
    the engine drains for it. A WinningPoSt waiting behind it in the door (one PoSt at a time)
    is sent to the draining engine and proved, a PoRep sent during the drain is held, and when
    cuzkd exits the PoRep is refused UNAVAILABLE naming the restart; the WindowPoSt's caller
    gets its proof. The WinningPoSt is in the door before SIGTERM, so the drain cannot end
    before it arrives, however slow the machine."""
    door.running()
    with door.channel() as channel:
        in_flight = prove_later(channel, "window-post", "wdpost-1000-[1 0] dl 3")
        wait_until(lambda: engine_holds(channel, "wdpost-1000-[1 0] dl 3"), 20, "the PoSt")
        winning = prove_later(channel, "winning-post", "winpost-1000-beef")
        door.sup.proc.send_signal(signal.SIGTERM)
        wait_until(lambda: door.sup.events("supervisor_stopping"), 20, "the shutdown")
        held = prove_later(channel, "porep-c2", "porep-1000-2000")
        # when each call ended, taken as it ends: cuzkd may exit (and refuse the PoRep) right
        # after the WinningPoSt's proof, before this thread looks again
        ended: dict[str, float] = {}
        for name, call in (("held", held), ("winning", winning)):
            call.add_done_callback(lambda _, name=name: ended.setdefault(name, time.monotonic()))
        assert winning.result(20).result.status == pb.AwaitProofResponse.COMPLETED
        done = in_flight.result(20)
        error = held.exception(20)
    assert done.result.status == pb.AwaitProofResponse.COMPLETED
    assert isinstance(error, grpc.RpcError)
    assert error.code() is grpc.StatusCode.UNAVAILABLE
    assert "cuzkd stopped (a restart or a stop) while the call was held" in error.details()
    assert ended["held"] >= ended["winning"]  # the PoRep was still held when the PoSt was proved
    assert door.sup.proc.wait(20) == 0
    drained = door.sup.events("engine_drained", engine="cz")
    assert drained[-1]["result"] == "clean"
