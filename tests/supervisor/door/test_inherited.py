"""Sockets systemd passed, taken by cuzkd (door/inherited.py) and handed to the doors
(door/doors.py), with real sockets and a real door process: the variables go, each descriptor
is close-on-exec, a socket no door listens on is closed, a door with none binds its own, and a
TCP socket is matched by its address."""

from __future__ import annotations

import asyncio
import os
import socket
from pathlib import Path

import structlog
from support.door_process import door_plan, running_doors
from support.ports import free_port

from cuzkd.supervisor.core.listenfds import PassedSocket, tcp_key
from cuzkd.supervisor.door.inherited import Inherited, take_passed_sockets


def _tcp_passed(sock: socket.socket, fd: int) -> Inherited:
    host, port = sock.getsockname()[:2]
    return Inherited(PassedSocket(fd, "door", tcp_key(host, port)), sock)


def _passed_at_3(sock: socket.socket, names: str) -> dict[str, str]:
    """``sock`` at fd 3 as systemd passes it (what was at 3 before is the caller's to keep)."""
    os.dup2(sock.fileno(), 3)
    return {"LISTEN_PID": str(os.getpid()), "LISTEN_FDS": "1", "LISTEN_FDNAMES": names,
            "PATH": "/bin"}


def test_taking_the_sockets_removes_the_variables_and_sets_close_on_exec(
        tmp_path: Path) -> None:
    saved = os.dup(3)
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.bind(str(tmp_path / "cuzk.sock"))
            sock.listen()
            environ = _passed_at_3(sock, "door")
            [taken] = take_passed_sockets(environ)
            assert environ == {"PATH": "/bin"}
            assert (taken.passed.fd, taken.passed.name) == (3, "door")
            assert taken.passed.key == ("unix", str(tmp_path / "cuzk.sock"))
            assert not os.get_inheritable(3)
            taken.sock.detach()
    finally:
        os.dup2(saved, 3)
        os.close(saved)


def test_a_socket_no_door_listens_on_is_closed_and_a_door_without_one_binds_its_own() -> None:
    stray = socket.create_server(("127.0.0.1", 0))
    stray_port = stray.getsockname()[1]
    door_port = free_port()

    async def main() -> list[dict[str, object]]:
        with structlog.testing.capture_logs() as logs:
            async with running_doors([door_plan(f"127.0.0.1:{door_port}")],
                                     passed=[_tcp_passed(stray, 7)]):
                pass
        return logs

    events = {e["event"]: e for e in asyncio.run(main())}
    assert events["door_socket_unused"]["listening_at"] == f"tcp:127.0.0.1:{stray_port}"
    assert stray.fileno() == -1, "closed"
    assert events["door_socket_not_passed"]["address"] == f"127.0.0.1:{door_port}"
    assert events["door_listening"]["port"] == door_port  # bound by the door itself


def test_a_tcp_door_serves_on_the_passed_socket_at_its_address() -> None:
    passed = socket.create_server(("127.0.0.1", 0))
    port = passed.getsockname()[1]

    async def main() -> list[dict[str, object]]:
        with structlog.testing.capture_logs() as logs:
            # no "already answers": the socket is the door's own
            async with running_doors([door_plan(f"127.0.0.1:{port}")],
                                     passed=[_tcp_passed(passed, 3)]):
                reader, writer = await asyncio.open_connection("127.0.0.1", port)
                writer.write(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")  # answered with SETTINGS
                assert await asyncio.wait_for(reader.read(9), 20)
                writer.close()
        return logs

    events = {e["event"]: e for e in asyncio.run(main())}
    assert events["door_listening"]["passed_fd"] == 3

