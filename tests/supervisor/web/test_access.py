"""TLS and basic auth on the metrics listener: real TLS over real sockets, in-process.

The listener, the metrics app and :class:`WebAccess` are the daemon's own, served on loopback;
only the supervisor behind them is a stand-in. Certificates are made per module by openssl.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
import ssl
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import bcrypt
import pytest
import structlog
from aiohttp import web
from support.tlsfiles import (
    PASSWORD,
    USER,
    TlsFiles,
    basic_auth,
    make_tls_files,
    write_web_config,
)
from support.waiting import until

from cuzkd.config import Config
from cuzkd.config.webconfig import read_web_config
from cuzkd.log.ratelimit import LimitedLog
from cuzkd.metrics.sample import SupervisorSample
from cuzkd.supervisor.daemon.startup import exposure, startup_fields
from cuzkd.supervisor.web.access import WebAccess
from cuzkd.supervisor.web.basicauth import BasicAuth
from cuzkd.supervisor.web.listener import GatedListener
from cuzkd.supervisor.web.metrics_routes import build_metrics_app
from cuzkd.supervisor.web.outbox import Outbox

#: Seconds a connection (and a handshake) may stay silent here: short, so tests end fast.
IDLE = 0.5


#: /status of the stand-in: several of the outbox's 16 KiB slices.
STATUS_BODY = b'{"engines": [' + b'"x", ' * 40_000 + b'"x"]}'


class _Supervisor:
    async def sample(self, max_age: float = 1.0) -> SupervisorSample:
        del max_age
        return SupervisorSample(engines=[], zombies_reaped_total=0)

    async def status_body(self) -> bytes:
        return STATUS_BODY


@dataclass
class Served:
    access: WebAccess
    listener: GatedListener
    port: int
    client_tls: ssl.SSLContext

    def url(self, path: str) -> str:
        return f"https://127.0.0.1:{self.port}{path}"


@pytest.fixture(scope="module")
def tls(tmp_path_factory: pytest.TempPathFactory) -> TlsFiles:
    return make_tls_files(tmp_path_factory.mktemp("tls"))


def _client_tls(tls: TlsFiles, *, cert: bool = False) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=str(tls.ca))
    if cert:
        context.load_cert_chain(str(tls.client_cert), str(tls.client_key))
    return context


@pytest.fixture
async def serve(tls: TlsFiles, tmp_path: Path) -> AsyncIterator[Callable[..., Any]]:
    """serve(web_config_text=None, limit=16, idle=IDLE) -> Served; the web config is written
    to tmp_path/web.yml (default: TLS with the module's pair, USER with PASSWORD)."""
    cleanups: list[Callable[[], Any]] = []

    async def start(text: str | None = None, limit: int = 16, idle: float = IDLE) -> Served:
        path = tmp_path / "web.yml"
        if text is None:
            write_web_config(path, tls)
        else:
            path.write_text(text, encoding="utf-8")
        access = WebAccess(str(path), LimitedLog())
        runner = web.AppRunner(build_metrics_app(_Supervisor(), Outbox(), access),
                               access_log=None)
        await runner.setup()
        assert runner.server is not None
        listener = GatedListener(runner.server, limit=lambda: limit, idle=idle, tls=access.tls)
        [(_, port)] = await listener.start("127.0.0.1", 0)
        cleanups.extend([listener.close, runner.cleanup])
        return Served(access, listener, port, _client_tls(tls))

    yield start
    for cleanup in cleanups:
        result = cleanup()
        if asyncio.iscoroutine(result):
            await result


async def test_every_route_but_healthz_asks_for_credentials(serve: Any, tls: TlsFiles) -> None:
    served: Served = await serve(write_web_config(Path(tls.dir / "h.yml"), tls).read_text()
                                 + "http_server_config:\n  headers:\n"
                                   "    X-Frame-Options: deny\n")
    async with aiohttp.ClientSession() as session:
        for path in ("/metrics", "/status", "/no-such-route"):
            for headers in ({}, basic_auth("wrong"), basic_auth(PASSWORD, "nobody"),
                            {"Authorization": "Basic !!!"}, {"Authorization": "Bearer x"}):
                async with session.get(served.url(path), ssl=served.client_tls,
                                       headers=headers) as response:
                    assert response.status == 401, (path, headers)
                    assert response.headers["WWW-Authenticate"].startswith('Basic realm=')
                    assert response.headers["X-Frame-Options"] == "deny"
                    assert (await response.json())["error"].startswith("unauthorized")
        async with session.get(served.url("/healthz"), ssl=served.client_tls) as response:
            assert response.status == 200  # a liveness probe needs no password
        good = basic_auth(PASSWORD)
        async with session.get(served.url("/metrics"), ssl=served.client_tls,
                               headers=good) as response:
            assert response.status == 200
            assert response.headers["X-Frame-Options"] == "deny"
            assert "cuzkd_metrics_auth_refused_total" in await response.text()
        async with session.get(served.url("/no-such-route"), ssl=served.client_tls,
                               headers=good) as response:
            assert response.status == 404
    assert served.access.refused_total == 15


async def test_a_verified_password_costs_no_bcrypt_round_again(serve: Any) -> None:
    """Five scrapes on one kept-alive connection: one bcrypt round, one handshake, and each
    body of many slices arrives whole over TLS."""
    served: Served = await serve()
    auth = served.access.auth
    assert auth is not None
    async with aiohttp.ClientSession() as session:
        for _ in range(5):
            async with session.get(served.url("/status"), ssl=served.client_tls,
                                   headers=basic_auth(PASSWORD)) as response:
                assert response.status == 200
                assert await response.read() == STATUS_BODY
    assert auth.bcrypt_rounds == 1
    assert served.listener.handshakes_total == 1


async def _flood_config(serve: Any, tls: TlsFiles) -> tuple[Served, BasicAuth, str]:
    """A listener whose user has a cost-8 hash (~20 ms a round): rounds that take a while;
    room for more connections than a flood opens (the daemon's limit is the descriptor
    limit's)."""
    hashed = bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(8)).decode()
    served: Served = await serve(f"tls_server_config:\n  cert_file: {tls.cert}\n"
                                 f"  key_file: {tls.key}\nbasic_auth_users:\n"
                                 f"  {USER}: '{hashed}'\n", idle=10, limit=64)
    auth = served.access.auth
    assert auth is not None
    return served, auth, hashed


async def _get(session: aiohttp.ClientSession, served: Served, password: str) -> int:
    async with session.get(served.url("/status"), ssl=served.client_tls,
                           headers=basic_auth(password)) as response:
        await response.read()
        if response.status == 429:
            assert response.headers["Retry-After"] == "1"
        return response.status


async def test_a_flood_of_wrong_passwords_is_bounded_and_never_logged(
        serve: Any, tls: TlsFiles) -> None:
    """200 distinct wrong passwords on 16 connections from one address: one round at a
    time, at most two of its checks waiting (the rest answered 429 without a round), one log
    line of each kind, no password or hash in any; the scraper, already verified, is answered
    meanwhile from the cache."""
    served, auth, hashed = await _flood_config(serve, tls)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=16)) as session:
        assert await _get(session, served, PASSWORD) == 200
        with structlog.testing.capture_logs() as logs:
            flood = [asyncio.ensure_future(_get(session, served, f"guess-{i}"))
                     for i in range(200)]
            await until(lambda: auth.throttled > 0, "requests throttled without a round")
            assert await _get(session, served, PASSWORD) == 200  # cached: no wait at all
            statuses = await asyncio.gather(*flood)
    assert set(statuses) == {401, 429}
    assert statuses.count(429) == auth.throttled == served.access.throttled_total
    assert statuses.count(401) == auth.bcrypt_rounds - 1  # each 401 had its round
    events = [line["event"] for line in logs]
    assert events.count("metrics_auth_refused") == 1
    assert events.count("metrics_auth_throttled") == 1
    text = repr(logs)
    assert "guess-" not in text and hashed not in text and PASSWORD not in text


async def test_a_right_password_never_checked_is_answered_through_a_flood(
        serve: Any, tls: TlsFiles) -> None:
    """cuzkd just started (nothing verified) and 16 connections from 127.0.0.2 send wrong
    passwords flat out: Prometheus' first scrape from 127.0.0.1 gets a round of its own and
    200, and its next ones are answered from the cache while the flood goes on."""
    served, auth, _ = await _flood_config(serve, tls)
    attacker = aiohttp.TCPConnector(limit=16, local_addr=("127.0.0.2", 0))
    stop = asyncio.Event()
    statuses: list[int] = []

    async with aiohttp.ClientSession(connector=attacker) as flooding:
        async def guess(worker: int) -> None:
            n = 0
            while not stop.is_set():
                statuses.append(await _get(flooding, served, f"guess-{worker}-{n}"))
                n += 1

        flood = [asyncio.ensure_future(guess(worker)) for worker in range(16)]
        await until(lambda: auth.throttled > 16 and 401 in statuses, "the flood under way")
        async with aiohttp.ClientSession() as prometheus:
            for _ in range(3):
                assert await _get(prometheus, served, PASSWORD) == 200
        stop.set()
        await asyncio.gather(*flood)
    assert set(statuses) == {401, 429}
    assert served.access.throttled_total == statuses.count(429)


async def test_silent_and_garbage_handshakes_are_bounded_and_closed(serve: Any) -> None:
    """A client that connects and says nothing holds a connection only until ``idle``; bytes
    that are not a ClientHello fail at once; at the limit a new one is reset; then the
    listener serves as before."""
    served: Served = await serve(limit=4)
    loop = asyncio.get_running_loop()

    async def connect() -> socket.socket:
        sock = socket.socket()
        sock.setblocking(False)
        await loop.sock_connect(sock, ("127.0.0.1", served.port))
        return sock

    async def closed(sock: socket.socket) -> bool:
        try:
            return await asyncio.wait_for(loop.sock_recv(sock, 4096), 20) == b""
        except ConnectionResetError:
            return True

    garbage = await connect()
    await loop.sock_sendall(garbage, b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n" * 4)
    assert await closed(garbage)
    await until(lambda: served.listener.handshakes_failed_total == 1, "the garbage counted")
    silent = [await connect() for _ in range(4)]
    await until(lambda: served.listener.open == 4, "four handshakes pending")
    extra = socket.socket()
    extra.setblocking(False)
    try:  # at the limit: reset at once (maybe before connect returns), not queued
        await loop.sock_connect(extra, ("127.0.0.1", served.port))
        assert await closed(extra)
    except ConnectionResetError:
        pass
    assert served.listener.refused_total == 1
    assert all([await closed(sock) for sock in silent])
    await until(lambda: served.listener.open == 0, "the silent ones closed")
    assert served.listener.handshakes_failed_total == 5
    for sock in (garbage, extra, *silent):
        sock.close()
    async with aiohttp.ClientSession() as session, \
            session.get(served.url("/healthz"), ssl=served.client_tls) as response:
        assert response.status == 200
    assert served.listener.handshakes_total == 1


async def _served_cert(served: Served) -> bytes:
    """The DER certificate a new connection is served with."""
    _, writer = await asyncio.open_connection("127.0.0.1", served.port, ssl=served.client_tls)
    der = writer.get_extra_info("ssl_object").getpeercert(binary_form=True)
    writer.close()
    return bytes(der)


def _der(path: Path) -> bytes:
    return ssl.PEM_cert_to_DER_cert(path.read_text(encoding="ascii"))


async def test_a_rotated_certificate_serves_the_next_connection(serve: Any, tls: TlsFiles,
                                                                tmp_path: Path) -> None:
    """Rotation by rename, without a restart; a broken one (a key that does not match)
    keeps the last good pair, logs once and clears when fixed; TLS cannot be turned off."""
    live = tmp_path / "live"
    live.mkdir()
    for name, source in (("tls.crt", tls.cert), ("tls.key", tls.key)):
        shutil.copy(source, live / name)
    served: Served = await serve("tls_server_config:\n  cert_file: live/tls.crt\n"
                                 "  key_file: live/tls.key\n")
    assert await _served_cert(served) == _der(tls.cert)

    def install(files: TlsFiles, *, key: bool = True) -> None:
        for name, source in (("tls.crt", files.cert), ("tls.key", files.key))[:2 if key else 1]:
            shutil.copy(source, live / f"{name}.new")
            os.replace(live / f"{name}.new", live / name)

    rotated = make_tls_files(tls.dir, "rotated")
    install(rotated)
    assert await _served_cert(served) == _der(rotated.cert)
    assert served.access.last_reload_ok
    broken = make_tls_files(tls.dir, "broken")
    with structlog.testing.capture_logs() as logs:
        install(broken, key=False)  # the certificate without its key
        for _ in range(3):
            assert await _served_cert(served) == _der(rotated.cert)
        assert not served.access.last_reload_ok
        install(broken)
        assert await _served_cert(served) == _der(broken.cert)
    assert served.access.last_reload_ok
    failed = [line for line in logs if line["event"] == "metrics_web_config_reload_failed"]
    assert len(failed) == 1
    assert "key `tls_server_config.key_file`: does not match" in failed[0]["error"]
    (tmp_path / "web.yml").write_text("basic_auth_users: {}\n", encoding="utf-8")
    assert await _served_cert(served) == _der(broken.cert)  # still TLS
    assert not served.access.last_reload_ok


async def test_a_client_certificate_when_the_policy_asks_for_one(serve: Any,
                                                                 tls: TlsFiles) -> None:
    served: Served = await serve(f"tls_server_config:\n  cert_file: {tls.cert}\n"
                                 f"  key_file: {tls.key}\n  client_ca_file: {tls.ca}\n"
                                 "  client_auth_type: RequireAndVerifyClientCert\n")
    async with aiohttp.ClientSession() as session:
        with pytest.raises(aiohttp.ClientError):
            async with session.get(served.url("/healthz"), ssl=served.client_tls) as response:
                await response.read()
        async with session.get(served.url("/healthz"),
                               ssl=_client_tls(tls, cert=True)) as response:
            assert response.status == 200
    # refused on the server's side (aiohttp may try a GET twice)
    assert served.listener.handshakes_failed_total >= 1


def test_a_listener_beyond_loopback_without_tls_and_auth_is_named_at_start(
        tmp_path: Path, tls: TlsFiles) -> None:
    """The start-up line says how the listener is protected, and ``metrics_exposed`` (also
    logged as ``metrics_listener_exposed``) when it is reachable and lacks TLS or auth."""
    secured = read_web_config(str(write_web_config(tmp_path / "s.yml", tls)))
    tls_only = read_web_config(str(write_web_config(tmp_path / "t.yml", tls, users=False)))
    auth_only = read_web_config(str(write_web_config(tmp_path / "a.yml", None)))
    for host in ("0.0.0.0", "::", "192.0.2.7"):
        assert exposure(host, secured) is None
        for lacking in (tls_only, auth_only):
            assert "reachable beyond this host" in (exposure(host, lacking) or "")
    config = Config()
    fields = startup_fields(config, "0.0.0.0", 9822, None)
    assert fields["metrics_access"] == "plain HTTP, no auth"
    assert "web_config" in fields["metrics_exposed"]
    for host in ("127.0.0.1", "::1", "127.0.0.2"):
        assert "metrics_exposed" not in startup_fields(config, host, 9822, None)
    fields = startup_fields(config, "0.0.0.0", 9822, None, secured)
    assert fields["metrics_url"] == "https://127.0.0.1:9822/metrics"
    assert fields["metrics_access"] == "TLS, basic auth"
    assert "metrics_exposed" not in fields


async def test_a_file_a_failed_re_read_named_is_watched_until_it_works(
        serve: Any, tls: TlsFiles, tmp_path: Path) -> None:
    """The web config moved to a new pair whose key is not there yet: refused; the key then
    written (the web config untouched) is seen on the next connection."""
    served: Served = await serve()
    rotated = make_tls_files(tls.dir, "moved")
    shutil.copy(rotated.cert, tmp_path / "next.crt")
    write_web_config(tmp_path / "web.yml", TlsFiles(
        tls.dir, tls.ca, tmp_path / "next.crt", tmp_path / "next.key", tls.client_cert,
        tls.client_key))
    assert await _served_cert(served) == _der(tls.cert)
    assert not served.access.last_reload_ok
    shutil.copy(rotated.key, tmp_path / "next.key")
    assert await _served_cert(served) == _der(rotated.cert)
    assert served.access.last_reload_ok
