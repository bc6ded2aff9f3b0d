"""Metrics listener auth under a flood of wrong passwords: run by hand, figures in
docs/benchmarks.md (section "Metrics listener auth under a flood").

A real ``cuzkd run`` (one bundled engine; basic auth on loopback, plain HTTP so that the
figures are the auth's, not TLS's) whose web config has ``--users`` users, each with its own
bcrypt hash of cost ``--cost`` (12: bcrypt's default, what ``htpasswd -B`` and most tools
write). Two measurements:

(a) **flood**: a child process (the attacker) sends distinct wrong passwords for the scraper's
    user flat out over ``--connections`` kept-alive connections from ``--attacker`` (127.0.0.2:
    another address, as an attacker on another host; 127.0.0.1 shows the same-address limit),
    at least ``--passwords``, until the scrapes are done. Meanwhile a Prometheus-like scraper
    from 127.0.0.1 scrapes ``/metrics`` on a new connection each time, ``--gap`` s apart, with
    Prometheus' default 10 s timeout: first ``--fresh`` scrapes each with a user never verified
    (what a restart of cuzkd leaves: the password must win a bcrypt round against the flood),
    then ``--cached`` scrapes with those users (verified by now, if they ever got through).
    Reported per kind: scrapes answered 200, refused (by status), timed out, and p50/p99 of
    their response times (nearest rank: p99 of 10 is the worst).
(b) **timing**: no flood; ``--probes`` requests each, alternating, with a distinct wrong
    password for a known user and for an unknown one, one at a time on one connection: the
    p50 of each. A difference tells an attacker which users exist.

``--root`` runs another source tree's cuzkd (e.g. an older commit unpacked with ``git archive``)
with this bench, for before/after figures.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import bcrypt
from aiohttp import ClientSession, ClientTimeout, TCPConnector

sys.path.insert(0, str(Path(__file__).resolve().parent))
from web_bad_input import until_up

PASSWORD = "scrape-secret"
SCRAPE_TIMEOUT = 10.0  # Prometheus' default scrape_timeout


def _auth(user: str, password: str) -> dict[str, str]:
    return {"Authorization": "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()}


def _rank(values: list[float], q: float) -> float:
    """The nearest-rank ``q`` quantile (q in 0..1) of ``values``."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * len(ordered) + 0.5) - 1))]


def _ms(values: list[float]) -> str:
    if not values:
        return "-"
    return f"{1000 * _rank(values, 0.5):.0f} / {1000 * _rank(values, 0.99):.0f} ms"


# -- the attacker (a child process: its CPU is not the scraper's loop) ------------------------

async def _flood(url: str, user: str, connections: int, at_least: int, source: str) -> None:
    """Wrong passwords flat out until ``at_least`` are answered and stdin is closed; prints
    ``ready`` once under way, then a JSON summary."""
    statuses: Counter[str] = Counter()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_reader(sys.stdin.fileno(), lambda: stop.set() if not os.read(0, 1) else None)
    sent = 0
    connector = TCPConnector(limit=connections, local_addr=(source, 0))
    started = time.monotonic()
    async with ClientSession(connector=connector, timeout=ClientTimeout(total=60)) as session:
        async def worker(n: int) -> None:
            nonlocal sent
            i = 0
            while sent < at_least or not stop.is_set():
                sent += 1
                try:
                    async with session.get(f"{url}/status",
                                           headers=_auth(user, f"guess-{n}-{i}")) as response:
                        await response.read()
                        statuses[str(response.status)] += 1
                except (OSError, TimeoutError) as exc:
                    statuses[type(exc).__name__] += 1
                if sum(statuses.values()) == connections:
                    print("ready", flush=True)
                i += 1

        await asyncio.gather(*(worker(n) for n in range(connections)))
    took = time.monotonic() - started
    print(json.dumps({"requests": sent, "seconds": round(took, 1),
                      "statuses": dict(statuses)}), flush=True)


# -- the scraper and the timing probe ----------------------------------------------------------

async def _scrape(url: str, user: str) -> tuple[str, float]:
    """One scrape on a new connection: (status or "timeout", seconds)."""
    started = time.perf_counter()
    try:
        async with ClientSession(connector=TCPConnector(force_close=True),
                                 timeout=ClientTimeout(total=SCRAPE_TIMEOUT)) as session, \
                session.get(f"{url}/metrics", headers=_auth(user, PASSWORD)) as response:
            await response.read()
            status = str(response.status)
    except TimeoutError:
        status = "timeout"
    return status, time.perf_counter() - started


async def flood_phase(args: argparse.Namespace, url: str, users: list[str]) -> None:
    child = await asyncio.create_subprocess_exec(
        sys.executable, __file__, "--flood", url, "--flood-user", users[0],
        "--connections", str(args.connections), "--passwords", str(args.passwords),
        "--attacker", args.attacker, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    assert child.stdout is not None and child.stdin is not None
    if (await child.stdout.readline()).strip() != b"ready":
        raise SystemExit("the attacker did not start")
    results: dict[str, list[tuple[str, float]]] = {"fresh": [], "cached": []}
    for kind, count in (("fresh", args.fresh), ("cached", args.cached)):
        for i in range(count):
            results[kind].append(await _scrape(url, users[i % args.fresh]))
            await asyncio.sleep(args.gap)
    child.stdin.close()
    summary = json.loads((await child.stdout.read()).decode())
    await child.wait()
    print(f"(a) flood from {args.attacker}, {args.connections} connections: {summary}")
    for kind, rows in results.items():
        statuses = Counter(status for status, _ in rows)
        print(f"  {kind} scrapes: {statuses['200']}/{len(rows)} answered 200, refused "
              f"{dict((s, n) for s, n in statuses.items() if s != '200') or 0}; p50 / p99 "
              f"{_ms([t for _, t in rows])} (of the 200s: "
              f"{_ms([t for s, t in rows if s == '200'])})")


async def timing_phase(args: argparse.Namespace, url: str, users: list[str]) -> None:
    times: dict[str, list[float]] = {"known": [], "unknown": []}
    async with ClientSession() as session:
        for i in range(args.probes):
            for kind, user in (("known", users[-1]), ("unknown", "nobody")):
                started = time.perf_counter()
                async with session.get(f"{url}/metrics",
                                       headers=_auth(user, f"probe-{i}")) as response:
                    await response.read()
                    assert response.status == 401, response.status
                times[kind].append(time.perf_counter() - started)
    known, unknown = (1000 * _rank(times[k], 0.5) for k in ("known", "unknown"))
    print(f"(b) wrong password, {args.probes} each: known user p50 {known:.0f} ms, "
          f"unknown user p50 {unknown:.0f} ms (unknown/known {unknown / known:.2f})")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, default=Path(__file__).resolve().parents[1],
                        help="the source tree whose cuzkd runs (default: this one)")
    parser.add_argument("--cost", type=int, default=12)
    parser.add_argument("--users", type=int, default=10)
    parser.add_argument("--passwords", type=int, default=10_000)
    parser.add_argument("--connections", type=int, default=16)
    parser.add_argument("--attacker", default="127.0.0.2")
    parser.add_argument("--fresh", type=int, default=10)
    parser.add_argument("--cached", type=int, default=20)
    parser.add_argument("--gap", type=float, default=0.5)
    parser.add_argument("--probes", type=int, default=20)
    parser.add_argument("--skip-flood", action="store_true")
    parser.add_argument("--skip-timing", action="store_true")
    parser.add_argument("--flood", metavar="URL", help=argparse.SUPPRESS)
    parser.add_argument("--flood-user", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.flood:
        asyncio.run(_flood(args.flood, args.flood_user, args.connections, args.passwords,
                           args.attacker))
        return
    users = [f"prometheus-{i}" for i in range(max(args.users, args.fresh))]
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    with tempfile.TemporaryDirectory() as name:
        tmp = Path(name)
        web = tmp / "web.yml"
        lines = ["basic_auth_users:"]
        for user in users:
            hashed = bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(args.cost)).decode()
            lines.append(f"  {user}: '{hashed}'")
        web.write_text("\n".join(lines) + "\n", encoding="utf-8")
        config = tmp / "cuzkd.toml"
        config.write_text(f'[supervisor]\nstate_dir = "{tmp / "state"}"\n[metrics]\n'
                          f'listen = "127.0.0.1:{port}"\nweb_config = "{web}"\n'
                          '[[engine]]\nname = "e0"\n', encoding="utf-8")
        env = {**os.environ, "PYTHONPATH": str(args.root)}
        with (tmp / "cuzkd.log").open("wb") as log:
            proc = subprocess.Popen([sys.executable, "-m", "cuzkd", "run", "--config",
                                     str(config), "--log-format", "json"],
                                    stdout=log, stderr=subprocess.STDOUT, env=env,
                                    cwd=tmp)  # not this tree's cuzkd: -m looks in cwd first
        try:
            asyncio.run(until_up(url, proc))
            print(f"cuzkd from {args.root}, {len(users)} users at cost {args.cost}, "
                  f"load average {os.getloadavg()[0]:.1f}")
            if not args.skip_timing:
                asyncio.run(timing_phase(args, url, users))
            if not args.skip_flood:
                asyncio.run(flood_phase(args, url, users))
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(60)


if __name__ == "__main__":
    main()
