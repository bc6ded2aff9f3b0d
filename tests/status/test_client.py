"""StatusSource against real servers: 1 MB documents in small pieces, every framing, both
transports, through health polls and scrapes; and every failure saying why."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest
import structlog
from support.big_status import big_document
from support.piece_server import Framing, PieceServer
from support.virtual_clock import run_virtual

from cuzkd.status.client import Body, StatusSource, looks_like_object
from cuzkd.status.derive import ExtensionDeriver
from cuzkd.status.document import StatusDocument, decode_status
from cuzkd.status.lightpolls import DECODE_EVERY

FRAMINGS: tuple[Framing, ...] = ("length", "chunked", "close")

Serve = Callable[[PieceServer], Awaitable[str]]


@pytest.fixture(scope="module")
def big_with_extensions() -> bytes:
    return big_document(extensions=True)


@pytest.fixture(scope="module")
def big_plain() -> bytes:
    return big_document(extensions=False)


@pytest.fixture(params=["tcp", "unix"])
async def serve(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Serve]:
    """Start a PieceServer on the transport under test; its status address."""
    servers: list[PieceServer] = []

    async def start(server: PieceServer) -> str:
        servers.append(server)
        if request.param == "tcp":
            return await server.start_tcp()
        return await server.start_unix(tmp_path / f"s{len(servers)}.sock")

    yield start
    for server in servers:
        await server.close()


@pytest.mark.parametrize("framing", FRAMINGS)
async def test_one_megabyte_in_small_pieces_reads_whole_through_polls_and_scrapes(
        serve: Serve, framing: Framing, big_with_extensions: bytes, big_plain: bytes) -> None:
    for body in (big_with_extensions, big_plain):
        assert len(body) > 2**20
        server = PieceServer(body, framing=framing, piece=1024)
        source = StatusSource(await serve(server), timeout=10.0)
        try:
            expected = decode_status(body)
            assert await source.poll(), source.last_error  # health poll
            assert await source.fetch(max_age=5.0) == expected  # scrape from the poll's body
            assert server.requests == 1
            assert await source.fetch(max_age=0) == expected  # scrape fetching fresh
            assert await source.poll(), source.last_error
            assert server.requests == 3
            assert source.fetch_errors_total == 0 and source.last_error is None
            assert source.extensions() is not None
        finally:
            await source.close()


async def test_plain_document_polls_feed_the_deriver(serve: Serve, big_plain: bytes) -> None:
    """Health polls of a plain cuzk document are decoded whole: the deriver sees each one."""
    server = PieceServer(big_plain, framing="chunked")
    source = StatusSource(await serve(server), timeout=10.0)
    try:
        assert await source.poll()
        ext = source.extensions()
        assert ext is not None and ext.backend == "cuzk"
        synthesized = sum(kind.get("synth_done", 0) for kind in ext.phase_transitions.values())
        assert synthesized > 0
    finally:
        await source.close()


@pytest.mark.parametrize("framing", ["length", "chunked"])
async def test_body_over_the_cap_is_refused_naming_the_cap(
        serve: Serve, framing: Framing, big_with_extensions: bytes) -> None:
    server = PieceServer(big_with_extensions, framing=framing)
    source = StatusSource(await serve(server), timeout=10.0, max_bytes=100_000)
    try:
        assert not await source.poll()
        assert source.last_error == "status document larger than 100000 bytes"
        assert await source.fetch(max_age=0) is None
        assert source.fetch_errors_total == 2
    finally:
        await source.close()


async def _poll_error(address: str, timeout: float = 5.0) -> str:
    source = StatusSource(address, timeout=timeout)
    try:
        assert not await source.poll()
        assert await source.fetch(max_age=10.0) is None
        assert source.fetch_errors_total == 2
        assert source.last_error is not None
        return source.last_error
    finally:
        await source.close()


def _minimal_document() -> dict[str, object]:
    raw: dict[str, object] = json.loads(big_document(0, extensions=False))
    return raw


async def test_each_failure_says_why(serve: Serve, tmp_path: Path) -> None:
    hung = await serve(PieceServer(b"", hang=True))
    assert await _poll_error(hung, timeout=0.3) == f"no answer from {hung} within 0.3s"

    error = await _poll_error(await serve(PieceServer(b"boom: worker pool gone", status=500)))
    assert error == "HTTP 500 Internal Server Error: 'boom: worker pool gone'"

    error = await _poll_error(await serve(PieceServer(b"\xff\xfethis is not json")))
    assert error.startswith("invalid status document: JSON is malformed")
    assert error.endswith("(body starts '\ufffd\ufffdthis is not json')")

    wrong_shape = _minimal_document()
    del wrong_shape["memory"]
    error = await _poll_error(await serve(PieceServer(json.dumps(wrong_shape).encode())))
    assert error.startswith("invalid status document: Object missing required field `memory`")


async def test_refused_names_the_address(tmp_path: Path) -> None:
    address = f"unix:{tmp_path / 'nobody.sock'}"
    error = await _poll_error(address)
    assert error == f"cannot connect to {address}: No such file or directory"


async def test_deep_schema_error_fails_the_scrape_then_the_health_polls(serve: Serve) -> None:
    """Once an engine serves documents with extensions, a poll checks only that an object came
    back; the scrape's decode finds the document is none (a section is not an object), and
    from then on polls decode whole, so the engine is unhealthy, not half-healthy."""
    good = big_document(0, extensions=True)
    doc: dict[str, object] = json.loads(good)
    doc["counters"] = "exploded"
    server = PieceServer(good)
    source = StatusSource(await serve(server), timeout=5.0)
    try:
        assert await source.poll()  # the first poll decodes: documents with extensions
        server.body = json.dumps(doc).encode()
        assert await source.poll()  # not decoded
        assert await source.fetch(max_age=10.0) is None
        assert source.last_error is not None
        assert "Expected `object`, got `str` - at `$.counters`" in source.last_error
        assert not await source.poll()
        assert source.fetch_errors_total == 2
    finally:
        await source.close()


async def test_undecoded_polls_still_find_garbage(serve: Serve) -> None:
    """Without scrapes, an engine that starts serving garbage is unhealthy within
    DECODE_EVERY polls (at once when the body is not even an object)."""
    server = PieceServer(big_document(0, extensions=True))
    source = StatusSource(await serve(server), timeout=5.0)
    try:
        assert await source.poll()
        server.body = b"{ truncated by a broken proxy"
        assert not await source.poll()
        assert source.last_error == ("invalid status document: not a JSON object "
                                     "(body starts '{ truncated by a broken proxy')")
        server.body = big_document(0, extensions=True)
        assert await source.poll()  # decoded (after a failure), light again
        server.body = b'{"uptime_secs": "soon"}'
        results = [await source.poll() for _ in range(DECODE_EVERY + 2)]
        first_failure = results.index(False)
        assert 0 < first_failure < DECODE_EVERY
        assert not any(results[first_failure:])  # from then on every poll decodes
        assert source.last_error is not None
        assert source.last_error.startswith(
            "invalid status document: Object missing required field `memory`")
    finally:
        await source.close()


@pytest.mark.parametrize("data", [b"", b"{}", b'  {"a": 1}\n', b" " * 70 + b"{}",
                                  b"{" + b"x" * 200 + b"}", b"[1]", b"{" + b" " * 100])
@pytest.mark.parametrize("piece", [1, 3, 64, 65, 1000])
def test_a_body_kept_in_chunks_reads_as_its_bytes(data: bytes, piece: int) -> None:
    chunks = [data[i:i + piece] for i in range(0, len(data), piece)]
    body = Body([b"", *chunks, b""])  # aiohttp may hand over empty chunks too
    for n in (0, 1, 2, 64, 65, len(data) + 5):
        assert body.head(n) == data[:n]
        assert body.tail(n) == data[len(data) - min(n, len(data)):]
    whole = data[:64].lstrip()[:1] == b"{" and data[-64:].rstrip()[-1:] == b"}"
    assert looks_like_object(body) == whole
    assert body.whole() == data
    assert body.head(3) == data[:3]


def _wrapped(body: bytes) -> bytes:
    """``body`` with ``buffers.synth_in_flight`` wrapped below zero, as a real cuzk's PoSt
    path leaves it."""
    doc = json.loads(body)
    doc["buffers"]["synth_in_flight"] = 2**64 - 1
    return json.dumps(doc).encode()


async def test_an_odd_value_keeps_the_engine_healthy_counted_once_per_document(
        serve: Serve) -> None:
    """The poll succeeds, the value is left out and named, counted once per document decoded
    (not again when a scrape reads the same document) and logged once per 10 s."""
    plain = big_document(0, extensions=False)
    server = PieceServer(_wrapped(plain))
    source = StatusSource(await serve(server), timeout=5.0)
    try:
        with structlog.testing.capture_logs() as logs:
            assert await source.poll(), source.last_error
            doc = await source.fetch(max_age=10.0)  # the poll's document, decoded once
            assert doc is not None and doc.buffers.synth_in_flight is None
            assert doc.buffers.provers_in_flight is not None
            assert source.last_error is None and source.fetch_errors_total == 0
            assert source.field_errors_total == {"out_of_range": 1}
            assert source.field_errors == ("left out: Expected `int` <= 9223372036854775807 "
                                           "- at `$.buffers.synth_in_flight`")
            assert await source.poll() and await source.poll()
            assert source.field_errors_total == {"out_of_range": 3}
        assert [e["event"] for e in logs] == ["engine_status_fields_left_out"]
        assert logs[0]["reasons"] == {"out_of_range": 1}
        server.body = plain
        assert await source.poll()
        assert source.field_errors is None and source.field_errors_total == {"out_of_range": 3}
    finally:
        await source.close()


@pytest.mark.parametrize("extensions", [True, False])
async def test_a_document_nested_too_deep_is_an_invalid_document(
        serve: Serve, extensions: bool) -> None:
    """msgspec raises RecursionError, not a DecodeError, for an unknown key 1000 deep: the
    document is invalid like any other, whether a poll decodes it or a scrape does."""
    good = big_document(0, extensions=extensions)
    deep = good.rstrip()[:-1] + b', "k": ' + b'{"k": ' * 1000 + b"0" + b"}" * 1001
    server = PieceServer(good)
    source = StatusSource(await serve(server), timeout=5.0)
    try:
        assert await source.poll()
        server.body = deep
        if extensions:  # a light poll: only its ends are checked; the scrape decodes it
            assert await source.poll()
            assert await source.fetch(max_age=10.0) is None
        assert not await source.poll()
        assert source.last_error is not None
        assert source.last_error.startswith(
            "invalid status document: RecursionError: maximum recursion depth exceeded")
    finally:
        await source.close()


class _BuggyDeriver(ExtensionDeriver):
    """A deriver with a bug that any document sets off."""

    def observe(self, doc: StatusDocument) -> None:
        raise ZeroDivisionError("a supervisor bug")


async def test_a_deriver_failure_costs_the_derived_counters_never_the_engines_health(
        serve: Serve) -> None:
    """The poll of an engine that answered succeeds; the failure is logged with its traceback
    and a fresh deriver takes over."""
    server = PieceServer(big_document(0, extensions=False))
    derivers = iter([_BuggyDeriver(), ExtensionDeriver()])
    source = StatusSource(await serve(server), timeout=5.0, deriver=lambda: next(derivers))
    try:
        with structlog.testing.capture_logs() as logs:
            assert await source.poll(), source.last_error
        assert [(e["event"], e["log_level"]) for e in logs] == [("status_derive_failed", "error")]
        assert logs[0]["exc_info"] is True
        assert await source.poll()  # a fresh deriver, which works
        ext = source.extensions()
        assert ext is not None and ext.phase_transitions
        assert source.fetch_errors_total == 0
    finally:
        await source.close()


async def test_no_answer_during_a_start_is_not_counted_a_wrong_answer_is(tmp_path: Path) -> None:
    """While the owner says the engine starts, a fetch nothing answers (no socket yet, a hang)
    is its start: named in last_error, not counted; an HTTP error or garbage counts; once the
    owner says the start is over, no answer counts too."""
    starting = [True]
    sock = tmp_path / "status.sock"
    source = StatusSource(f"unix:{sock}", timeout=0.2, starting=lambda: starting[0])
    server = PieceServer(b"not json", framing="length")
    try:
        assert not await source.poll()
        assert "No such file" in str(source.last_error)
        assert (source.fetch_errors_total, source.last_error_counted) == (0, False)
        await server.start_unix(sock)
        server.hang = True
        assert not await source.poll()
        assert source.last_error_kind == "timeout" and source.fetch_errors_total == 0
        server.hang = False
        assert not await source.poll()  # garbage: a wrong answer
        assert source.last_error_kind == "invalid" and source.last_error_counted
        server.status = 500
        assert await source.fetch(max_age=0) is None
        assert source.last_error_kind == "http_500" and source.fetch_errors_total == 2
        starting[0] = False
        server.hang = True
        assert not await source.poll()
        assert source.fetch_errors_total == 3
    finally:
        await source.close()
        await server.close()


def test_the_clock_passed_in_times_the_fetches_and_ages_the_kept_document(
        tmp_path: Path) -> None:
    """On virtual time (the clock a runner on a virtual loop passes in) a reply 3 s late took
    3 s, and a document kept 5 s is too old for a scrape accepting 5 s -- although next to no
    real time passed."""
    async def main() -> tuple[float | None, int, int]:
        server = PieceServer(big_document(0, extensions=True), delay=3.0)
        address = await server.start_unix(tmp_path / "status.sock")
        source = StatusSource(address, timeout=10.0, clock=asyncio.get_running_loop().time)
        try:
            assert await source.poll(), source.last_error
            duration = source.last_fetch_duration_seconds
            assert await source.fetch(max_age=5.0) is not None
            kept = server.requests
            await asyncio.sleep(5.0)
            assert await source.fetch(max_age=5.0) is not None
            return duration, kept, server.requests
        finally:
            await source.close()
            await server.close()

    duration, kept, fetched = run_virtual(main)
    assert duration is not None and 3.0 <= duration < 3.1
    assert (kept, fetched) == (1, 2)
