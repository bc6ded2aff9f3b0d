"""The private Unix socket (control socket, an engine's ``unix:`` status): 0600 before it
listens, the process umask never touched, stale sockets replaced, anything else refused."""

from __future__ import annotations

import os
import socket
import stat
from pathlib import Path

import pytest

from cuzkd.unixsock import bind_private_socket


def test_bound_0600_without_touching_the_umask(tmp_path: Path) -> None:
    path = tmp_path / "dir" / "s.sock"
    before = os.umask(0o022)
    try:
        sock = bind_private_socket(path, make_parent=True)
        assert os.umask(0o022) == 0o022  # nothing changed it, not even for a moment we saw
    finally:
        os.umask(before)
    try:
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
        assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
        with socket.socket(socket.AF_UNIX) as client:
            client.connect(str(path))
    finally:
        sock.close()


def test_a_missing_directory_is_the_callers_error_unless_asked_to_make_it(
        tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        bind_private_socket(tmp_path / "missing" / "s.sock")


def test_a_stale_socket_is_replaced_anything_else_refused(tmp_path: Path) -> None:
    path = tmp_path / "s.sock"
    bind_private_socket(path).close()  # a previous run's, nobody listening
    bind_private_socket(path).close()
    precious = tmp_path / "precious"
    precious.write_text("data")
    with pytest.raises(OSError, match="not a socket"):
        bind_private_socket(precious)
    link = tmp_path / "link.sock"
    link.symlink_to(path)  # a symlink to a socket is not a socket of ours
    with pytest.raises(OSError, match="not a socket"):
        bind_private_socket(link)
    assert precious.read_text() == "data" and link.is_symlink() and path.is_socket()
