"""Fetching an engine's ``/status`` document, shared by health polls and metric scrapes.

One :class:`StatusSource` per engine. Health polls ask for a fresh document
(``fetch(max_age=0)``); scrapes accept one up to a second old (``fetch(max_age=1.0)``), so
several Prometheus servers scraping at once cost the engine one request, and concurrent callers
are coalesced into a single request in flight. Every failure -- refused, timed out, HTTP error,
garbage, wrong schema -- is one ``None`` and one ``fetch_errors_total`` increment: an engine
serving garbage is unhealthy, it never breaks the caller.

Engines that serve cuzk's plain document get their cumulative ``Extensions`` derived here by an
:class:`~cuzkd.status.derive.ExtensionDeriver` fed with every successful poll.
"""

from __future__ import annotations

import asyncio
import time

import aiohttp

from cuzkd.status.derive import ExtensionDeriver
from cuzkd.status.document import Extensions, StatusDecodeError, StatusDocument, decode_status

#: Cap on a status body: cuzk's document is a few hundred KiB with many pipelines.
MAX_BODY_BYTES = 16 * 2**20


def split_address(address: str) -> tuple[str | None, str]:
    """``unix:/run/x.sock`` → (socket path, URL); ``http://h:p/status`` → (None, URL)."""
    if address.startswith("unix:"):
        return address.removeprefix("unix:"), "http://localhost/status"
    return None, address


class StatusSource:
    def __init__(self, address: str, *, timeout: float) -> None:
        self.address = address
        self._socket_path, self._url = split_address(address)
        self._timeout = aiohttp.ClientTimeout(total=timeout)
        self._session: aiohttp.ClientSession | None = None
        self._inflight: asyncio.Task[StatusDocument | None] | None = None
        self._deriver = ExtensionDeriver()
        self.last_document: StatusDocument | None = None
        #: monotonic time of the last successful fetch
        self.last_success: float | None = None
        self.last_fetch_duration_seconds: float | None = None
        self.fetch_errors_total = 0
        #: why the last fetch failed (for logs and the control API); None after a success
        self.last_error: str | None = None

    async def fetch(self, max_age: float) -> StatusDocument | None:
        """A document at most ``max_age`` seconds old, or None if the engine did not answer."""
        if (
            max_age > 0
            and self.last_success is not None
            and time.monotonic() - self.last_success < max_age
        ):
            return self.last_document
        if self._inflight is None:
            self._inflight = asyncio.get_running_loop().create_task(self._fetch_once())
            self._inflight.add_done_callback(self._clear_inflight)
        # shield: one caller giving up (e.g. a scrape timing out) must not cancel the request
        # the other callers are waiting for.
        return await asyncio.shield(self._inflight)

    def extensions(self) -> Extensions | None:
        """The last document's own extensions, else the derived ones (None before any)."""
        if self.last_document is None:
            return None
        if self.last_document.cuzkd_extensions is not None:
            return self.last_document.cuzkd_extensions
        return self._deriver.extensions()

    async def close(self) -> None:
        if self._inflight is not None:
            self._inflight.cancel()
            await asyncio.gather(self._inflight, return_exceptions=True)
        if self._session is not None:
            await self._session.close()
            self._session = None

    def _clear_inflight(self, task: asyncio.Task[StatusDocument | None]) -> None:
        if self._inflight is task:
            self._inflight = None

    def _session_for_loop(self) -> aiohttp.ClientSession:
        if self._session is None:
            connector: aiohttp.BaseConnector = (
                aiohttp.UnixConnector(path=self._socket_path)
                if self._socket_path is not None
                else aiohttp.TCPConnector(limit=4)
            )
            self._session = aiohttp.ClientSession(connector=connector, timeout=self._timeout)
        return self._session

    async def _fetch_once(self) -> StatusDocument | None:
        started = time.monotonic()
        try:
            async with self._session_for_loop().get(self._url) as resp:
                if resp.status != 200:
                    raise _FetchError(f"HTTP {resp.status}")
                body = await resp.content.read(MAX_BODY_BYTES + 1)
            if len(body) > MAX_BODY_BYTES:
                raise _FetchError(f"body larger than {MAX_BODY_BYTES} bytes")
            doc = decode_status(body)
        except (aiohttp.ClientError, TimeoutError, OSError, _FetchError) as exc:
            self._failed(started, f"{type(exc).__name__}: {exc}")
            return None
        except StatusDecodeError as exc:
            self._failed(started, f"invalid status document: {exc}")
            return None
        self.last_fetch_duration_seconds = time.monotonic() - started
        self.last_document = doc
        self.last_success = time.monotonic()
        self.last_error = None
        if doc.cuzkd_extensions is None:
            self._deriver.observe(doc)
        return doc

    def _failed(self, started: float, error: str) -> None:
        self.last_fetch_duration_seconds = time.monotonic() - started
        self.fetch_errors_total += 1
        self.last_error = error


class _FetchError(Exception):
    pass
