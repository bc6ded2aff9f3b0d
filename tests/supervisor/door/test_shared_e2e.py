"""Two engines behind one door end to end: a real ``cuzkd run`` with two cuzk stand-ins
whose doors name one address (one cuzk per GPU), a Curio-like caller dialling it.

A ``cuzkd swap`` to another release, which rolls the engines one at a time, under steady
load: while one drains and restarts the other takes every call at once (none is held:
Curio sees no pause), no call fails, no proof is lost. One supervisor boot; every wait is on
an event, never a sleep.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import grpc
import pytest
from support.cuzk_harness import LoadThread, cuzk_engine
from support.cuzk_standin import SCRIPT
from support.supervisor_harness import start_supervisor, write_config
from support.waiting import wait_until

from cuzkd.cuzk import proving_pb2 as pb

#: a PoRep C2 job in about 0.12 s
KNOBS = {"CUZK_STANDIN_SYNTH_SECS": "0.1", "CUZK_STANDIN_GPU_SECS": "0.02"}


def release(tmp: Path, name: str) -> Path:
    """A release of the stand-in that ``cuzkd swap`` can install."""
    path = tmp / name
    path.write_text(f"#!/bin/sh\nexec {sys.executable} {SCRIPT} \"$@\"\n")
    path.chmod(0o755)
    return path


def test_a_rolling_swap_behind_a_shared_door_fails_nothing_and_holds_nothing(
        tmp_path: Path) -> None:
    address = f"unix://{tmp_path}/curio.sock"
    tables = [cuzk_engine(tmp_path, name, env=KNOBS, door=address, backoff_initial="100ms",
                          stop_timeout="1s", drain_timeout="5s")[0] for name in ("c0", "c1")]
    for table in tables:
        table["command"][:2] = ["{binary}"]
    supervisor = {"shutdown_grace": "5s", "initial_binary": str(release(tmp_path, "cuzk-a")),
                  "release_settle": "0.5s"}
    sup = start_supervisor(write_config(tmp_path, tables, supervisor=supervisor))
    try:
        pids = {name: sup.wait_engine(name, lambda e: e["state"] == "running",
                                      timeout=30)["pid"] for name in ("c0", "c1")}
        load = LoadThread(address, ["porep-c2", "snap-update"], lambda load: load.steady(4))
        try:
            wait_until(lambda: sum(s.outcome == "completed" for s in load.sent) >= 2, 30,
                       "calls completed before the roll")
            rolled = time.monotonic()
            subprocess.run([sys.executable, "-m", "cuzkd", "swap", "--config", str(sup.config),
                            "--settle", "0.5s", str(release(tmp_path, "cuzk-b"))],
                           check=True, stdout=subprocess.DEVNULL, timeout=120)
            done = time.monotonic()
            for name in ("c0", "c1"):
                running = sup.wait_engine(name, lambda e: e["state"] == "running", timeout=30)
                assert running["pid"] != pids[name]
            wait_until(lambda: all(s.outcome for s in load.sent if s.sent < done), 30,
                       "the calls sent through the roll answered")
        finally:
            sent = load.stop()
        outcomes = Counter(s.outcome for s in sent if s.outcome)  # "": cancelled at the end
        assert set(outcomes) == {"completed"}, outcomes
        during = [s for s in sent if rolled < s.sent < done]
        assert len(during) >= 4 and all(s.outcome == "completed" for s in during), during
        drained = [(d["engine"], d["mode"], d["result"])
                   for d in sup.events("engine_drained")]
        assert sorted(drained) == [("c0", "door", "clean"), ("c1", "door", "clean")]
        assert not sup.events("engine_jobs_lost")
        assert not sup.events("door_call_refused") and not sup.events("door_book_failed")
        # each engine went back into rotation, and no call had to wait for one
        assert [e["engine"] for e in sup.events("door_engine_admitted")].count("c0") == 2
        assert all(e["held"] == 0 for e in sup.events("door_engine_admitted"))
    finally:
        sup.stop()


def test_one_request_id_sent_twice_at_once_is_proved_once_behind_a_shared_door(
        tmp_path: Path) -> None:
    """Curio's retry of a call still in flight (the same request_id, the same bytes) goes to
    no second engine: both callers get the one proof. The same id with other bytes is refused
    ALREADY_EXISTS."""
    address = f"unix://{tmp_path}/curio.sock"
    slow = {**KNOBS, "CUZK_STANDIN_SYNTH_SECS": "1"}
    tables = [cuzk_engine(tmp_path, name, env=slow, door=address)[0] for name in ("c0", "c1")]
    sup = start_supervisor(write_config(tmp_path, tables))
    try:
        for name in ("c0", "c1"):
            sup.wait_engine(name, lambda e: e["state"] == "running", timeout=30)
        with grpc.insecure_channel(address) as channel:
            prove = channel.unary_unary("/cuzk.v1.ProvingEngine/Prove",
                                        request_serializer=pb.ProveRequest.SerializeToString,
                                        response_deserializer=pb.ProveResponse.FromString)
            request = pb.ProveRequest(submit=pb.SubmitProofRequest(
                request_id="porep-1000-77", proof_kind=pb.POREP_SEAL_COMMIT))
            first, second = (prove.future(request, timeout=60) for _ in range(2))
            wait_until(lambda: sup.events("proof request queued", job_id="porep-1000-77"), 30,
                       "the first on an engine")
            other = pb.ProveRequest(submit=pb.SubmitProofRequest(
                request_id="porep-1000-77", proof_kind=pb.SNAP_DEALS_UPDATE))
            with pytest.raises(grpc.RpcError) as exists:
                prove(other, timeout=30)
            replies = [first.result(60), second.result(60)]
        assert exists.value.code() is grpc.StatusCode.ALREADY_EXISTS
        assert [r.result.status for r in replies] == [pb.AwaitProofResponse.COMPLETED] * 2
        assert replies[0] == replies[1]
        queued = sup.events("proof request queued", job_id="porep-1000-77")
        assert len(queued) == 1, queued  # one engine, once
    finally:
        sup.stop()
