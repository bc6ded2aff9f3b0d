"""sd_notify: READY, STATUS, WATCHDOG, RELOADING/READY around SIGHUP, STOPPING -- in order."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
from pathlib import Path

from support.supervisor_harness import (
    NotifyListener,
    scripted_engine,
    start_supervisor,
    write_config,
)
from support.waiting import wait_until

from cuzkd.supervisor.daemon.notify import Notifier


def test_notify_sequence(tmp_path: Path) -> None:
    listener = NotifyListener(str(tmp_path / "notify.sock"))
    config = write_config(tmp_path, [scripted_engine(tmp_path, "a", health_interval="50ms")])
    sup = start_supervisor(config, env={"NOTIFY_SOCKET": str(tmp_path / "notify.sock"),
                                        "WATCHDOG_USEC": "200000"})
    try:
        wait_until(lambda: listener.has("STATUS=1/1 engines running"), 10, "STATUS 1/1")
        wait_until(lambda: sum("WATCHDOG=1" in m for m in listener.drain()) >= 2, 10,
                   "two watchdog pings")
        sup.proc.send_signal(signal.SIGHUP)
        wait_until(lambda: listener.has("RELOADING=1"), 10, "RELOADING=1")
        # the reload reads the file on a thread: stop only once it has been applied (READY=1
        # again), or the stop can overtake it
        wait_until(lambda: any("READY=1" in m.split("\n") for m in
                               listener.drain()[listener.index("RELOADING=1"):]),
                   10, "READY=1 after the reload")
        assert sup.stop() == 0
    finally:
        sup.close()
    msgs = listener.drain()
    ready = listener.index("READY=1")
    assert ready < listener.index("STATUS=1/1 engines running")
    assert ready < listener.index("WATCHDOG=1")
    reloading = listener.index("RELOADING=1")
    assert any(f.startswith("MONOTONIC_USEC=") for f in msgs[reloading].split("\n"))
    assert listener.index("READY=1", reloading) > reloading
    stopping = listener.index("STOPPING=1")
    assert stopping > reloading
    assert not [m for m in msgs[stopping + 1:] if "WATCHDOG=1" in m or "READY=1" in m]


def test_abstract_socket_names() -> None:
    name = f"cuzkd-test-{os.getpid()}"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind("\0" + name)
    sock.settimeout(5)
    with sock:
        Notifier({"NOTIFY_SOCKET": "@" + name}).send("READY=1", "STATUS=ok")
        assert sock.recv(100) == b"READY=1\nSTATUS=ok"


def test_a_status_line_is_sent_only_when_it_changed(tmp_path: Path) -> None:
    path = tmp_path / "notify.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind(str(path))
        sock.settimeout(5)
        notifier = Notifier({"NOTIFY_SOCKET": str(path)})
        for line in ("STATUS=1/2 engines running", "STATUS=1/2 engines running",
                     "STATUS=2/2 engines running"):
            notifier.status(line)
        notifier.send("READY=1")  # a marker: nothing else is queued before it
        assert [sock.recv(100) for _ in range(3)] == [
            b"STATUS=1/2 engines running", b"STATUS=2/2 engines running", b"READY=1"]


def test_watchdog_interval_is_half_and_respects_watchdog_pid() -> None:
    assert Notifier({"WATCHDOG_USEC": "2000000"}).watchdog_interval == 1.0
    assert Notifier({"WATCHDOG_USEC": "2000000", "WATCHDOG_PID": "1"}).watchdog_interval is None
    assert Notifier({}).watchdog_interval is None
    assert not Notifier({}).enabled


def test_ready_after_reload_comes_once_the_change_is_applied(tmp_path: Path) -> None:
    # `systemctl reload` returns at READY=1: by then a removed engine must be gone.
    listener = NotifyListener(str(tmp_path / "notify.sock"))
    keep = scripted_engine(tmp_path, "keep", health_interval="50ms")
    drop = scripted_engine(tmp_path, "drop", "ignore-term", health_interval="50ms",
                       stop_timeout="1s")
    config = write_config(tmp_path, [keep, drop])
    sup = start_supervisor(config, env={"NOTIFY_SOCKET": str(tmp_path / "notify.sock")})
    try:
        sup.wait_engine("drop", lambda e: e["state"] == "running")
        write_config(tmp_path, [keep])
        sup.proc.send_signal(signal.SIGHUP)
        wait_until(lambda: listener.has("RELOADING=1"), 10, "RELOADING=1")

        def ready_after_reload() -> bool:
            listener.drain()
            reloading = listener.index("RELOADING=1")
            return any("READY=1" in m.split("\n") for m in listener.messages[reloading:])

        wait_until(ready_after_reload, 10, "READY=1 after RELOADING=1", interval=0.005)
        assert set(sup.engines()) == {"keep"}
        assert sup.about()["state"] == "running"
        assert sup.stop() == 0
    finally:
        sup.close()


def test_a_full_queue_never_blocks_and_what_must_arrive_goes_again(tmp_path: Path) -> None:
    # A listener that does not read: its queue fills after max_dgram_qlen datagrams, and a
    # blocking sendto would hang the caller (the supervisor's event loop) for good.
    path = tmp_path / "notify.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind(str(path))
        notifier = Notifier({"NOTIFY_SOCKET": str(path)})
        queued = int(Path("/proc/sys/net/unix/max_dgram_qlen").read_text())
        for i in range(queued + 5):
            notifier.send("WATCHDOG=1", f"STATUS=ping {i}")
        notifier.send("READY=1", "STATUS=ready")  # refused: the queue is full
        sock.setblocking(False)
        received = []
        with contextlib.suppress(BlockingIOError):
            while True:
                received.append(sock.recv(100))
        assert len(received) >= queued  # the rest were dropped, not waited for
        assert all(m.startswith(b"WATCHDOG=1\nSTATUS=ping ") for m in received)
        notifier.send("WATCHDOG=1")
        assert sock.recv(100) == b"READY=1\nWATCHDOG=1"
        notifier.send("WATCHDOG=1")
        assert sock.recv(100) == b"WATCHDOG=1"
