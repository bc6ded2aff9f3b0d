"""The web faces' start: the metrics listener is bound, and its address known, before the
control socket answers anything, so ``/v1/supervisor`` never names a null metrics address (a
client reading it right after start -- the live stack's Prometheus -- found nothing to scrape)."""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path

from aiohttp import web

from cuzkd.log.ratelimit import LimitedLog
from cuzkd.supervisor.web.servers import Servers


def test_the_metrics_address_is_told_before_the_control_socket_answers(tmp_path: Path) -> None:
    control = tmp_path / "control.sock"
    seen: list[tuple[str, int, bool]] = []

    def bound(host: str, port: int) -> None:
        probe = socket.socket(socket.AF_UNIX)
        try:
            probe.connect(str(control))
            answering = True
        except OSError:
            answering = False
        finally:
            probe.close()
        seen.append((host, port, answering))

    async def main() -> None:
        servers = Servers(LimitedLog())
        await servers.start(web.Application(), control, web.Application(), "127.0.0.1:0",
                            lambda: 64, bound=bound)
        try:
            with socket.create_connection(("127.0.0.1", seen[0][1]), timeout=5):
                pass  # the port it was told is the one listening
        finally:
            await servers.close(within=1.0)

    asyncio.run(main())
    [(host, port, answering)] = seen
    assert host == "127.0.0.1" and port > 0
    assert not answering, "the control socket answered before the metrics address was known"
