"""The engine's HTTP API in-process, over a real TCP socket: what needs no engine process.

A client that announces a body longer than it sends would hold a handler and a connection for
good if the body were awaited without limit; here it gets a JSON 408 after the body timeout,
while a complete body sent slowly, within it, is served.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import pytest
from aiohttp.test_utils import TestServer
from support.bundled_inprocess import make_engine

from cuzkd.bundled.server import build_app

BODY_TIMEOUT = 0.5


@pytest.fixture
async def server() -> AsyncIterator[TestServer]:
    engine = make_engine(2**26)
    async with TestServer(build_app(engine, body_timeout=BODY_TIMEOUT)) as served:
        yield served
    await engine.close()


async def exchange(server: TestServer, path: str, pieces: list[bytes], announced: int,
                   pause: float = 0.0) -> tuple[int, dict[str, object]]:
    """POST ``pieces`` with Content-Length ``announced``; (status, JSON body) of the answer."""
    reader, writer = await asyncio.open_connection(server.host, server.port)
    try:
        writer.write(f"POST {path} HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
                     f"Content-Length: {announced}\r\n\r\n".encode())
        for piece in pieces:
            writer.write(piece)
            await writer.drain()
            await asyncio.sleep(pause)  # pacing the client, not waiting for the server
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), BODY_TIMEOUT * 20)
        status = int(head.split()[1])
        length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n")
                      if line.lower().startswith(b"content-length:"))
        return status, json.loads(await reader.readexactly(length))
    finally:
        writer.close()


@pytest.mark.parametrize("path", ["/v1/jobs", "/v1/drain"])
async def test_a_body_shorter_than_announced_gets_a_json_408(server: TestServer,
                                                             path: str) -> None:
    status, body = await exchange(server, path, [b'{"proof_kind": "snap-update"'], announced=100)
    assert status == 408
    assert body == {"error": f"the request body did not arrive within {BODY_TIMEOUT:g}s"}


async def test_a_whole_body_sent_slowly_within_the_timeout_is_served(server: TestServer) -> None:
    request = b'{"proof_kind": "winning-post", "size_log2": 6}'
    status, body = await exchange(server, "/v1/jobs", [request[:10], request[10:]],
                                  announced=len(request), pause=BODY_TIMEOUT / 5)
    assert status == 202 and body["state"] in ("queued", "running", "done"), body


@pytest.mark.parametrize(("typed", "warned"), [
    ("winning-post", False), ("winning_post", False), ("winning", True)])
async def test_a_job_by_any_spelling_of_a_kind_is_taken_under_cuzks_name(
        server: TestServer, typed: str, warned: bool) -> None:
    """An old name (a script written before the rename) is accepted all the same, and the
    reply says what to write; the job is the kind's, under cuzk's name, either way."""
    request = json.dumps({"proof_kind": typed, "size_log2": 6}).encode()
    status, body = await exchange(server, "/v1/jobs", [request], announced=len(request))
    assert status == 202, body
    assert body["proof_kind"] == "winning-post"
    assert str(body["job_id"]).startswith("ref-winning-post-")
    assert ("deprecation" in body) == warned
    if warned:
        assert "'winning-post'" in str(body["deprecation"])
