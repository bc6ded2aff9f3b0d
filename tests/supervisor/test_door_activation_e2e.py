"""A front door on a socket systemd passed (socket activation), for real: the test holds the
listening socket as systemd would, hands it as fd 3 with ``LISTEN_*`` to one ``cuzkd run``,
then to the next after the first stopped, while a caller proves through it without
``wait_for_ready`` (a refused connect would fail its call at once)."""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from support.activation import activated
from support.cuzk_harness import cuzk_engine
from support.cuzk_load import KINDS
from support.supervisor_harness import RunningSupervisor, start_supervisor, write_config
from support.waiting import wait_until

from cuzkd.cuzk import proving_pb2 as pb

#: a PoRep C2 job in 0.25 s
KNOBS = {"CUZK_STANDIN_SYNTH_SECS": "0.2", "CUZK_STANDIN_GPU_SECS": "0.05"}


class Caller(threading.Thread):
    """Curio proving one job after another; every call's outcome kept."""

    def __init__(self, address: str) -> None:
        super().__init__(daemon=True)
        self._address = address
        self.outcomes: list[str] = []
        #: when each call was sent and answered (monotonic)
        self.spans: list[tuple[float, float]] = []
        self.halt = threading.Event()

    def run(self) -> None:
        with grpc.insecure_channel(self._address) as channel:
            prove = channel.unary_unary(
                "/cuzk.v1.ProvingEngine/Prove",
                request_serializer=pb.ProveRequest.SerializeToString,
                response_deserializer=pb.ProveResponse.FromString)
            n = 0
            while not self.halt.is_set():
                n += 1
                request = pb.ProveRequest(submit=pb.SubmitProofRequest(
                    request_id=f"porep-1000-{n}", proof_kind=KINDS["porep-c2"]))
                sent = time.monotonic()
                try:
                    reply = prove(request, timeout=60)
                    self.outcomes.append(pb.AwaitProofResponse.Status.Name(reply.result.status))
                except grpc.RpcError as exc:
                    self.outcomes.append(f"{exc.code().name}: {exc.details()}")
                self.spans.append((sent, time.monotonic()))

    def completed(self) -> int:
        return self.outcomes.count("COMPLETED")


@pytest.fixture
def listener(tmp_path: Path) -> Iterator[tuple[socket.socket, str]]:
    """The socket systemd's cuzkd.socket would hold, at the door's address."""
    _, address = cuzk_engine(tmp_path, "cz")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(address.removeprefix("unix://"))
    sock.listen(64)
    with sock:
        yield sock, address


def _activated(config: Path, sock: socket.socket) -> RunningSupervisor:
    sock.set_inheritable(True)
    return start_supervisor(config, prefix=activated(sock.fileno(), "door"),
                            pass_fds=(sock.fileno(),))


def _engine_pid(sup: RunningSupervisor) -> int:
    return int(sup.wait_engine("cz", lambda e: e["state"] == "running", timeout=30)["pid"])


def test_a_restart_on_a_passed_socket_fails_no_call_of_a_caller_proving(
        tmp_path: Path, listener: tuple[socket.socket, str]) -> None:
    sock, address = listener
    table, _ = cuzk_engine(tmp_path, "cz", env=KNOBS, door="", stop_timeout="1s",
                           drain_timeout="5s")
    config = write_config(tmp_path, [table], supervisor={"shutdown_grace": "10s"})
    first = _activated(config, sock)
    caller = Caller(address)
    try:
        [listening] = first.events("door_listening")
        assert (listening["passed_fd"], listening["fd_name"]) == (3, "door")
        engine = _engine_pid(first)
        # the engine inherits neither the variables nor the socket
        environ = Path(f"/proc/{engine}/environ").read_bytes().split(b"\0")
        assert not [v for v in environ if v.startswith(b"LISTEN_")]
        ours = f"socket:[{os.fstat(sock.fileno()).st_ino}]"
        fds = Path(f"/proc/{engine}/fd")
        assert ours not in {os.readlink(fds / fd) for fd in os.listdir(fds)}
        caller.start()
        wait_until(lambda: caller.completed() >= 2, 30, "proofs through the passed socket")
        before = len(caller.outcomes)
        assert first.stop(timeout=30) == 0
        assert not list((tmp_path / "state").glob(".door-*")), "the private socket went"
        handover = time.monotonic()
        second = _activated(config, sock)  # the socket stayed open: calls waited meanwhile
        try:
            wait_until(lambda: caller.completed() >= before + 3, 30, "proofs after it")
        finally:
            caller.halt.set()
            caller.join(60)
            assert second.stop(timeout=30) == 0
    finally:
        caller.halt.set()
        first.close()
    assert set(caller.outcomes) == {"COMPLETED"}, caller.outcomes
    assert any(sent < handover < ended for sent, ended in caller.spans), \
        "no call waited through the handover"
    assert Path(address.removeprefix("unix://")).exists(), "the socket file is systemd's"
