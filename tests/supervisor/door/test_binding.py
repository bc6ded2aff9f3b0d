"""Where a front door listens, with real sockets in-process: nothing else may answer there, a
stale socket file is removed, a Unix socket has its mode and group before anyone can connect,
and a TCP door on every interface is said out loud."""

from __future__ import annotations

import asyncio
import os
import socket
import stat
from pathlib import Path

import pytest
import structlog
from support.door_process import door_plan, running_doors
from support.ports import free_port

from cuzkd.errors import DoorAddressError
from cuzkd.supervisor.door.binding import UnixAddress, UnixBind, claim


def test_an_address_something_answers_on_is_refused_naming_it(tmp_path: Path) -> None:
    path = tmp_path / "cuzk.sock"
    old_cuzk = socket.socket(socket.AF_UNIX)
    old_cuzk.bind(str(path))
    old_cuzk.listen()
    tcp = socket.create_server(("127.0.0.1", 0))
    try:
        for address in (f"unix://{path}", f"127.0.0.1:{tcp.getsockname()[1]}"):
            with pytest.raises(DoorAddressError, match="already answers") as refused:
                asyncio.run(claim(address))
            assert address in str(refused.value)
    finally:
        old_cuzk.close()
        tcp.close()
    assert path.exists()  # never removed: it was somebody's


def test_a_stale_socket_file_is_removed_and_anything_else_is_refused(tmp_path: Path) -> None:
    stale = tmp_path / "stale.sock"
    left = socket.socket(socket.AF_UNIX)
    left.bind(str(stale))
    left.close()  # the file stays: nobody answers on it
    asyncio.run(claim(f"unix://{stale}"))
    assert not stale.exists()
    not_a_socket = tmp_path / "file"
    not_a_socket.write_text("data")
    with pytest.raises(DoorAddressError, match="not a socket"):
        asyncio.run(claim(f"unix://{not_a_socket}"))
    assert not_a_socket.read_text() == "data"


def test_a_unix_door_has_its_mode_and_group_from_the_first_connect(tmp_path: Path) -> None:
    """Bound in a private directory, given mode and group, then renamed into place: the
    final path never names a socket with other permissions, and nothing is left beside it."""
    final = tmp_path / "cuzk.sock"
    bind = UnixBind(UnixAddress(final), 0o640, str(os.getgid()))
    listener = bind.listen()
    try:
        info = final.lstat()
        assert stat.S_ISSOCK(info.st_mode) and stat.S_IMODE(info.st_mode) == 0o640
        assert info.st_gid == os.getgid()
        assert os.listdir(tmp_path) == ["cuzk.sock"], "the private directory went"
        with socket.socket(socket.AF_UNIX) as client:
            client.connect(str(final))  # the listening socket, at its final path
        bind.remove()
        assert not final.exists()
    finally:
        listener.close()


def test_a_socket_file_a_successor_bound_is_not_removed(tmp_path: Path) -> None:
    final = tmp_path / "cuzk.sock"
    bind = UnixBind(UnixAddress(final), 0o660, "")
    listener = bind.listen()
    final.unlink()
    successor = socket.socket(socket.AF_UNIX)
    successor.bind(str(final))
    try:
        bind.remove()
        assert final.exists(), "the successor's socket stays"
    finally:
        listener.close()
        successor.close()


def test_an_unknown_group_or_a_missing_directory_is_refused_naming_it(tmp_path: Path) -> None:
    with pytest.raises(DoorAddressError, match="no-such-group-here"):
        UnixBind(UnixAddress(tmp_path / "s"), 0o660, "no-such-group-here")
    with pytest.raises(DoorAddressError, match=f"cannot create its socket in {tmp_path}/run"):
        UnixBind(UnixAddress(tmp_path / "run" / "cuzk.sock"), 0o660, "").listen()


def test_a_tcp_door_on_every_interface_is_warned_about() -> None:
    port = free_port()

    async def main() -> list[dict[str, object]]:
        with structlog.testing.capture_logs() as logs:
            async with running_doors([door_plan(f"0.0.0.0:{port}")]):
                pass
        return logs

    events = {e["event"]: e for e in asyncio.run(main())}
    assert events["door_exposed"]["log_level"] == "warning"
    assert events["door_exposed"]["address"] == f"0.0.0.0:{port}"
    assert events["door_listening"]["port"] == port
