"""Bad input on a TLS + basic auth metrics listener, full size: run by hand, figures in
docs/benchmarks.md (section web-config).

A real ``cuzkd run`` (one bundled engine) with ``[metrics] web_config`` (TLS, one user with a
cost-10 bcrypt hash) gets, one after the other:

* ``--passwords`` (10,000) requests with distinct wrong passwords over 32 kept-alive
  connections, while a scraper with the right password scrapes ``/metrics`` every 0.5 s;
* ``--silent`` (1,000) connections that never send a byte (handshakes that never finish);
* ``--garbage`` (1,000) connections sending HTTP instead of a ClientHello.

Reported: how long each took, the scraper's worst latency during it, the supervisor's CPU,
its bcrypt rounds (from 401s and the log), its log lines by event, whether a credential or
hash appears in the log, and that the engine stayed running.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import ssl
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

from aiohttp import ClientSession, TCPConnector

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from support.tlsfiles import PASSWORD, basic_auth, make_tls_files, write_web_config

sys.path.insert(0, str(Path(__file__).resolve().parent))
from scrape import on_cpu_ns


async def until_up(url: str, proc: subprocess.Popen[bytes],
                   tls: ssl.SSLContext | None = None) -> None:
    """Once cuzkd at ``url`` answers ``/healthz`` (within 60 s, while ``proc`` runs)."""
    deadline = time.monotonic() + 60
    connector = None if tls is None else TCPConnector(ssl=tls)
    async with ClientSession(connector=connector) as session:
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise SystemExit(f"cuzkd run exited {proc.returncode}")
            try:
                async with session.get(f"{url}/healthz") as response:
                    if response.status == 200:
                        return
            except OSError:
                pass
            await asyncio.sleep(0.2)
    raise SystemExit("cuzkd did not answer within 60 s")


async def _scraper(url: str, tls: ssl.SSLContext, stop: asyncio.Event) -> list[float]:
    latencies = []
    async with ClientSession(connector=TCPConnector(ssl=tls)) as session:
        while not stop.is_set():
            started = time.perf_counter()
            async with session.get(f"{url}/metrics", headers=basic_auth(PASSWORD)) as response:
                await response.read()
                assert response.status == 200, response.status
            latencies.append(time.perf_counter() - started)
            await asyncio.sleep(0.5)
    return latencies


async def _phase(name: str, url: str, tls: ssl.SSLContext, pid: int,
                 attack: asyncio.Future[object]) -> None:
    stop = asyncio.Event()
    cpu, started = on_cpu_ns(pid), time.monotonic()
    scraper = asyncio.ensure_future(_scraper(url, tls, stop))
    result = await attack
    took = time.monotonic() - started
    stop.set()
    latencies = await scraper
    print(f"{name}: {result}; took {took:.1f} s, supervisor CPU {(on_cpu_ns(pid) - cpu) / 1e9:.1f}"
          f" s; scraper {len(latencies)} scrapes, worst {1000 * max(latencies):.0f} ms, "
          f"median {1000 * sorted(latencies)[len(latencies) // 2]:.0f} ms")


async def _passwords(url: str, tls: ssl.SSLContext, count: int) -> Counter[int]:
    statuses: Counter[int] = Counter()
    async with ClientSession(connector=TCPConnector(ssl=tls, limit=32)) as session:
        async def one(i: int) -> None:
            async with session.get(f"{url}/status", headers=basic_auth(f"guess-{i}")) as response:
                await response.read()
                statuses[response.status] += 1

        await asyncio.gather(*(one(i) for i in range(count)))
    return statuses


async def _raw(port: int, count: int, payload: bytes) -> str:
    """``count`` connections sending ``payload`` (b"": nothing) until cuzkd closes them."""
    loop = asyncio.get_running_loop()
    outcomes: Counter[str] = Counter()

    async def one() -> None:
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
        except OSError as exc:
            outcomes[type(exc).__name__] += 1
            return
        started = loop.time()
        try:
            if payload:
                writer.write(payload)
            await asyncio.wait_for(reader.read(), 60)
            outcomes[f"closed after ~{round(loop.time() - started)} s"] += 1
        except (OSError, TimeoutError) as exc:
            outcomes[type(exc).__name__] += 1
        finally:
            writer.close()

    await asyncio.gather(*(one() for _ in range(count)))
    return ", ".join(f"{n} {what}" for what, n in outcomes.most_common())


async def attack(args: argparse.Namespace, proc: subprocess.Popen[bytes], port: int,
                 tls: ssl.SSLContext) -> None:
    url = f"https://127.0.0.1:{port}"
    await until_up(url, proc, tls)
    await _phase(f"{args.passwords} wrong passwords", url, tls, proc.pid,
                 asyncio.ensure_future(_passwords(url, tls, args.passwords)))
    await _phase(f"{args.silent} silent connections", url, tls, proc.pid,
                 asyncio.ensure_future(_raw(port, args.silent, b"")))
    await _phase(f"{args.garbage} garbage ClientHellos", url, tls, proc.pid,
                 asyncio.ensure_future(_raw(port, args.garbage,
                                            b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")))
    async with ClientSession(connector=TCPConnector(ssl=tls)) as session, \
            session.get(f"{url}/status", headers=basic_auth(PASSWORD)) as response:
        engines = (await response.json())["engines"]
        print("engines after:", {e["name"]: e["state"] for e in engines})
        async with session.get(f"{url}/metrics", headers=basic_auth(PASSWORD)) as metrics:
            for line in (await metrics.text()).splitlines():
                if line.startswith(("cuzkd_metrics_auth", "cuzkd_metrics_tls",
                                    "cuzkd_metrics_connections_closed")):
                    print(" ", line)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--passwords", type=int, default=10_000)
    parser.add_argument("--silent", type=int, default=1_000)
    parser.add_argument("--garbage", type=int, default=1_000)
    parser.add_argument("--port", type=int, default=19823)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as name:
        tmp = Path(name)
        files = make_tls_files(tmp / "tls")
        web = write_web_config(tmp / "web.yml", files, cost=10)
        hashed = web.read_text().split("'")[1]
        config = tmp / "cuzkd.toml"
        config.write_text(f'[supervisor]\nstate_dir = "{tmp / "state"}"\n[metrics]\n'
                          f'listen = "127.0.0.1:{args.port}"\nweb_config = "{web}"\n'
                          '[[engine]]\nname = "e0"\n')
        log_path = tmp / "cuzkd.log"
        with log_path.open("wb") as log:
            proc = subprocess.Popen([sys.executable, "-m", "cuzkd", "run", "--config",
                                     str(config), "--log-format", "json"],
                                    stdout=log, stderr=subprocess.STDOUT)
        try:
            asyncio.run(attack(args, proc, args.port,
                               ssl.create_default_context(cafile=str(files.ca))))
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(60)
        text = log_path.read_text()
        events = Counter(json.loads(line).get("event") for line in text.splitlines()
                         if line.startswith("{"))
        print("log lines by event:", dict(events.most_common(12)))
        leaked = [s for s in ("guess-", PASSWORD, hashed) if s in text]
        print("credentials or hash in the log:", leaked or "none")


if __name__ == "__main__":
    main()
