"""Fetching an engine's ``/status`` document, shared by health polls and metric scrapes.

One :class:`StatusSource` per engine: :meth:`StatusSource.poll` fetches a fresh document every
``health_interval`` and decodes only what is used, :meth:`StatusSource.fetch` serves scrapes a
document up to a second old with concurrent requests coalesced. Every failure is one
``fetch_errors_total`` increment and a :attr:`StatusSource.last_error` that says why, never an
exception, so an engine serving garbage is unhealthy and never breaks its caller. Its parts:
:class:`StatusHttp` gets a body, :class:`~cuzkd.status.reader.StatusReader` decodes it and feeds
the deriver, :class:`KeptReading` is the last good one; every age is read from the ``clock`` the
owner passes in. The rules are docs/status.md, *Fetching*.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import aiohttp
import structlog

from cuzkd.errors import StatusDecodeError, StatusFetchError
from cuzkd.errortext import error_text
from cuzkd.status.derive import ExtensionDeriver
from cuzkd.status.document import (
    Extensions,
    StaleJob,
    StatusDocument,
)
from cuzkd.status.lightpolls import LightPolls
from cuzkd.status.reader import StatusReader
from cuzkd.status.salvage import FieldErrorReason

#: Default cap on a status body. cuzk's document is at most a few MB even with thousands of
#: jobs listed; the cap only stops an engine streaming without end from eating our memory.
MAX_BODY_BYTES = 16 * 2**20
#: Bytes of a bad body quoted in an error message.
EXCERPT_BYTES = 64


def split_address(address: str) -> tuple[str | None, str]:
    """``unix:/run/x.sock`` → (socket path, URL); ``http://h:p/status`` → (None, URL)."""
    if address.startswith("unix:"):
        return address.removeprefix("unix:"), "http://localhost/status"
    return None, address


class Body:
    """A status body as it arrived, in chunks, joined only when it is decoded.

    A poll that only checks the framing looks at the ends alone: joining the ~8 chunks of a
    1 MB body it never decodes (one more 1 MB allocation and copy) was a third of its CPU.
    """

    __slots__ = ("_chunks", "_whole")

    def __init__(self, chunks: list[bytes]) -> None:
        self._chunks = chunks
        self._whole: bytes | None = chunks[0] if len(chunks) == 1 else None

    def whole(self) -> bytes:
        """The body's bytes (joined at the first call)."""
        if self._whole is None:
            self._whole = b"".join(self._chunks)
            self._chunks = [self._whole]
        return self._whole

    def head(self, n: int) -> bytes:
        """The first ``n`` bytes (fewer if the body is shorter)."""
        out = b""
        for chunk in self._chunks:
            out += chunk[:n - len(out)]
            if len(out) >= n:
                break
        return out

    def tail(self, n: int) -> bytes:
        """The last ``n`` bytes (fewer if the body is shorter)."""
        out = b""
        for chunk in reversed(self._chunks):
            out = chunk[max(0, len(chunk) - (n - len(out))):] + out
            if len(out) >= n:
                break
        return out


async def read_body(resp: aiohttp.ClientResponse, limit: int) -> Body:
    """The whole body however it is framed, or StatusFetchError once it exceeds ``limit``.

    ``resp.content.read(n)`` returns what has arrived so far, which for a document written in
    small pieces is a fraction of it; this reads until the end of the body.
    """
    declared = resp.content_length
    if declared is not None and declared > limit:
        raise too_large(limit)
    chunks: list[bytes] = []
    size = 0
    async for chunk in resp.content.iter_any():
        size += len(chunk)
        if size > limit:
            raise too_large(limit)
        chunks.append(chunk)
    return Body(chunks)


#: The kind of a status answer larger than cuzkd reads: the engine answered (alive), the
#: document is not taken.
TOO_LARGE = "too_large"


def too_large(limit: int) -> StatusFetchError:
    return StatusFetchError(TOO_LARGE, f"status document larger than {limit} bytes")


def answered(error: StatusFetchError) -> bool:
    """The engine answered, wrongly (an HTTP error, no status document, too large): a fault
    even while it starts. Otherwise nothing answered (refused, no socket, timed out, the
    connection dropped): while it starts, its listener is not up yet."""
    return error.kind.startswith("http_") or error.kind in ("invalid", TOO_LARGE)


def excerpt(body: bytes) -> str:
    """The start of a body, printable and short, for an error message."""
    head = body[:EXCERPT_BYTES].decode("utf-8", errors="replace")
    return repr(head) + ("..." if len(body) > EXCERPT_BYTES else "")


def looks_like_object(body: Body) -> bool:
    """Starts with ``{`` and ends with ``}`` (whitespace aside): the framing check of a poll
    whose document is not decoded. Only the ends are looked at; a 1 MB body is not copied."""
    return (body.head(EXCERPT_BYTES).lstrip()[:1] == b"{"
            and body.tail(EXCERPT_BYTES).rstrip()[-1:] == b"}")


def invalid_document(exc: StatusDecodeError, body: Body) -> StatusFetchError:
    return StatusFetchError(
        "invalid", f"invalid status document: {exc} (body starts {excerpt_of(body)})")


def excerpt_of(body: Body) -> str:
    return excerpt(body.head(EXCERPT_BYTES + 1))


def describe_exception(exc: BaseException, *, address: str, timeout: float) -> StatusFetchError:
    """A transport-level failure as a message that always says something."""
    if isinstance(exc, TimeoutError):  # str() of a TimeoutError is usually empty
        return StatusFetchError("timeout", f"no answer from {address} within {timeout:g}s")
    if isinstance(exc, aiohttp.ClientConnectorError):
        reason = exc.os_error.strerror or str(exc.os_error) or type(exc.os_error).__name__
        return StatusFetchError("connect", f"cannot connect to {address}: {reason}")
    return StatusFetchError(type(exc).__name__, error_text(exc))


class StatusHttp:
    """The HTTP GET of one engine's status body, over TCP or a Unix socket."""

    def __init__(self, address: str, *, timeout: float, max_bytes: int) -> None:
        self.address = address
        self._socket_path, self._url = split_address(address)
        self._timeout_secs = timeout
        self._max_bytes = max_bytes
        self._session: aiohttp.ClientSession | None = None

    async def get(self) -> Body:
        """The whole body of a 200 answer; StatusFetchError saying why there is none."""
        try:
            async with self._session_for_loop().get(self._url) as resp:
                if resp.status != 200:
                    head = await resp.content.read(EXCERPT_BYTES + 1)
                    raise StatusFetchError(
                        f"http_{resp.status}",
                        f"HTTP {resp.status} {resp.reason or ''}".rstrip()
                        + (f": {excerpt(head)}" if head else ""))
                return await read_body(resp, self._max_bytes)
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            raise describe_exception(exc, address=self.address,
                                     timeout=self._timeout_secs) from exc

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    def _session_for_loop(self) -> aiohttp.ClientSession:
        if self._session is None:
            connector: aiohttp.BaseConnector = (
                aiohttp.UnixConnector(path=self._socket_path)
                if self._socket_path is not None
                else aiohttp.TCPConnector(limit=4)
            )
            self._session = aiohttp.ClientSession(
                connector=connector, timeout=aiohttp.ClientTimeout(total=self._timeout_secs))
        return self._session


@dataclass
class KeptReading:
    """The last body that passed its check, when it arrived, and its decoded form (None until
    someone reads it, when a poll only checked it)."""

    body: Body
    at: float
    document: StatusDocument | None


class StatusSource:
    def __init__(self, address: str, *, timeout: float, max_bytes: int = MAX_BODY_BYTES,
                 log: Any = None,
                 deriver: Callable[[], ExtensionDeriver] = ExtensionDeriver,
                 starting: Callable[[], bool] = lambda: False,
                 clock: Callable[[], float] = time.monotonic) -> None:
        """``log``: the structlog logger for field errors and deriver failures (the runner's,
        bound to the engine's name); ``deriver`` makes the deriver of plain documents (and a
        fresh one after it failed); ``starting``, asked at each failure without an answer: True
        while the engine starts, so that failure is its start (not counted in
        ``fetch_errors_total``); ``clock``: monotonic seconds, for a document's age and a
        fetch's duration."""
        self.address = address
        self._http = StatusHttp(address, timeout=timeout, max_bytes=max_bytes)
        self._inflight: asyncio.Task[bool] | None = None
        self._reader = StatusReader(
            log if log is not None else structlog.get_logger("cuzkd.status"), deriver)
        self._polls = LightPolls()
        self._kept: KeptReading | None = None
        self._clock = clock
        self._starting = starting
        self.last_fetch_duration_seconds: float | None = None
        self.fetch_errors_total = 0
        #: why the last fetch failed (for logs and the control API); None after a success
        self.last_error: str | None = None
        #: the bounded kind of ``last_error`` (see StatusFetchError.kind)
        self.last_error_kind: str | None = None
        #: the last failure was counted in ``fetch_errors_total`` (not the engine's start)
        self.last_error_counted = False

    @property
    def field_errors_total(self) -> Counter[FieldErrorReason]:
        """Reason (salvage.FieldErrorReason) -> values left out of the decoded documents."""
        return self._reader.field_errors_total

    @property
    def field_errors(self) -> str | None:
        """The last decoded document's field errors (Decoded.left_out); None when clean."""
        return self._reader.field_errors

    async def poll(self) -> bool:
        """Health poll: True when a fresh document answered, decoded only as far as used
        (docs/status.md, *Fetching*)."""
        return await self._refresh()

    async def fetch(self, max_age: float) -> StatusDocument | None:
        """A document at most ``max_age`` seconds old, or None if the engine did not answer."""
        recent = (max_age > 0 and self._kept is not None
                  and self._clock() - self._kept.at < max_age)
        if not recent and not await self._refresh():
            return None
        return self._decoded()

    def latest(self) -> StatusDocument | None:
        """The last good document, decoded now if a poll only checked it; no request."""
        return self._decoded()

    def extensions(self) -> Extensions | None:
        """The last document's own extensions, else the derived ones (None before any)."""
        document = self._decoded()
        if document is None:
            return None
        if document.cuzkd_extensions is not None:
            return document.cuzkd_extensions
        return self._reader.derived()

    def failed_work(self) -> tuple[list[StaleJob], list[int]]:
        """The stale jobs and phantom-busy workers the deriver found in the last plain document
        (none for an engine serving its own extensions); decodes nothing."""
        return self._reader.failed_work()

    async def close(self) -> None:
        if self._inflight is not None:
            self._inflight.cancel()
            await asyncio.gather(self._inflight, return_exceptions=True)
        await self._http.close()

    async def _refresh(self) -> bool:
        if self._inflight is None:
            self._inflight = asyncio.get_running_loop().create_task(self._fetch_once())
            self._inflight.add_done_callback(self._clear_inflight)
        # shield: one caller giving up (e.g. a scrape timing out) must not cancel the request
        # the other callers are waiting for.
        inflight = self._inflight
        try:
            return await asyncio.shield(inflight)
        except asyncio.CancelledError:
            current = asyncio.current_task()
            if not inflight.cancelled() or (current is not None and current.cancelling()):
                raise
            # The source was closed under the caller (its engine removed by a reload while a
            # scrape waited): no document, never a cancellation of a scrape nobody cancelled.
            return False

    def _clear_inflight(self, task: asyncio.Task[bool]) -> None:
        if self._inflight is task:
            self._inflight = None

    async def _fetch_once(self) -> bool:
        started = self._clock()
        try:
            body = await self._http.get()
            document = self._check(body)
        except StatusFetchError as exc:
            self.last_fetch_duration_seconds = self._clock() - started
            self._failure(exc)
            return False
        ended = self._clock()
        self.last_fetch_duration_seconds = ended - started
        self._kept = KeptReading(body, ended, document)
        self.last_error = self.last_error_kind = None
        return True

    def _check(self, body: Body) -> StatusDocument | None:
        """Validate a fresh body for a poll; the decoded document when it had to be decoded."""
        if self._polls.checks_only():
            if looks_like_object(body):
                self._polls.checked()
                return None  # decoded by whoever reads it
            self._polls.broken()
            raise StatusFetchError("invalid", "invalid status document: not a JSON object "
                                              f"(body starts {excerpt_of(body)})")
        try:
            document = self._reader.decode(body.whole())
        except StatusDecodeError as exc:
            self._polls.broken()
            raise invalid_document(exc, body) from exc
        self._polls.decoded(document.cuzkd_extensions is not None)
        if document.cuzkd_extensions is None:
            self._reader.derive(document)
        return document

    def _decoded(self) -> StatusDocument | None:
        """The last good body, decoded once; None (and an error) when it does not decode."""
        kept = self._kept
        if kept is None:
            return None
        if kept.document is None:
            try:
                kept.document = self._reader.decode(kept.body.whole())
            except StatusDecodeError as exc:
                self._kept = None  # nothing usable is kept any more
                self._polls.broken()
                self._failure(invalid_document(exc, kept.body))
                return None
        return kept.document

    def _failure(self, error: StatusFetchError) -> None:
        """Count a failure, unless nothing answered while the engine starts, and say why."""
        self.last_error_counted = answered(error) or not self._starting()
        if self.last_error_counted:
            self.fetch_errors_total += 1
        self.last_error, self.last_error_kind = str(error), error.kind
