"""A loopback TCP port for a process the test starts (Prometheus, an engine on ``--port``).

The port is free when this returns and the socket is closed, so the process can bind it; a
race with another binder is possible in principle, which is why tests give port 0 to
everything that can report the port it got (the supervisor's metrics listener does).
"""

from __future__ import annotations

import socket


def free_port() -> int:
    """A loopback port that was free a moment ago (the caller's process binds it itself)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])
