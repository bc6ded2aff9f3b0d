"""A cuzk engine under a real ``cuzkd run``: the stand-in as ``[[engine]] type = "cuzk"``, and
its load driven from a thread while the test talks to the supervisor synchronously.

:func:`cuzk_engine` writes the stand-in's cuzk TOML (gRPC on a Unix socket, ``/status`` on a
free loopback port, a budget of ten PoRep partitions) and returns the ``[[engine]]`` table and
the gRPC address; :class:`LoadThread` runs a :class:`support.cuzk_load.Load` on its own event
loop until :meth:`LoadThread.stop`.
"""

from __future__ import annotations

import asyncio
import sys
import threading
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any, TypeVar

from support.cuzk_load import Load, Sent
from support.cuzk_standin import SCRIPT, write_cuzk_toml
from support.ports import free_port

_T = TypeVar("_T")


def cuzk_engine(tmp: Path, name: str = "cuzk", *, env: dict[str, str] | None = None,
                **keys: Any) -> tuple[dict[str, Any], str]:
    """(the ``[[engine]]`` table, its gRPC address) for a stand-in cuzk under ``tmp``."""
    listen = f"unix://{tmp}/{name}-grpc.sock"
    config = write_cuzk_toml(tmp / f"{name}.toml", listen, f"127.0.0.1:{free_port()}",
                             '[memory]\ntotal_budget = "140GiB"\n')
    table = {"name": name, "type": "cuzk", "door": "off",
             "command": [sys.executable, str(SCRIPT), "-c", str(config)],
             "env": env or {}, "health_interval": "100ms", **keys}
    return table, listen


class LoadThread:
    """A load on its own event loop in a thread; ``shape`` starts it (``steady``, ``light``)."""

    def __init__(self, address: str, kinds: list[str], shape: Callable[[Load], None]) -> None:
        self._ready = threading.Event()
        self._stop: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self.load: Load | None = None
        self._thread = threading.Thread(target=asyncio.run, args=(self._run(address, kinds,
                                                                              shape),))
        self._thread.start()
        self._ready.wait(30)

    async def _run(self, address: str, kinds: list[str], shape: Callable[[Load], None]) -> None:
        self._loop, self._stop = asyncio.get_running_loop(), asyncio.Event()
        self.load = Load(address, kinds)
        shape(self.load)
        self._ready.set()
        await self._stop.wait()
        await self.load.stop()

    @property
    def sent(self) -> list[Sent]:
        assert self.load is not None
        return list(self.load.sent)

    def shape(self, start: Callable[[Load], None]) -> None:
        """Start more load (``Load.steady``, ``Load.light``) on the load's loop."""
        assert self._loop is not None and self.load is not None
        self._loop.call_soon_threadsafe(start, self.load)

    def run(self, coroutine: Coroutine[Any, Any, _T]) -> _T:
        """Run ``coroutine`` on the load's loop and wait for its result."""
        assert self._loop is not None
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result(60)

    def stop(self) -> list[Sent]:
        """Send nothing more (calls still waiting are cancelled); every job sent. Again: the
        same list."""
        if self._thread.is_alive():
            assert self._loop is not None and self._stop is not None
            self._loop.call_soon_threadsafe(self._stop.set)
            self._thread.join(30)
        return self.sent
