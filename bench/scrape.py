"""Benchmark of a /metrics scrape: latency (p50, p99) and supervisor CPU per scrape.

Run by hand: ``.venv/bin/python bench/scrape.py``. Shape (the issue's reference load): 8 engines
x 4 GPU workers, each engine with 64 jobs x 16 partitions in flight.

Two processes, so the figures are the supervisor's alone:

* this process plays the supervisor: a loopback aiohttp server with
  :func:`cuzkd.metrics.http.make_metrics_handler`, whose provider fetches every engine's
  document concurrently through :class:`cuzkd.status.client.StatusSource` (unix sockets),
  decodes it, builds the :class:`SupervisorSample` and renders it. CPU per scrape is
  ``time.process_time()`` around the handler (nothing else runs in this process);
* a child process plays the 8 engines (aiohttp servers on unix sockets serving a fixed,
  pre-encoded document) and Prometheus (a client scraping one request at a time, timing each).

``--max-age 0`` (default) fetches every document on every scrape, which is what a 15 s scrape
interval sees; ``--max-age 1`` shows the cost behind the supervisor's 1 s cache. ``--plain``
serves cuzk's plain document (no ``cuzkd_extensions``), so the supervisor-side deriver runs too.
``--pretty`` pretty-prints the documents as cuzk does (``--jobs 480 --pretty``: 1 MB each, a busy
cuzk's size); ``--piece N`` has the engines write them chunked in N-byte pieces (default: one
write with a Content-Length, as cuzk's HTTP server does).

``--supervisor`` measures the real thing instead: ``cuzkd run`` with a config of ``--engines``
engines whose ``command`` is this script in ``--serve-document`` mode (an aiohttp server on a
unix socket answering the pre-encoded document), reached through ``status_url``. Its health
polls (every ``health_interval``, 1 s) fetch and decode every document, so scrapes mostly find
them in the 1 s cache, as in production. Latency is timed here; CPU per scrape is the
supervisor's on-CPU time across the scrape, read from ``/proc/PID/task/*/schedstat``
(nanoseconds; psutil's ``cpu_times`` has 10 ms ticks), minus nothing: health polls that land
inside a scrape are counted, so the idle rate of the same supervisor is printed next to it.

``--tls`` (with ``--supervisor``) serves the listener with ``[metrics] web_config``: TLS (an EC
P-256 certificate made by openssl for the run) and basic auth (a cost-10 bcrypt hash, the
usual one), scraped with the password as Prometheus does. The client keeps its connection
alive between scrapes like Prometheus; ``--new-connections`` opens one per scrape instead (what
a 15 s scrape interval gets from a listener that closes idle connections after 10 s), so the
TLS handshake is counted in. TLS handshakes per scrape are read from
``cuzkd_metrics_tls_handshakes_total``.

Figures go to docs/benchmarks.md (section metrics).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import signal
import ssl
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import psutil
from aiohttp import ClientSession, TCPConnector, UnixConnector, web

from cuzkd.metrics.http import make_metrics_handler
from cuzkd.metrics.sample import EngineSample, SupervisorSample
from cuzkd.status.client import StatusSource
from cuzkd.status.document import encode_status
from cuzkd.status.tracker import StatusTracker

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # support.tlsfiles
from support.tlsfiles import basic_auth, make_tls_files, write_web_config

KINDS = ("porep-c2", "snap-update", "window-post", "winning-post")


def busy_document(jobs: int, partitions: int, workers: int, plain: bool,
                  pretty: bool = False) -> bytes:
    """An engine's document with every job in flight and partitions spread over all phases."""
    tracker = StatusTracker()
    tracker.register_workers((w, w // 2) for w in range(workers))
    free_workers = list(range(workers))
    for j in range(jobs):
        job = f"ps-{KINDS[j % 4]}-{1000 + j}-{j * 7}-{j * 131}"
        tracker.register_job(job, KINDS[j % 4], partitions)
        for p in range(partitions):
            stage = (j + p) % 5
            if stage >= 1:
                tracker.partition_synth_start(job, p)
            if stage >= 2:
                tracker.partition_synth_end(job, p)
            if stage >= 3 and free_workers:
                worker = free_workers.pop()
                tracker.partition_gpu_start(job, p, worker)
                if stage == 4:
                    tracker.partition_gpu_end(job, p, worker)
                    free_workers.append(worker)
    doc = tracker.snapshot()
    if plain:
        doc = type(doc)(**{f: getattr(doc, f) for f in doc.__struct_fields__
                           if f != "cuzkd_extensions"})
    body = encode_status(doc)
    return json.dumps(json.loads(body), indent=2).encode() if pretty else body


# --- child: engines + Prometheus ---------------------------------------------------------------


async def serve_document(body: bytes, socket_path: str, piece: int = 0) -> web.AppRunner:
    """An engine stand-in: ``GET /status`` on a unix socket answers ``body`` (already encoded)
    with its ``uptime_secs`` advanced to the time since start (so the supervisor's deriver
    folds every document in, as with a live engine), in one write, or chunked in
    ``piece``-byte writes."""
    uptime = re.search(rb'"uptime_secs": ?([0-9.eE+-]+)', body)
    assert uptime is not None
    head, tail = body[:uptime.start(1)], body[uptime.end(1):]
    started = time.monotonic() - float(uptime.group(1))

    async def status(request: web.Request) -> web.StreamResponse:
        body = b"%s%.6f%s" % (head, time.monotonic() - started, tail)
        if not piece:
            return web.Response(body=body, content_type="application/json")
        resp = web.StreamResponse(headers={"Content-Type": "application/json"})
        resp.enable_chunked_encoding()
        await resp.prepare(request)
        for start in range(0, len(body), piece):
            await resp.write(body[start:start + piece])
        await resp.write_eof()
        return resp

    app = web.Application()
    app.router.add_get("/status", status)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.UnixSite(runner, socket_path).start()
    return runner


async def timed_scrapes(url: str, args: argparse.Namespace, *,
                        cpu_ns: Callable[[], int] | None = None,
                        pause: float = 0.0,
                        tls: ssl.SSLContext | None = None,
                        ) -> tuple[list[float], list[float], bytes]:
    """Scrape ``url`` ``--warmup`` + ``--scrapes`` times (gzip asked, as Prometheus does;
    with ``tls``: trusting that context, with the basic auth password).

    Returns the latencies (s) and, when ``cpu_ns`` reads the server's CPU clock, its CPU
    per scrape (ms) for the timed scrapes, and the last body.
    """
    latencies: list[float] = []
    cpu: list[float] = []
    text = b""
    headers = {"Accept-Encoding": "gzip"}
    if tls:
        headers.update(basic_auth())
    fresh = getattr(args, "new_connections", False)
    async with ClientSession(connector=TCPConnector(ssl=tls or False, force_close=fresh)
                             ) as session:
        for i in range(args.warmup + args.scrapes):
            cpu_before = cpu_ns() if cpu_ns else 0
            started = time.perf_counter()
            async with session.get(url, headers=headers) as resp:
                text = await resp.read()
                assert resp.status == 200, resp.status
            if i >= args.warmup:
                latencies.append(time.perf_counter() - started)
                if cpu_ns:
                    cpu.append((cpu_ns() - cpu_before) / 1e6)
            if pause:
                await asyncio.sleep(pause)
    return latencies, cpu, text


async def child(args: argparse.Namespace) -> None:
    body = busy_document(args.jobs, args.partitions, args.workers, args.plain, args.pretty)
    runners = [await serve_document(body, str(Path(args.sockets) / f"e{e}.sock"), args.piece)
               for e in range(args.engines)]
    latencies, _, text = await timed_scrapes(f"http://127.0.0.1:{args.port}/metrics", args)
    for runner in runners:
        await runner.cleanup()
    print(json.dumps({"latencies": latencies, "status_bytes": len(body),
                      "metrics_bytes": len(text)}))


# --- parent: the supervisor side ---------------------------------------------------------------


async def parent(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory() as sockets:
        sources = [StatusSource(f"unix:{sockets}/e{e}.sock", timeout=2.0)
                   for e in range(args.engines)]

        async def provider() -> SupervisorSample:
            docs = await asyncio.gather(*(s.fetch(args.max_age) for s in sources))
            return SupervisorSample(
                engines=[
                    EngineSample(
                        name=f"e{e}", state="running", restarts_total=0, exits_total={},
                        start_time_seconds=time.time(), resident_memory_bytes=2**30,
                        cpu_seconds_total=1.0, status=doc, extensions=source.extensions(),
                        fetch_duration_seconds=source.last_fetch_duration_seconds,
                        fetch_errors_total=source.fetch_errors_total)
                    for e, (source, doc) in enumerate(zip(sources, docs, strict=True))
                ],
                zombies_reaped_total=0)

        handler = make_metrics_handler(provider)
        cpu: list[float] = []
        errors = 0

        async def timed(request: web.Request) -> web.StreamResponse:
            nonlocal errors
            started = time.process_time()
            response = await handler(request)
            cpu.append(time.process_time() - started)
            errors += sum(s.fetch_errors_total for s in sources) > 0
            return response

        app = web.Application()
        app.router.add_get("/metrics", timed)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = runner.addresses[0][1]
        cmd = [sys.executable, __file__, "--child", "--port", str(port), "--sockets", sockets,
               *sys.argv[1:]]
        proc = await asyncio.create_subprocess_exec(*cmd, stdout=subprocess.PIPE)
        out, _ = await proc.communicate()
        await runner.cleanup()
        for source in sources:
            await source.close()
    result = json.loads(out)
    lat = sorted(result["latencies"])
    measured = cpu[args.warmup:]
    print(f"engines={args.engines} workers={args.workers} jobs={args.jobs}x{args.partitions} "
          f"plain={args.plain} max_age={args.max_age}s scrapes={len(lat)}")
    print(f"status document: {result['status_bytes'] / 1024:.0f} KiB per engine; "
          f"/metrics body: {result['metrics_bytes'] / 1024:.1f} KiB uncompressed")
    print(f"latency  p50 {1000 * statistics.median(lat):.1f} ms  "
          f"p99 {1000 * lat[int(0.99 * (len(lat) - 1))]:.1f} ms")
    print(f"supervisor CPU per scrape: mean {1000 * statistics.fmean(measured):.1f} ms  "
          f"p50 {1000 * statistics.median(measured):.1f} ms")
    if errors:
        print(f"WARNING: {errors} scrapes saw fetch errors")


# --- --supervisor: the real `cuzkd run` ----------------------------------------------------------


async def engine_main(body: bytes, socket_path: str, piece: int) -> None:
    """``--serve-document FILE --socket PATH``: one engine for the supervisor, until SIGTERM."""
    await serve_document(body, socket_path, piece)
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    await stop.wait()


def supervisor_config(tmp: Path, document: Path, engines: int, piece: int,
                      web_config: Path | None = None) -> Path:
    """A cuzkd.toml: ``engines`` engines running this script in --serve-document mode."""
    web = f"web_config = {json.dumps(str(web_config))}\n" if web_config else ""
    lines = [f"[supervisor]\nstate_dir = {json.dumps(str(tmp / 'state'))}\n",
             f'[metrics]\nlisten = "127.0.0.1:0"\n{web}']
    for e in range(engines):
        sock = tmp / f"e{e}.sock"
        command = [sys.executable, __file__, "--serve-document", str(document),
                   "--socket", str(sock), "--piece", str(piece)]
        lines.append(f'[[engine]]\nname = "e{e}"\ncommand = {json.dumps(command)}\n'
                     f'status_url = "unix:{sock}"\n')
    path = tmp / "cuzkd.toml"
    path.write_text("\n".join(lines))
    return path


def on_cpu_ns(pid: int) -> int:
    """Nanoseconds all threads of ``pid`` have run on a CPU (schedstat's first field)."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            total += int((task / "schedstat").read_text().split()[0])
        except (OSError, IndexError):
            continue  # a thread that just exited
    return total


async def control_get(socket_path: Path, path: str) -> dict[str, object]:
    async with ClientSession(connector=UnixConnector(path=str(socket_path))) as session, \
            session.get(f"http://cuzkd{path}") as resp:
        return await resp.json()  # type: ignore[no-any-return]


async def wait_ready(proc: subprocess.Popen[bytes], control: Path, engines: int) -> str:
    """The metrics address once every engine is running (polls the control API)."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"cuzkd run exited {proc.returncode}")
        try:
            listed = (await control_get(control, "/v1/engines"))["engines"]
            running = sum(e["state"] == "running" for e in listed)  # type: ignore[index, union-attr]
            if running == engines:
                return str((await control_get(control, "/v1/supervisor"))["metrics_listen"])
        except OSError:
            pass
        await asyncio.sleep(0.1)
    raise SystemExit("engines did not all start within 60 s")


def handshakes(body: bytes) -> int:
    """``cuzkd_metrics_tls_handshakes_total{result="ok"}`` in a /metrics body."""
    found = re.search(rb'^cuzkd_metrics_tls_handshakes_total\{result="ok"\} (\S+)$', body, re.M)
    return int(float(found.group(1))) if found else 0


async def scrape_supervisor(args: argparse.Namespace, proc: subprocess.Popen[bytes],
                            control: Path, tls: ssl.SSLContext | None) -> None:
    """Wait for the engines, measure the idle rate, then time ``--scrapes`` scrapes."""
    address = await wait_ready(proc, control, args.engines)
    sup = psutil.Process(proc.pid)
    # Idle rate first: health polls of every document each second, no scrapes.
    idle_ns, idle_started = on_cpu_ns(proc.pid), time.monotonic()
    await asyncio.sleep(args.idle)
    idle_rate = (on_cpu_ns(proc.pid) - idle_ns) / 1e6 / (time.monotonic() - idle_started)
    ticks_before = sum(sup.cpu_times()[:2])
    loop_started = time.monotonic()
    latencies, cpu, text = await timed_scrapes(
        f"{'https' if tls else 'http'}://{address}/metrics", args,
        cpu_ns=lambda: on_cpu_ns(proc.pid), pause=args.pause, tls=tls)
    loop_secs = time.monotonic() - loop_started
    psutil_ms = (sum(sup.cpu_times()[:2]) - ticks_before) * 1000
    lat = sorted(latencies)
    n = args.warmup + args.scrapes
    print(f"real supervisor: engines={args.engines} workers={args.workers} "
          f"jobs={args.jobs}x{args.partitions} plain={args.plain} scrapes={len(lat)} "
          f"pause={args.pause}s loadavg={' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print(f"listener: {'TLS + basic auth' if tls else 'plain HTTP'}, "
          f"{'a new connection per scrape' if args.new_connections else 'kept alive'}; "
          f"TLS handshakes per scrape {handshakes(text) / n:.2f}")
    print(f"/metrics body: {len(text) / 1024:.1f} KiB (gzip on the wire, inflated by aiohttp)")
    print(f"latency  p50 {1000 * statistics.median(lat):.1f} ms  "
          f"p99 {1000 * lat[int(0.99 * (len(lat) - 1))]:.1f} ms")
    print(f"supervisor CPU per scrape (schedstat): p50 {statistics.median(cpu):.1f} ms  "
          f"mean {statistics.fmean(cpu):.1f} ms")
    print(f"supervisor CPU idle (health polls only): {idle_rate:.1f} ms/s "
          f"({idle_rate / 10:.2f} % of one core); during the scrape "
          f"loop (psutil): {psutil_ms / loop_secs:.1f} ms/s, "
          f"{(psutil_ms - idle_rate * loop_secs) / n:.1f} ms per scrape net of idle")


def measure_supervisor(args: argparse.Namespace) -> None:
    """``--supervisor``: run ``cuzkd run`` over ``--engines`` document engines and scrape it."""
    body = busy_document(args.jobs, args.partitions, args.workers, args.plain, args.pretty)
    print(f"status document: {len(body) / 1024:.0f} KiB per engine")
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        (tmp / "status.json").write_bytes(body)
        web_config, tls = None, None
        if args.tls:
            files = make_tls_files(tmp / "tls")
            web_config = write_web_config(tmp / "web.yml", files, cost=10)
            tls = ssl.create_default_context(cafile=str(files.ca))
        config = supervisor_config(tmp, tmp / "status.json", args.engines, args.piece,
                                   web_config)
        with (tmp / "cuzkd.log").open("wb") as log:
            proc = subprocess.Popen([sys.executable, "-m", "cuzkd", "run", "--config",
                                     str(config)], stdout=log, stderr=subprocess.STDOUT)
        try:
            asyncio.run(scrape_supervisor(args, proc, tmp / "state" / "control.sock", tls))
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(60)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engines", type=int, default=8)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--jobs", type=int, default=64)
    parser.add_argument("--partitions", type=int, default=16)
    parser.add_argument("--scrapes", type=int, default=200)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--max-age", type=float, default=0.0)
    parser.add_argument("--plain", action="store_true")
    parser.add_argument("--pretty", action="store_true", help="pretty-print documents as cuzk")
    parser.add_argument("--piece", type=int, default=0,
                        help="engines write the document chunked in pieces of this many bytes")
    parser.add_argument("--supervisor", action="store_true",
                        help="measure a real `cuzkd run` (engines via status_url)")
    parser.add_argument("--pause", type=float, default=0.05,
                        help="--supervisor: seconds between scrapes")
    parser.add_argument("--idle", type=float, default=5.0,
                        help="--supervisor: seconds of idle CPU measured first")
    parser.add_argument("--tls", action="store_true",
                        help="--supervisor: TLS and basic auth on the listener (web_config)")
    parser.add_argument("--new-connections", action="store_true",
                        help="--supervisor: a new connection per scrape (default: kept alive)")
    parser.add_argument("--serve-document", help=argparse.SUPPRESS)
    parser.add_argument("--socket", help=argparse.SUPPRESS)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--sockets", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_document:
        asyncio.run(engine_main(Path(args.serve_document).read_bytes(), args.socket, args.piece))
    elif args.supervisor:
        measure_supervisor(args)
    else:
        asyncio.run(child(args) if args.child else parent(args))


if __name__ == "__main__":
    main()
