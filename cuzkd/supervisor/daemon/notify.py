"""systemd's sd_notify protocol: one datagram per message to ``$NOTIFY_SOCKET``.

Implemented directly (it is a single ``sendto``) so there is no libsystemd dependency. Without
``NOTIFY_SOCKET`` every call is a no-op, so the daemon code never checks where it runs. A name
starting with ``@`` is in the abstract namespace (leading NUL byte).

The socket is non-blocking: a datagram socket's queue holds a few messages (``max_dgram_qlen``,
10 by default), and a service manager that does not read (frozen, busy, a test's listener) would
otherwise block ``sendto`` and with it the whole event loop, health polls and watchdog included.
A message that does not fit is dropped, except the fields that change what systemd believes
(``READY=1``, ``RELOADING=1``, ``STOPPING=1``, ...): those go out again with the next message.
``STATUS=`` and ``WATCHDOG=1`` are only ever worth their latest value, and come again anyway.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Mapping

import structlog

log = structlog.get_logger("cuzkd.supervisor")


class Notifier:
    def __init__(self, environ: Mapping[str, str] | None = None) -> None:
        env = os.environ if environ is None else environ
        address = env.get("NOTIFY_SOCKET", "")
        self._address = "\0" + address[1:] if address.startswith("@") else address
        self.watchdog_interval = _watchdog_interval(env)
        self._last_status = ""
        #: fields a full queue refused that must still reach systemd, sent before the next ones
        self._unsent: tuple[str, ...] = ()

    @property
    def enabled(self) -> bool:
        return bool(self._address)

    def send(self, *fields: str) -> None:
        """Send ``KEY=VALUE`` lines as one datagram, never waiting; failures are logged, never
        raised."""
        if not self._address:
            return
        message = (*self._unsent, *fields)
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC
                               | socket.SOCK_NONBLOCK) as sock:
                sock.sendto("\n".join(message).encode(), self._address)
        except BlockingIOError:
            if not self._unsent:
                log.warning("sd_notify_dropped", message=fields)
            self._unsent = tuple(f for f in message if not f.startswith(_LATEST_ONLY))
        except OSError as exc:
            log.warning("sd_notify_failed", error=str(exc), message=fields)
        else:
            self._unsent = ()

    def status(self, line: str) -> None:
        """Send a ``STATUS=`` line when it differs from the last one sent (engine changes
        come in bursts; systemd needs only the result)."""
        if line != self._last_status:
            self._last_status = line
            self.send(line)

    def reloading(self) -> None:
        # Type=notify-reload wants the monotonic timestamp alongside RELOADING=1.
        usec = time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000
        self.send("RELOADING=1", f"MONOTONIC_USEC={usec}")


#: fields only the latest value of which matters: dropped, not kept, when the queue is full
_LATEST_ONLY = ("STATUS=", "WATCHDOG=1")


def _watchdog_interval(env: Mapping[str, str]) -> float | None:
    """Half of WATCHDOG_USEC (when it is meant for this process), as systemd recommends."""
    usec = env.get("WATCHDOG_USEC", "")
    pid = env.get("WATCHDOG_PID", "")
    if not usec.isdigit() or int(usec) == 0 or (pid and pid != str(os.getpid())):
        return None
    return int(usec) / 1e6 / 2
