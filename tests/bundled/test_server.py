"""``cuzkd engine`` as a real process: the HTTP API, ``cuzkd bench``, unix sockets, signals."""

from __future__ import annotations

import asyncio
import json
import os
import pty
import signal
import socket
import stat
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from cuzkd.cli.dispatch import build_parser
from cuzkd.status.document import decode_status

Start = Callable[..., Awaitable["EngineProcess"]]


class EngineProcess:
    def __init__(self, proc: subprocess.Popen[bytes], log: Path, listen: str) -> None:
        self.proc = proc
        self.log = log
        self.listen = listen
        self.address = ""

    def events(self) -> list[dict[str, Any]]:
        out = []
        for line in self.log.read_text().splitlines():
            if line.startswith("{"):
                out.append(json.loads(line))
        return out

    async def wait_event(self, name: str, timeout: float = 20.0) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while True:
            found = [e for e in self.events() if e.get("event") == name]
            if found:
                return found[0]
            assert self.proc.poll() is None or time.monotonic() < deadline, self.log.read_text()
            assert time.monotonic() < deadline, f"no {name} event:\n{self.log.read_text()}"
            await asyncio.sleep(0.02)

    @property
    def base(self) -> str:
        return "http://engine" if self.listen.startswith("unix:") else f"http://{self.address}"

    def session(self) -> aiohttp.ClientSession:
        if self.listen.startswith("unix:"):
            return aiohttp.ClientSession(
                connector=aiohttp.UnixConnector(path=self.listen.removeprefix("unix:")))
        return aiohttp.ClientSession()


def spawn_engine(config_path: Path, log: Path, listen: str) -> EngineProcess:
    """Start ``cuzkd engine`` with its output (JSON log lines) going to ``log``."""
    with log.open("wb") as sink:
        proc = subprocess.Popen(
            [sys.executable, "-m", "cuzkd", "engine", "--config", str(config_path),
             "--listen", listen], stdout=sink, stderr=subprocess.STDOUT)
    return EngineProcess(proc, log, listen)


def file_mode(path: Path) -> int | None:
    return stat.S_IMODE(path.stat().st_mode) if path.exists() else None


@pytest.fixture
async def start_engine(tmp_path: Path) -> AsyncIterator[Start]:
    started: list[EngineProcess] = []

    async def start(config: str = "", listen: str = "127.0.0.1:0") -> EngineProcess:
        config_path = tmp_path / f"engine{len(started)}.toml"
        config_path.write_text("synthesis_threads = 2\n" + config)
        log = tmp_path / f"engine{len(started)}.log"
        engine = spawn_engine(config_path, log, listen)
        started.append(engine)
        engine.address = (await engine.wait_event("engine_listening"))["address"]
        return engine

    yield start
    for engine in started:
        if engine.proc.poll() is None:
            engine.proc.kill()
        engine.proc.wait(10)


async def submit(session: aiohttp.ClientSession, engine: EngineProcess, **body: Any
                 ) -> tuple[int, dict[str, Any]]:
    async with session.post(f"{engine.base}/v1/jobs", json=body) as response:
        return response.status, await response.json()


async def job(session: aiohttp.ClientSession, engine: EngineProcess, job_id: str
              ) -> dict[str, Any]:
    async with session.get(f"{engine.base}/v1/jobs/{job_id}") as response:
        assert response.status == 200
        view: dict[str, Any] = await response.json()
        return view


async def wait_done(session: aiohttp.ClientSession, engine: EngineProcess, job_id: str,
                    timeout: float = 30.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        view = await job(session, engine, job_id)
        if view["state"] in ("done", "failed"):
            return view
        assert time.monotonic() < deadline, view
        await asyncio.sleep(0.02)


async def test_bench_completes_20_snap_jobs_while_status_stays_valid(
        start_engine: Start, cuzk_field_errors: Callable[[bytes], list[str]]) -> None:
    engine = await start_engine()
    stop = asyncio.Event()
    polled: list[bytes] = []

    async def poll_status() -> None:
        async with engine.session() as session:
            while not stop.is_set():
                async with session.get(f"{engine.base}/status") as response:
                    assert response.status == 200
                    polled.append(await response.read())
                await asyncio.sleep(0.05)

    poller = asyncio.create_task(poll_status())
    terminal, tty = pty.openpty()  # stderr on a terminal: the progress bar is drawn
    tty_output = asyncio.create_task(asyncio.to_thread(_read_until_closed, terminal))
    bench = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "cuzkd", "bench", "--engine", f"http://{engine.address}",
        "--jobs", "20", "--kind", "snap-update", "--size-log2", "9", "--json",
        stdout=asyncio.subprocess.PIPE, stderr=tty)
    os.close(tty)
    out, _ = await asyncio.wait_for(bench.communicate(), 120)
    err = await tty_output
    stop.set()
    await poller
    assert bench.returncode == 0, err.decode()
    report = json.loads(out)
    assert report["jobs_done"] == 20 and report["proofs_verified"] == 20
    assert report["partitions"] == 20 * 16
    assert report["partitions_per_sec"] > 0
    assert 0 < report["gpu_busy_fraction"] <= 1
    assert report["synth_secs"]["p50"] <= report["synth_secs"]["p99"]
    assert b"\r[" in err and b"320/320 partitions" in err  # the bar reached the end
    assert len(polled) >= 3
    for raw in polled:
        assert cuzk_field_errors(raw) == []
        decode_status(raw)
    final = decode_status(polled[-1])
    assert final.counters.completed_by_kind.get("snap-update", 0) <= 20
    events = engine.events()
    finished = [e for e in events if e["event"] == "job_finished"]
    assert len(finished) == 20 and all(e["verified"] for e in finished)
    assert len([e for e in events if e["event"] == "job_started"]) == 20


def _read_until_closed(fd: int) -> bytes:
    """Everything written to a pseudo-terminal until its other side is closed (EIO)."""
    chunks = []
    try:
        while chunk := os.read(fd, 65536):
            chunks.append(chunk)
    except OSError:
        pass
    finally:
        os.close(fd)
    return b"".join(chunks)


@pytest.mark.parametrize(("typed", "warned"), [("window-post", False), ("wpost", True)])
def test_bench_kind_by_an_old_name_is_cuzks_name_with_a_warning(
        capsys: pytest.CaptureFixture[str], typed: str, warned: bool) -> None:
    args = build_parser().parse_args(["bench", "--engine", "unix:/x", "--kind", typed])
    assert args.kind == "window-post"
    err = capsys.readouterr().err
    assert ("cuzkd bench: warning: proof kind 'wpost' is the old name of 'window-post'" in err
            ) == warned
    with pytest.raises(SystemExit):  # an unknown kind is still refused
        build_parser().parse_args(["bench", "--engine", "unix:/x", "--kind", "wpostt"])


async def test_an_old_kind_name_in_sizes_is_logged_and_sizes_the_kind(start_engine: Start,
                                                                       ) -> None:
    engine = await start_engine("[sizes]\nwinning = 7\n")
    warning = await engine.wait_event("config_warning")
    assert "key `sizes.winning`: proof kind 'winning' is the old name of 'winning-post'" in (
        warning["detail"])
    async with engine.session() as session:
        status, body = await submit(session, engine, proof_kind="winning-post")
        assert status == 202, body
        assert (await job(session, engine, body["job_id"]))["size_log2"] == 7


async def test_bench_draws_no_progress_bar_off_a_terminal(start_engine: Start) -> None:
    """Piped or logged, `cuzkd bench` writes no \\r frames: only its report."""
    engine = await start_engine()
    bench = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "cuzkd", "bench", "--engine", f"http://{engine.address}",
        "--jobs", "2", "--kind", "window-post", "--size-log2", "8",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(bench.communicate(), 120)
    assert bench.returncode == 0, err.decode()
    assert b"jobs: 2 done" in out and err == b""


async def test_bad_requests_get_json_errors_and_do_not_disturb_jobs(
        start_engine: Start) -> None:
    engine = await start_engine()
    async with engine.session() as session:
        status, accepted = await submit(session, engine, proof_kind="porep-c2", size_log2=10)
        assert status == 202
        bad_bodies: list[tuple[bytes, int, str]] = [
            (b"{not json", 400, "malformed"),
            (b'{"proof_kind": "snark"}', 400, "snark"),
            (b'{"proof_kind": "snap-update", "partitions": "many"}', 400, "partitions"),
            (b'{"proof_kind": "snap-update", "colour": "red"}', 400, "colour"),
            (b'{"partitions": 3}', 400, "proof_kind"),
            (b'{"proof_kind": "snap-update", "size_log2": 30}', 400, "size_log2"),
            (b'{"proof_kind": "snap-update", "partitions": 0}', 400, "partitions"),
            (b"x" * 100_000, 413, ""),
        ]
        for body, code, word in bad_bodies:
            async with session.post(f"{engine.base}/v1/jobs", data=body,
                                    headers={"Content-Type": "application/json"}) as response:
                assert response.status == code, body[:50]
                error = (await response.json())["error"]
                assert word in error
        for content_type in ("text/plain", "application/x-www-form-urlencoded",
                             "application/octet-stream"):
            async with session.post(f"{engine.base}/v1/jobs", data=b'{"proof_kind": "snap-update"}',
                                    headers={"Content-Type": content_type}) as response:
                assert response.status == 415, content_type
                assert content_type in (await response.json())["error"]
        # aiohttp's own protocol errors, raised before any handler or middleware runs
        for request in (b"GET /" + b"x" * 10_000 + b" HTTP/1.1\r\nHost: e\r\n\r\n",
                        b"GET /status HTTP/1.1\r\nHost: e\r\nX-Big: " + b"y" * 10_000
                        + b"\r\n\r\n",
                        b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03 not http\r\n\r\n"):
            status, headers, payload = await raw_exchange(engine, request)
            assert status == 400, payload
            assert headers.get("content-type", "").startswith("application/json"), headers
            assert json.loads(payload)["error"].startswith("Bad Request"), payload
        for method, path, code in [("GET", "/v1/jobs/ref-nope-1", 404), ("GET", "/nope", 404),
                                   ("DELETE", "/status", 405)]:
            async with session.request(method, f"{engine.base}{path}") as response:
                assert response.status == code
                assert "error" in await response.json()
        view = await wait_done(session, engine, accepted["job_id"])
        assert view["state"] == "done" and view["verified"] is True
        assert len(view["proofs"]) == 10 and len(view["timings"]["gpu_secs"]) == 10
        async with session.get(f"{engine.base}/healthz") as response:
            assert response.status == 200


async def raw_exchange(engine: EngineProcess, request: bytes
                       ) -> tuple[int, dict[str, str], bytes]:
    """Send raw bytes, read the response to EOF: (status, lower-cased headers, body)."""
    if engine.listen.startswith("unix:"):
        reader, writer = await asyncio.open_unix_connection(engine.listen.removeprefix("unix:"))
    else:
        host, _, port = engine.address.rpartition(":")
        reader, writer = await asyncio.open_connection(host, int(port))
    try:
        writer.write(request)
        await writer.drain()
        raw = await asyncio.wait_for(reader.read(), 10)
    finally:
        writer.close()
    head, _, body = raw.partition(b"\r\n\r\n")
    status_line, *lines = head.decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip()
               for k, _, v in (line.partition(":") for line in lines)}
    return int(status_line.split()[1]), headers, body


async def test_oversize_job_fails_with_clear_error(start_engine: Start) -> None:
    engine = await start_engine('memory_budget = "1MiB"\n')
    async with engine.session() as session:
        _, small = await submit(session, engine, proof_kind="snap-update", size_log2=9)
        status, huge = await submit(session, engine, proof_kind="snap-update", size_log2=16)
        assert status == 202
        failed = await wait_done(session, engine, huge["job_id"])
        assert failed["state"] == "failed"
        assert "whole budget is 1048576 bytes" in failed["error"]
        assert (await wait_done(session, engine, small["job_id"]))["verified"] is True
    assert any(e["event"] == "job_failed" and e["job_id"] == huge["job_id"]
               for e in engine.events())


@pytest.fixture
def stale_socket(tmp_path: Path) -> Iterator[Path]:
    path = tmp_path / "engine.sock"
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(path))
    sock.close()  # the file stays behind, like after a crash
    yield path


async def test_unix_socket_listener(start_engine: Start, stale_socket: Path) -> None:
    engine = await start_engine(listen=f"unix:{stale_socket}")
    assert file_mode(stale_socket) == 0o600
    bench = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "cuzkd", "bench", "--engine", f"unix:{stale_socket}",
        "--jobs", "2", "--kind", "window-post", "--size-log2", "8", "--no-progress",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(bench.communicate(), 60)
    assert bench.returncode == 0, err.decode()
    assert b"proofs verified: 2/2" in out
    engine.proc.send_signal(signal.SIGTERM)
    assert await asyncio.to_thread(engine.proc.wait, 30) == 0
    assert file_mode(stale_socket) is None  # removed on exit


async def running_job(session: aiohttp.ClientSession, engine: EngineProcess, size: int) -> str:
    """Submit a snap-update job and return its id once a partition is on a GPU worker."""
    _, accepted = await submit(session, engine, proof_kind="snap-update", size_log2=size)
    deadline = time.monotonic() + 20
    while True:
        async with session.get(f"{engine.base}/status") as response:
            doc = decode_status(await response.read())
        if any(w.state == "proving" for w in doc.gpu_workers):
            return str(accepted["job_id"])
        assert time.monotonic() < deadline
        await asyncio.sleep(0.01)


async def test_sigterm_drains_in_flight_partitions_and_exits_0(start_engine: Start) -> None:
    engine = await start_engine()
    async with engine.session() as session:
        job_id = await running_job(session, engine, 15)
        engine.proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 10
        while True:  # the signal is handled asynchronously: wait for intake to close
            status, body = await submit(session, engine, proof_kind="window-post", size_log2=8)
            if status == 503:
                break
            assert status == 202 and time.monotonic() < deadline
            await asyncio.sleep(0.01)
        assert "draining" in body["error"]
    assert await asyncio.to_thread(engine.proc.wait, 60) == 0
    events = engine.events()
    finished = [e for e in events if e["event"] == "job_finished" and e["job_id"] == job_id]
    assert finished and finished[0]["verified"] is True and finished[0]["partitions"] == 16
    assert [e["drained"] for e in events if e["event"] == "engine_stopped"] == [True]


async def test_http_drain_finishes_queued_jobs_then_exits_0(start_engine: Start) -> None:
    engine = await start_engine("memory_budget = '64MiB'\n")
    async with engine.session() as session:
        accepted = [(await submit(session, engine, proof_kind="porep-c2", partitions=4,
                                  size_log2=16))[1]["job_id"] for _ in range(3)]
        async with session.post(f"{engine.base}/v1/drain", json={"timeout_secs": 120}) as r:
            assert r.status == 202
            answer = await r.json()
        assert answer["draining"] is True and answer["started"] is True
        assert answer["open_jobs"] == 3  # the last two still queued
        status, body = await submit(session, engine, proof_kind="window-post", size_log2=8)
        assert status == 503 and "draining" in body["error"]
        async with session.post(f"{engine.base}/v1/jobs", json={"proof_kind": "snap-update"}) as r:
            assert r.status == 503 and 1 <= int(r.headers["Retry-After"]) <= 120
        async with session.get(f"{engine.base}/healthz") as r:
            assert (await r.json()) == {"status": "draining"}
        async with session.get(f"{engine.base}/status") as r:
            doc = decode_status(await r.read())
        assert doc.cuzkd_extensions is not None and doc.cuzkd_extensions.draining
    assert await asyncio.to_thread(engine.proc.wait, 120) == 0
    events = engine.events()
    finished = {e["job_id"] for e in events if e["event"] == "job_finished" and e["verified"]}
    assert finished == set(accepted)
    assert [e["drained"] for e in events if e["event"] == "engine_stopped"] == [True]


async def test_signal_during_http_drain_fails_the_rest_with_drain_timeout(
        start_engine: Start) -> None:
    engine = await start_engine("memory_budget = '24MiB'\n")
    async with engine.session() as session:
        job_id = (await submit(session, engine, proof_kind="porep-c2", partitions=64,
                               size_log2=15))[1]["job_id"]
        async with session.post(f"{engine.base}/v1/drain") as r:
            assert r.status == 202
        await engine.wait_event("engine_draining")
        engine.proc.send_signal(signal.SIGTERM)
        assert await asyncio.to_thread(engine.proc.wait, 30) == 0
    failed = [e for e in engine.events() if e["event"] == "job_failed"]
    assert [(e["job_id"], e["error"]) for e in failed] == [(job_id, "drain timeout")]
    assert [e["drained"] for e in engine.events() if e["event"] == "engine_stopped"] == [False]


@pytest.mark.parametrize("body", [b"{", b'{"timeout_secs": 0}', b'{"timeout_secs": "x"}',
                                  b'{"grace": 1}', b'{"timeout_secs": 1e9}'])
async def test_bad_drain_request_is_a_400_and_changes_nothing(start_engine: Start,
                                                            body: bytes) -> None:
    engine = await start_engine()
    async with engine.session() as session:
        async with session.post(f"{engine.base}/v1/drain", data=body) as r:
            assert r.status == 400 and "error" in await r.json()
        status, _ = await submit(session, engine, proof_kind="window-post", size_log2=8)
        assert status == 202


async def test_second_signal_exits_at_once(start_engine: Start) -> None:
    engine = await start_engine()
    async with engine.session() as session:
        await running_job(session, engine, 17)
    engine.proc.send_signal(signal.SIGTERM)
    await engine.wait_event("engine_draining")
    engine.proc.send_signal(signal.SIGINT)
    assert await asyncio.to_thread(engine.proc.wait, 10) == 128 + signal.SIGINT
    assert not any(e["event"] == "engine_stopped" for e in engine.events())


@pytest.mark.parametrize(("listen", "code", "words"), [
    ("nowhere", 64, "is not HOST:PORT or unix:PATH"),
    ("127.0.0.1:99999", 64, "is not HOST:PORT"),
    ("no-such-host.invalid:8080", 64, "does not resolve"),
    ("192.0.2.1:8080", 64, "address"),  # TEST-NET: not an address of this host
    ("unix:", 64, "socket path"),
    ("unix:/nonexistent-dir/e.sock", 69, "No such file or directory"),
    ("unix:/tmp/" + "l" * 120 + ".sock", 69, "too long"),
])
def test_unusable_listen_addresses_exit_with_one_line(listen: str, code: int,
                                                       words: str) -> None:
    proc = subprocess.run([sys.executable, "-m", "cuzkd", "engine", "--listen", listen],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == code, proc.stderr
    [line] = proc.stderr.splitlines()  # one line, nothing else (no traceback, no log)
    assert line.startswith("cuzkd engine: --listen") and words in line, proc.stderr


def test_a_busy_port_or_a_file_in_the_way_exits_69(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc = subprocess.run(
            [sys.executable, "-m", "cuzkd", "engine", "--listen", f"127.0.0.1:{port}"],
            capture_output=True, text=True, timeout=60)
    assert proc.returncode == 69, proc.stderr
    [line] = proc.stderr.splitlines()
    assert "address already in use" in line and str(port) in line
    precious = tmp_path / "precious"
    precious.write_text("keep me\n")
    proc = subprocess.run(
        [sys.executable, "-m", "cuzkd", "engine", "--listen", f"unix:{precious}"],
        capture_output=True, text=True, timeout=60)
    assert proc.returncode == 69, proc.stderr
    [line] = proc.stderr.splitlines()
    assert "not a socket" in line and str(precious) in line
    assert precious.read_text() == "keep me\n"
