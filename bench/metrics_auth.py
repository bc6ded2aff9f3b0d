"""Basic auth on the metrics listener under a wrong-password flood, and an unknown user's time
against a known one's: run by hand, figures in the report of the change (docs/benchmarks.md,
section web-config, for the flood's cost).

A real ``cuzkd run`` (one bundled engine) with ``[metrics] web_config``: TLS and one user whose
hash has bcrypt's default cost (``--cost``, 12). Measured:

* **unknown vs known user** (``--timings`` each, no flood, on the first start): wrong
  passwords for the user and for unknown users, one at a time on a kept-alive connection, each
  password distinct (none is answered from the cache of refused ones); median, p10 and p90;
* **fresh starts under a flood** (``--starts``): cuzkd started, nothing cached; ``--flooders``
  connections send distinct wrong passwords for the real user as fast as they are answered,
  each from its own loopback address 127.0.0.2, 127.0.0.3, ... (``--flood-from scraper``: all
  from 127.0.0.1, the scraper's own address); after ``--warmup`` s of flood, Prometheus's
  scrape is tried ``--scrapes`` times from 127.0.0.1, each on a new connection with
  Prometheus's default 10 s timeout, 1 s apart, the flood going on. Reported: how many scrapes
  got 200, how long the first successful one took, the flood's answers by status.

``--pythonpath DIR`` runs cuzkd from another tree, for a before/after comparison::

    git archive HEAD | tar -x -C /tmp/before   # the tree without the change
    python bench/metrics_auth.py --pythonpath /tmp/before
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import ssl
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

from aiohttp import ClientError, ClientSession, ClientTimeout, TCPConnector

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from support.tlsfiles import PASSWORD, USER, basic_auth, make_tls_files, write_web_config

#: Prometheus's default scrape_timeout.
SCRAPE_TIMEOUT = 10.0


async def _until_up(url: str, tls: ssl.SSLContext, proc: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 60
    async with ClientSession(connector=TCPConnector(ssl=tls)) as session:
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise SystemExit(f"cuzkd run exited {proc.returncode}")
            try:
                async with session.get(f"{url}/healthz") as response:
                    if response.status == 200:
                        return
            except (OSError, ClientError):
                pass
            await asyncio.sleep(0.2)
    raise SystemExit("cuzkd did not answer within 60 s")


def _spread(seconds: list[float]) -> str:
    ms = sorted(1000 * s for s in seconds)
    deciles = statistics.quantiles(ms, n=10)
    return f"median {statistics.median(ms):.0f} ms (p10 {deciles[0]:.0f}, p90 {deciles[-1]:.0f})"


async def _timings(url: str, tls: ssl.SSLContext, count: int) -> None:
    """Wrong passwords for the user and for unknown ones, alternately, one at a time."""
    times: dict[str, list[float]] = {"known user": [], "unknown user": []}
    async with ClientSession(connector=TCPConnector(ssl=tls, limit=1)) as session:
        for i in range(2 * count):
            kind = "known user" if i % 2 else "unknown user"
            user = USER if i % 2 else f"nobody-{i}"
            started = time.perf_counter()
            async with session.get(f"{url}/metrics",
                                   headers=basic_auth(f"wrong-{i}", user)) as response:
                await response.read()
                assert response.status == 401, response.status
            times[kind].append(time.perf_counter() - started)
    for kind, seconds in times.items():
        print(f"  wrong password, {kind}: {_spread(seconds)}")


async def _flooder(url: str, tls: ssl.SSLContext, address: str, n: int, stop: asyncio.Event,
                   statuses: Counter[str]) -> None:
    async with ClientSession(connector=TCPConnector(ssl=tls, limit=1,
                                                    local_addr=(address, 0))) as session:
        i = 0
        while not stop.is_set():
            try:
                async with session.get(f"{url}/metrics",
                                       headers=basic_auth(f"guess-{n}-{i}")) as response:
                    await response.read()
                    statuses[str(response.status)] += 1
            except (OSError, ClientError) as exc:
                statuses[type(exc).__name__] += 1
            i += 1


async def _scrapes(url: str, tls: ssl.SSLContext, count: int) -> list[float | None]:
    """``count`` scrapes from 127.0.0.1, each on a new connection: seconds, None if refused."""
    results: list[float | None] = []
    for _ in range(count):
        started = time.perf_counter()
        try:
            async with ClientSession(connector=TCPConnector(ssl=tls, force_close=True),
                                     timeout=ClientTimeout(total=SCRAPE_TIMEOUT)) as session, \
                    session.get(f"{url}/metrics", headers=basic_auth(PASSWORD)) as response:
                await response.read()
                ok = response.status == 200
        except (OSError, ClientError, TimeoutError):
            ok = False
        results.append(time.perf_counter() - started if ok else None)
        await asyncio.sleep(1.0)
    return results


async def _flooded(args: argparse.Namespace, url: str, tls: ssl.SSLContext) -> None:
    addresses = ["127.0.0.1"] * args.flooders if args.flood_from == "scraper" else \
        [f"127.0.{(2 + n) >> 8}.{(2 + n) & 255}" for n in range(args.flooders)]
    stop, statuses = asyncio.Event(), Counter[str]()
    flood = [asyncio.ensure_future(_flooder(url, tls, address, n, stop, statuses))
             for n, address in enumerate(addresses)]
    await asyncio.sleep(args.warmup)
    results = await _scrapes(url, tls, args.scrapes)
    stop.set()
    await asyncio.gather(*flood)
    ok = [s for s in results if s is not None]
    first = f"{ok[0]:.2f} s" if ok else "-"
    print(f"  scrapes with the right password: {len(ok)} of {len(results)} got 200 (first "
          f"{first}); the flood's answers: {dict(statuses.most_common())}")


async def _measure(args: argparse.Namespace, proc: subprocess.Popen[bytes],
                   tls: ssl.SSLContext, start: int) -> None:
    url = f"https://127.0.0.1:{args.port}"
    await _until_up(url, tls, proc)
    print(f"start {start + 1}:")
    if start == 0 and args.timings:
        await _timings(url, tls, args.timings)
    await _flooded(args, url, tls)


def _start(args: argparse.Namespace, tmp: Path, tls: ssl.SSLContext, web: Path,
           start: int) -> None:
    """One ``cuzkd run`` from nothing cached, measured, then stopped."""
    config = tmp / "cuzkd.toml"
    config.write_text(f'[supervisor]\nstate_dir = "{tmp / "state"}"\n[metrics]\n'
                      f'listen = "127.0.0.1:{args.port}"\nweb_config = "{web}"\n'
                      '[[engine]]\nname = "e0"\n', encoding="utf-8")
    env = dict(os.environ)
    if args.pythonpath:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, (args.pythonpath,
                                                          env.get("PYTHONPATH"))))
    with (tmp / f"cuzkd-{start}.log").open("wb") as log:
        proc = subprocess.Popen([sys.executable, "-m", "cuzkd", "run", "--config", str(config),
                                 "--log-format", "json"], stdout=log, stderr=subprocess.STDOUT,
                                env=env, cwd=tmp)  # not the checkout: -m puts the cwd first
    try:
        asyncio.run(_measure(args, proc, tls, start))
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cost", type=int, default=12)
    parser.add_argument("--starts", type=int, default=3)
    parser.add_argument("--flooders", type=int, default=32)
    parser.add_argument("--flood-from", choices=("others", "scraper"), default="others")
    parser.add_argument("--warmup", type=float, default=3.0)
    parser.add_argument("--scrapes", type=int, default=10)
    parser.add_argument("--timings", type=int, default=20)
    parser.add_argument("--port", type=int, default=19824)
    parser.add_argument("--pythonpath", default="",
                        help="run cuzkd from this tree (before/after comparisons)")
    args = parser.parse_args()
    if args.pythonpath:
        probe = subprocess.run([sys.executable, "-c", "import cuzkd; print(cuzkd.__file__)"],
                               env={**os.environ, "PYTHONPATH": args.pythonpath},
                               capture_output=True, text=True, check=True, cwd="/")
        print("cuzkd from", probe.stdout.strip())
    with tempfile.TemporaryDirectory() as name:
        tmp = Path(name)
        files = make_tls_files(tmp / "tls")
        web = write_web_config(tmp / "web.yml", files, cost=args.cost)
        tls = ssl.create_default_context(cafile=str(files.ca))
        print(f"one user, a cost-{args.cost} hash; flood from "
              f"{'127.0.0.1 (the scraper)' if args.flood_from == 'scraper' else '127.0.0.2..'}"
              f" on {args.flooders} connections")
        for start in range(args.starts):
            _start(args, tmp, tls, web, start)


if __name__ == "__main__":
    main()
