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
import threading
from collections.abc import AsyncIterator, Callable, Iterator
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
    password_hash,
    write_web_config,
)
from support.waiting import until

from cuzkd.config import Config
from cuzkd.config.webconfig import read_web_config
from cuzkd.log.ratelimit import LimitedLog
from cuzkd.metrics.sample import SupervisorSample
from cuzkd.supervisor.daemon.startup import exposure, startup_fields
from cuzkd.supervisor.web import basicauth
from cuzkd.supervisor.web.access import WebAccess
from cuzkd.supervisor.web.basicauth import MAX_WAITING, BasicAuth
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


async def test_a_flood_of_wrong_passwords_is_bounded_and_never_logged(
        serve: Any, tls: TlsFiles) -> None:
    """200 distinct wrong passwords on 16 connections against a cost-8 hash (~20 ms a
    round): one round at a time, at most 8 waiting (the rest refused without one), one log
    line, no password or hash in any; the scraper, already verified, is answered meanwhile."""
    hashed = bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(8)).decode()
    served: Served = await serve(f"tls_server_config:\n  cert_file: {tls.cert}\n"
                                 f"  key_file: {tls.key}\nbasic_auth_users:\n"
                                 f"  {USER}: '{hashed}'\n", idle=10)
    auth = served.access.auth
    assert auth is not None
    connector = aiohttp.TCPConnector(limit=16)
    async with aiohttp.ClientSession(connector=connector) as session:
        async def get(password: str) -> int:
            async with session.get(served.url("/status"), ssl=served.client_tls,
                                   headers=basic_auth(password)) as response:
                await response.read()
                return response.status

        assert await get(PASSWORD) == 200
        with structlog.testing.capture_logs() as logs:
            flood = [asyncio.ensure_future(get(f"guess-{i}")) for i in range(200)]
            await until(lambda: auth.busy_refused > 0, "requests refused without a round")
            assert await get(PASSWORD) == 200  # cached: no wait behind the flood's rounds
            assert set(await asyncio.gather(*flood)) == {401}
    assert auth.bcrypt_rounds < 100  # the rest were refused without a round
    refused = [line for line in logs if line["event"] == "metrics_auth_refused"]
    assert len(refused) == 1
    text = repr(logs)
    assert "guess-" not in text and hashed not in text and PASSWORD not in text


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


@dataclass
class Rounds:
    """bcrypt's rounds run while ``go`` is set (it is at first): cleared, a round waits in its
    thread, so a flood keeps bcrypt's queue full for as long as a test needs, with no timing.
    ``checked``: the passwords bcrypt was given, in order."""

    go: threading.Event
    checked: list[bytes]


@pytest.fixture
def rounds(monkeypatch: pytest.MonkeyPatch) -> Iterator[Rounds]:
    held = Rounds(threading.Event(), [])
    held.go.set()
    checkpw = basicauth._checkpw

    def checked(password: bytes, hashed: bytes) -> bool:
        held.checked.append(password)
        held.go.wait(60)
        return checkpw(password, hashed)

    monkeypatch.setattr(basicauth, "_checkpw", checked)
    yield held
    held.go.set()  # whatever happened


@pytest.fixture
def bcrypt_costs(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The cost of each hash bcrypt is given, in order."""
    costs: list[int] = []
    checkpw = basicauth._checkpw

    def recorded(password: bytes, hashed: bytes) -> bool:
        costs.append(int(hashed[4:6]))  # $2b$NN$...
        return checkpw(password, hashed)

    monkeypatch.setattr(basicauth, "_checkpw", recorded)
    return costs


def _header(password: str, user: str = USER) -> str:
    return basic_auth(password, user)["Authorization"]


#: Wrong-password floods: the addresses they come from, the user each guess names.
FLOODS: dict[str, tuple[list[str], Callable[[int], str]]] = {
    "the scraper's user, from other loopback addresses":
        ([f"127.0.0.{2 + i}" for i in range(16)], lambda i: USER),
    "random users, from other loopback addresses":
        ([f"127.0.0.{2 + i}" for i in range(16)], lambda i: f"user-{i}"),
    "another user, from the scraper's address": (["127.0.0.1"], lambda i: "admin"),
}


@pytest.mark.parametrize("flood", list(FLOODS))
async def test_after_a_restart_the_right_password_gets_through_a_flood(
        serve: Any, rounds: Rounds, flood: str) -> None:
    """A flood of wrong passwords (its rounds held) keeps every place in bcrypt's queue when
    cuzkd restarts -- a fresh WebAccess on the same file, nothing cached: Prometheus's first
    scrape (from 127.0.0.1) takes the place of the flood's newest request, the flood's next
    ones are refused without taking it back, and once the rounds go on it is checked first and
    answered 200. Refusing every newcomer once 8 wait, cuzkd answered it 401 for as long as the
    flood lasted."""
    addresses, user = FLOODS[flood]
    before: Served = await serve(limit=64, idle=10)
    restarted: Served = await serve(limit=64, idle=10)
    auth = restarted.access.auth
    assert auth is not None
    floods = [aiohttp.ClientSession(connector=aiohttp.TCPConnector(local_addr=(address, 0)))
              for address in addresses]
    async with aiohttp.ClientSession() as scraper:
        async def scrape(served: Served) -> int:
            async with scraper.get(served.url("/metrics"), ssl=served.client_tls,
                                   headers=basic_auth(PASSWORD)) as response:
                await response.read()
                return response.status

        async def guess(i: int) -> int:
            session = floods[i % len(floods)]
            async with session.get(restarted.url("/metrics"), ssl=restarted.client_tls,
                                   headers=basic_auth(f"guess-{i}", user(i))) as response:
                await response.read()
                return response.status

        waves: list[asyncio.Future[int]] = []
        second: list[asyncio.Future[int]] = []
        try:
            assert await scrape(before) == 200  # before the restart: verified, cached
            rounds.go.clear()
            waves.append(asyncio.ensure_future(guess(0)))
            await until(lambda: auth.bcrypt_rounds == 1, "the flood's first round")
            waves += [asyncio.ensure_future(guess(i)) for i in range(1, 3 * MAX_WAITING)]
            await until(lambda: auth.busy_refused >= 2 * MAX_WAITING - 1, "the queue full")
            refused = auth.busy_refused
            scraped = asyncio.ensure_future(scrape(restarted))
            await until(lambda: auth.busy_refused > refused, "the scrape in, or refused")
            second += [asyncio.ensure_future(guess(i))
                       for i in range(3 * MAX_WAITING, 6 * MAX_WAITING)]
            await until(lambda: all(g.done() for g in second), "the flood's next wave refused")
            assert not scraped.done(), "the scrape was refused"
            assert (auth.displaced, auth.waiting) == (1, MAX_WAITING)
            rounds.go.set()
            assert await scraped == 200
            assert set(await asyncio.gather(*waves, *second)) == {401}
            assert auth.bcrypt_rounds == 1 + MAX_WAITING  # the one in its round, then the queue
            # before the restart, the flood's held round, then the scrape before the flood's
            assert rounds.checked[:3] == [PASSWORD.encode(), b"guess-0", PASSWORD.encode()]
            assert await scrape(restarted) == 200  # cached now
            assert auth.bcrypt_rounds == 1 + MAX_WAITING
        finally:
            rounds.go.set()
            await asyncio.gather(*waves, *second, return_exceptions=True)
            for session in floods:
                await session.close()


def test_a_requests_source_is_its_address_its_hosts_or_its_64() -> None:
    """Loopback's addresses but 127.0.0.1 are one source (any process may bind them all), an
    IPv6 address counts by its /64, an IPv4-mapped one as the IPv4 address."""
    source = basicauth.source
    assert source("127.0.0.1") == "127.0.0.1"
    assert source("::1") == "::1"
    assert source("127.0.0.2") == source("127.254.3.4") == source("::ffff:127.0.0.9") \
        == "127.0.0.0/8"
    assert source("192.0.2.1") == source("::ffff:192.0.2.1") == "192.0.2.1"
    assert source("192.0.2.2") != source("192.0.2.1")
    assert source("2001:db8::1") == source("2001:db8::ffff:0:1") == "2001:db8::/64"
    assert source("2001:db8:0:1::1") == "2001:db8:0:1::/64"
    assert source(None) == source("") == source("not an address") == ""


async def test_a_flood_from_many_addresses_and_users_keeps_to_the_queue(
        rounds: Rounds) -> None:
    """2,000 guesses, each from an address of its own (127.0.0.0/8 and one IPv6 /64) naming a
    user of its own, the first one's round held: 8 wait, the rest are refused at once, nothing
    else is kept per address or user, and the scraper on 127.0.0.1 still takes a place."""
    auth = BasicAuth({USER: password_hash()})
    rounds.go.clear()
    first = asyncio.ensure_future(auth.allows(_header("guess"), "127.0.0.2"))
    await until(lambda: auth.bcrypt_rounds == 1, "the first guess's round")
    peers = [f"127.{i >> 16 & 255}.{i >> 8 & 255}.{i & 255}" if i % 2
             else f"2001:db8::{i:x}" for i in range(3, 2003)]
    guesses = [asyncio.ensure_future(auth.allows(_header(f"guess-{i}", f"user-{i}"), peer))
               for i, peer in enumerate(peers)]
    await until(lambda: sum(g.done() for g in guesses) == len(guesses) - MAX_WAITING,
                "the guesses beyond the queue refused")
    sizes = {name: len(value) for name, value in vars(auth).items()
             if hasattr(value, "__len__") and not isinstance(value, str | bytes)}
    assert max(sizes.values()) <= MAX_WAITING, sizes
    assert (auth.waiting, auth.busy_refused) == (MAX_WAITING, len(guesses) - MAX_WAITING)
    honest = asyncio.ensure_future(auth.allows(_header(PASSWORD), "127.0.0.1"))
    await until(lambda: auth.displaced == 1, "the scraper in the flood's newest place")
    rounds.go.set()
    assert await honest
    assert not any(await asyncio.gather(first, *guesses))
    assert auth.bcrypt_rounds == 1 + MAX_WAITING
    assert rounds.checked.index(PASSWORD.encode()) == 1  # next after the held round


async def test_an_unknown_user_costs_what_the_costliest_known_one_costs(
        bcrypt_costs: list[int]) -> None:
    """bcrypt's cost, not the clock: an unknown user's check runs at the highest cost among
    the users' hashes (a fixed cost-10 hash against bcrypt's default 12 told which users
    exist: 51 against 192 ms), with a hash bcrypt reads (one it refused would cost nothing)."""
    auth = BasicAuth({USER: password_hash(cost=4), "alice": password_hash("a", cost=5)})
    for user in (USER, "alice", "nobody", "alice"):
        assert not await auth.allows(_header(f"wrong-{len(bcrypt_costs)}", user))
    assert bcrypt_costs == [4, 5, 5, 5]
    unknown = auth.no_user_hash
    assert int(unknown[4:6]) == 5
    assert not bcrypt.checkpw(b"", unknown)  # read, computed and refused: no ValueError
    assert not bcrypt.checkpw(b"wrong", unknown)


async def test_the_unknown_users_cost_follows_a_re_read_file(
        tmp_path: Path, bcrypt_costs: list[int]) -> None:
    """A rotation that raises (or lowers) the costliest hash moves the unknown user's with it
    at the next look, before any request is checked."""
    path = tmp_path / "web.yml"

    def write(users: dict[str, int]) -> None:
        path.write_text("basic_auth_users:\n" + "".join(
            f"  {user}: '{password_hash(cost=cost)}'\n" for user, cost in users.items()),
                        encoding="utf-8")

    write({USER: 4})
    access = WebAccess(str(path), LimitedLog())

    async def unknown_cost() -> int:
        access.refresh()
        assert access.last_reload_ok and access.auth is not None
        assert not await access.auth.allows(_header(f"guess-{len(bcrypt_costs)}", "nobody"))
        return bcrypt_costs[-1]

    assert await unknown_cost() == 4
    write({USER: 4, "alice": 6})  # a different size: seen by stat whatever the clock
    assert await unknown_cost() == 6
    write({"alice": 5})
    assert await unknown_cost() == 5
