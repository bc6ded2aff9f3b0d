"""Benchmark of slow readers of ``/status``: the supervisor's RSS and ``/metrics`` latency while
``--clients`` connections send ``GET /status`` and never read (issue 22 item 1).

Run by hand: ``.venv/bin/python bench/slow_readers.py`` (default: 2,000 clients, one engine
serving a 1 MB document, cuzk's size when busy). ``cuzkd run`` is started with one engine that
runs ``bench/scrape.py`` in its ``--serve-document`` mode; this process opens the clients one
after the other, then for ``--hold`` seconds samples the supervisor's RSS (``/proc/PID/status``)
and times a ``GET /metrics`` every half second; then it closes the clients and reads the RSS
once more. The supervisor's soft descriptor limit must leave room for the clients (``ulimit -n``;
it inherits this process's).

``--slow-read RATE`` measures issue 22 item 3 instead: one client reads ``/status`` at RATE
bytes/s (``--engines 2 --jobs 3600``: a 16 MB body, which takes 16 s at 1 MB/s, longer than the
10 s idle timeout) and the bytes it got before the supervisor closed are printed.

Figures go to docs/benchmarks.md (section slow readers).
"""

from __future__ import annotations

import argparse
import asyncio
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import scrape  # bench/scrape.py: the document, the engine mode, the config, the readiness wait


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise SystemExit(f"no VmRSS for {pid}")


async def stalled_client(host: str, port: int) -> socket.socket:
    """A connection that has sent ``GET /status`` and will never read."""
    sock = socket.socket()
    sock.setblocking(False)
    loop = asyncio.get_running_loop()
    await loop.sock_connect(sock, (host, port))
    await loop.sock_sendall(sock, b"GET /status HTTP/1.1\r\nHost: bench\r\n\r\n")
    return sock


async def timed_metrics(host: str, port: int) -> float:
    """Seconds a full ``GET /metrics`` took (a fresh connection, read to the end)."""
    started = time.monotonic()
    reader, writer = await asyncio.open_connection(host, port)
    writer.write(b"GET /metrics HTTP/1.1\r\nHost: bench\r\nConnection: close\r\n\r\n")
    await reader.read()
    writer.close()
    return time.monotonic() - started


async def flood(args: argparse.Namespace, proc: subprocess.Popen[bytes], control: Path) -> None:
    host, _, port_text = (await scrape.wait_ready(proc, control, 1)).rpartition(":")
    port = int(port_text)
    await asyncio.sleep(2)  # a few health polls: the document is cached and decoded
    print(f"RSS before: {rss_mb(proc.pid):.0f} MB; "
          f"/metrics alone: {1000 * await timed_metrics(host, port):.0f} ms")
    clients = [await stalled_client(host, port) for _ in range(args.clients)]
    peak, latencies = 0.0, []
    hold_until = time.monotonic() + args.hold
    while time.monotonic() < hold_until:
        latencies.append(await asyncio.wait_for(timed_metrics(host, port), 60))
        peak = max(peak, rss_mb(proc.pid))
        await asyncio.sleep(0.5)
    print(f"{args.clients} stalled /status clients for {args.hold:.0f} s: RSS peak "
          f"{peak:.0f} MB; /metrics p50 {1000 * statistics.median(latencies):.0f} ms, "
          f"max {1000 * max(latencies):.0f} ms ({len(latencies)} scrapes)")
    for sock in clients:
        sock.close()
    await asyncio.sleep(3)
    print(f"RSS 3 s after the clients closed: {rss_mb(proc.pid):.0f} MB")


async def slow_read(args: argparse.Namespace, proc: subprocess.Popen[bytes],
                    control: Path) -> None:
    host, _, port_text = (await scrape.wait_ready(proc, control, args.engines)).rpartition(":")
    await asyncio.sleep(2)
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 65536)
    sock.setblocking(False)
    loop = asyncio.get_running_loop()
    await loop.sock_connect(sock, (host, int(port_text)))
    await loop.sock_sendall(sock, b"GET /status HTTP/1.1\r\nHost: bench\r\n"
                                  b"Connection: close\r\n\r\n")
    started, got, chunk = time.monotonic(), bytearray(), 16384
    while True:
        try:
            data = await loop.sock_recv(sock, chunk)
        except ConnectionResetError:
            break
        if not data:
            break
        got += data
        await asyncio.sleep(len(data) / args.slow_read)
    sock.close()
    head, _, body = bytes(got).partition(b"\r\n\r\n")
    length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n")
                  if line.lower().startswith(b"content-length:"))
    print(f"/status read at {args.slow_read / 1e6:.2f} MB/s: {len(body)} of {length} bytes "
          f"({'whole' if len(body) == length else 'CUT'}) in {time.monotonic() - started:.1f} s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, default=2000)
    parser.add_argument("--hold", type=float, default=15.0, help="seconds to keep them open")
    parser.add_argument("--jobs", type=int, default=480, help="jobs in the document (480: 1 MB)")
    parser.add_argument("--engines", type=int, default=1)
    parser.add_argument("--slow-read", type=float, help="bytes/s: one slow reader instead")
    args = parser.parse_args()
    body = scrape.busy_document(args.jobs, 16, 4, False, True)
    print(f"status document: {len(body) / 1024:.0f} KiB")
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        (tmp / "status.json").write_bytes(body)
        config = scrape.supervisor_config(tmp, tmp / "status.json", args.engines, 0)
        with (tmp / "cuzkd.log").open("wb") as log:
            proc = subprocess.Popen([sys.executable, "-m", "cuzkd", "run", "--config",
                                     str(config)], stdout=log, stderr=subprocess.STDOUT)
        try:
            run = flood if args.slow_read is None else slow_read
            asyncio.run(run(args, proc, tmp / "state" / "control.sock"))
        finally:
            proc.terminate()
            proc.wait(60)


if __name__ == "__main__":
    main()
