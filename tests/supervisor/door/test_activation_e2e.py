"""A front door on a socket systemd passed (socket activation), for real: the test holds the
listening socket as systemd would, hands it as fd 3 with ``LISTEN_*`` to one ``cuzkd run``,
then to the next after the first stopped, while a caller proves through it without
``wait_for_ready`` (a refused connect would fail its call at once)."""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.activation import activated
from support.cuzk_caller import Caller
from support.cuzk_harness import cuzk_engine
from support.supervisor_harness import RunningSupervisor, start_supervisor, write_config
from support.waiting import wait_until

#: What a call held by the old cuzkd's door when it exits is told (docs/door.md)
RESTART_REFUSAL = "UNAVAILABLE: Prove: cuzkd stopped (a restart or a stop) while the call was"
#: a PoRep C2 job in 0.25 s
KNOBS = {"CUZK_STANDIN_SYNTH_SECS": "0.2", "CUZK_STANDIN_GPU_SECS": "0.05"}


@pytest.fixture
def door(tmp_path: Path) -> Iterator[tuple[socket.socket, Path, str]]:
    """The socket systemd's cuzkd.socket would hold at the door's address, the config of a
    cuzk engine behind that door, and the address."""
    table, address = cuzk_engine(tmp_path, "cz", env=KNOBS, door="", stop_timeout="1s",
                                 drain_timeout="5s")
    config = write_config(tmp_path, [table], supervisor={"shutdown_grace": "10s"})
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(address.removeprefix("unix://"))
    sock.listen(64)
    with sock:
        yield sock, config, address


def _activated(config: Path, sock: socket.socket) -> RunningSupervisor:
    sock.set_inheritable(True)
    return start_supervisor(config, prefix=activated(sock.fileno(), "door"),
                            pass_fds=(sock.fileno(),))


def _engine_pid(sup: RunningSupervisor) -> int:
    return int(sup.wait_engine("cz", lambda e: e["state"] == "running", timeout=30)["pid"])


def test_a_restart_on_a_passed_socket_answers_every_call_of_a_caller_proving(
        tmp_path: Path, door: tuple[socket.socket, Path, str]) -> None:
    sock, config, address = door
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
            caller.finish()
            assert second.stop(timeout=30) == 0
    finally:
        caller.finish()
        first.close()
    # proved, or held by the old door through its drain and refused when it exited; no call
    # failed for want of a connection or a handshake
    failed = [o for o in caller.outcomes if o != "COMPLETED"]
    assert all(o.startswith(RESTART_REFUSAL) for o in failed), caller.outcomes
    assert len(failed) <= 1, "one call at a time: at most the one sent during the drain"
    assert caller.completed() >= before + 3
    assert caller.spanned(handover), "no call waited through the handover"
    assert Path(address.removeprefix("unix://")).exists(), "the socket file is systemd's"
