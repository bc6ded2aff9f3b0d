"""The /metrics handler on a real loopback aiohttp server."""

from __future__ import annotations

import gzip

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from prometheus_client.openmetrics.parser import text_string_to_metric_families as parse_om

from cuzkd.metrics.door_metrics import DoorMetrics
from cuzkd.metrics.http import make_metrics_handler
from cuzkd.metrics.sample import SupervisorSample
from cuzkd.states import DoorRefusal


@pytest.fixture
async def client(example_status, example_extensions, make_engine):
    failing = {"now": False}

    async def provider() -> SupervisorSample:
        if failing["now"]:
            raise RuntimeError("supervisor blew up")
        return SupervisorSample(
            engines=[make_engine("e0", status=example_status, extensions=example_extensions)],
            zombies_reaped_total=0)

    app = web.Application()
    app.router.add_get("/metrics", make_metrics_handler(provider))
    async with TestClient(TestServer(app)) as c:
        c.failing = failing  # type: ignore[attr-defined]
        yield c


async def test_text_format_by_default(client):
    resp = await client.get("/metrics", headers={"Accept-Encoding": "identity"})
    assert resp.status == 200
    assert resp.headers["Content-Type"].startswith("text/plain; version=0.0.4")
    assert "Content-Encoding" not in resp.headers
    text = await resp.text()
    assert 'cuzk_gpu_worker_busy{engine="e0",gpu="0",worker="0"} 1.0' in text
    assert "process_resident_memory_bytes " in text
    assert "# EOF" not in text


async def test_openmetrics_when_asked(client):
    resp = await client.get("/metrics", headers={
        "Accept": "application/openmetrics-text;version=1.0.0,text/plain;q=0.5",
        "Accept-Encoding": "identity"})
    assert resp.status == 200
    assert resp.headers["Content-Type"].startswith("application/openmetrics-text")
    text = await resp.text()
    assert text.endswith("# EOF\n")
    names = {f.name for f in parse_om(text)}
    assert {"cuzk_gpu_worker_busy_seconds", "cuzkd_build", "cuzkd_engine_up"} <= names


async def test_gzip_when_asked(client):
    resp = await client.get("/metrics", headers={"Accept-Encoding": "gzip"},
                            auto_decompress=False)
    assert resp.status == 200
    assert resp.headers["Content-Encoding"] == "gzip"
    text = gzip.decompress(await resp.read()).decode()
    assert "cuzkd_engine_up{engine=\"e0\"} 1.0" in text


async def test_provider_failure_is_a_500_and_the_next_scrape_works(client):
    client.failing["now"] = True
    resp = await client.get("/metrics")
    assert resp.status == 500
    assert await resp.text() == "metrics unavailable: RuntimeError\n"
    client.failing["now"] = False
    resp = await client.get("/metrics")
    assert resp.status == 200
    assert "cuzkd_engine_up" in await resp.text()


async def test_the_supervisors_own_collectors_are_rendered_with_each_scrape(make_engine):
    doors = DoorMetrics()

    async def provider() -> SupervisorSample:
        return SupervisorSample(engines=[make_engine("e0")], zombies_reaped_total=0)

    app = web.Application()
    app.router.add_get("/metrics", make_metrics_handler(provider, collectors=[doors]))
    async with TestClient(TestServer(app)) as c:
        assert "cuzkd_door_" not in await (await c.get("/metrics")).text()
        doors.refused("e0", DoorRefusal.SHUTTING_DOWN)  # counted between two scrapes: in the next
        text = await (await c.get("/metrics")).text()
    assert ('cuzkd_door_refusals_total{door="e0",proof_kind="none",reason="shutting_down"} 1.0'
            in text)
    assert 'cuzkd_engine_up{engine="e0"}' in text
