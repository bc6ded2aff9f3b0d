"""Reading the config file for a SIGHUP reload without ever blocking the event loop.

The file is operator-controlled and may be anything: a FIFO (``open`` blocks until a writer
appears), a file on a hung NFS mount (``read`` blocks for minutes), something huge. Read on the
loop, any of these would freeze ``/metrics``, the control socket and every health poll with it.
So the read runs on a daemon thread of its own and the reload waits for it with a timeout; a
read that never returns is abandoned (a daemon thread does not keep the process alive), and no
second read starts while it hangs, so repeated SIGHUPs cannot pile up stuck threads.

A FIFO is read by :func:`reload_config` without blocking in ``open``, for at most
:data:`READ_TIMEOUT`: a read waiting on a FIFO that no writer ever opens (or one removed or
replaced meanwhile, which no writer can open any more) would otherwise hang for good, and every
later reload would be refused behind it until the supervisor restarts.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Callable
from typing import Generic, TypeVar

import structlog

from cuzkd.config import Config, load_config
from cuzkd.errors import ConfigError

_T = TypeVar("_T")
log = structlog.get_logger("cuzkd.supervisor")

#: How long a reload waits for the file to be read and validated.
READ_TIMEOUT = 10.0


def reload_config(path: str) -> Config:
    """:func:`~cuzkd.config.load_config` for a reload: a FIFO is read for at most
    :data:`READ_TIMEOUT`, so the read always ends."""
    return load_config(path, fifo_wait=READ_TIMEOUT)


def log_notices(config: Config) -> None:
    """The file's warnings (:attr:`Config.notices`: an old proof kind name, a cuzk status
    listener on every address, ...) as ``config_warning`` events, at start and at each reload:
    until the file is changed, every load says what to change in it."""
    for notice in config.notices:
        log.warning("config_warning", detail=notice)


class OffLoopReader(Generic[_T]):
    """Runs ``load(path)`` on a daemon thread; at most one in flight."""

    def __init__(self, load: Callable[[str], _T], timeout: float = READ_TIMEOUT) -> None:
        self._load = load
        self.timeout = timeout
        #: the last read's outcome: in flight until done (its thread may still be winding
        #: down after handing it over; that read is over all the same)
        self._outcome: concurrent.futures.Future[_T] | None = None

    async def read(self, path: str) -> _T:
        """``load(path)``'s result; its ConfigError, or one saying the read did not return."""
        if self._outcome is not None and not self._outcome.done():
            raise ConfigError(f"{path}: an earlier read of this file has still not returned "
                              "(a FIFO or a hung mount?); not reading it again")
        outcome: concurrent.futures.Future[_T] = concurrent.futures.Future()
        self._outcome = outcome

        def work() -> None:
            outcome.set_running_or_notify_cancel()
            try:
                outcome.set_result(self._load(path))
            except BaseException as exc:  # handed to the loop, which re-raises it there
                outcome.set_exception(exc)

        threading.Thread(target=work, name="config-read", daemon=True).start()
        try:
            return await asyncio.wait_for(asyncio.wrap_future(outcome), self.timeout)
        except TimeoutError:
            raise ConfigError(f"{path}: not read within {self.timeout:g}s (a FIFO or a hung "
                              "mount?)") from None
