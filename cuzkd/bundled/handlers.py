"""``cuzkd engine`` (serve the reference engine) and ``cuzkd bench`` (load it): the handlers.

Their arguments are in :mod:`cuzkd.cli.engine_commands`, which imports this module on use.

The engine's start-up does no heavy work before it binds: config, backend choice and empty
queues only, so a supervisor's first ``/status`` poll is answered within a fraction of a second.
NTT tables are built lazily by the first partition of each size.

Draining: the first SIGTERM/SIGINT, or ``POST /v1/drain``, stops intake (new jobs get 503 with
``Retry-After``), finishes every accepted job within ``drain_timeout`` (jobs still open then
fail with "drain timeout") and exits 0. A signal during a drain begun over HTTP ends the drain
at once (the supervisor's drain_timeout elapsed: its stop signal follows); a second signal
exits at once with 128 + signal.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import os
import signal
import sys
from pathlib import Path

import grpc
import structlog

from cuzkd.bundled import prover
from cuzkd.bundled.backend import select_backend
from cuzkd.bundled.budget import MemoryBudget
from cuzkd.bundled.grpcface import check_grpc_listen, start_grpc
from cuzkd.bundled.heap import return_large_frees
from cuzkd.bundled.loadgen import run_bench
from cuzkd.bundled.pipeline import Engine
from cuzkd.bundled.server import build_app, check_listen, start_site
from cuzkd.bundled.settings import ProverConfig, default_config, demo_config, load_config
from cuzkd.errors import BackendError, BenchError, ListenError, ProverConfigError
from cuzkd.httperrors import JsonErrorsRunner
from cuzkd.kinds import ProofKind
from cuzkd.log.configure import configure_logging
from cuzkd.status.tracker import StatusTracker
from cuzkd.unixsock import remove_stale_socket

_log = structlog.get_logger("cuzkd.engine")
#: How long gRPC calls still open at exit may take to get their reply out (the drain has
#: finished or failed every job by then, so each has its answer ready).
GRPC_STOP_GRACE_SECS = 2.0


def run_engine(args: argparse.Namespace) -> int:
    configure_logging(level=args.log_level, log_format=args.log_format)
    try:
        http = check_listen(args.listen)  # a typo fails at once, before any start-up work
        if args.grpc_listen is not None:
            check_grpc_listen(args.grpc_listen, http)
        if args.demo:
            config = demo_config()
        else:
            config = default_config() if args.config is None else load_config(args.config)
        for notice in config.notices:
            _log.warning("config_warning", detail=notice)
        if args.test_slowdown != 1.0 or args.test_failure_rate != 0.0:
            config = dataclasses.replace(config, test_slowdown=args.test_slowdown,
                                         test_failure_rate=args.test_failure_rate)
        return asyncio.run(serve(config, args.listen, args.grpc_listen))
    except ProverConfigError as exc:
        print(f"cuzkd engine: config error: {exc}", file=sys.stderr)
        return exc.exit_code
    except (BackendError, ListenError) as exc:
        print(f"cuzkd engine: {exc}", file=sys.stderr)
        return exc.exit_code


async def serve(config: ProverConfig, listen: str, grpc_listen: str | None = None) -> int:
    """Run the engine until a signal, then drain. Returns the exit code. ``grpc_listen``:
    also serve cuzk's gRPC there (:mod:`cuzkd.bundled.grpcface`)."""
    return_large_frees()  # resident memory follows the budget (see engine/heap.py)
    backend = select_backend(config.backend, config.devices)
    budget = MemoryBudget(config.memory_budget_bytes, nominal_request=sum(
        prover.partition_bytes(config.size_log2(ProofKind.SNAP_UPDATE), backend.computes_on_host)))
    tracker = StatusTracker(budget=budget)
    engine = Engine(config, backend, tracker, budget)
    runner = JsonErrorsRunner(build_app(engine), handle_signals=False)
    await engine.start()
    await runner.setup()
    loop = asyncio.get_running_loop()
    signals = 0

    def on_signal(signum: int) -> None:
        nonlocal signals
        signals += 1
        name = signal.Signals(signum).name
        if signals > 1:
            _log.warning("engine_drain_abandoned", signal=name)
            os._exit(128 + signum)
        if not engine.begin_drain(config.drain_timeout_secs, name):
            _log.warning("engine_drain_cut", signal=name, open_jobs=engine.open_jobs)
            engine.cut_drain()

    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, on_signal, signum)
    address = ""
    grpc_server: grpc.aio.Server | None = None
    grpc_address = ""
    try:
        address = await start_site(runner, listen)
        if grpc_listen is not None:
            grpc_server, grpc_address = await start_grpc(engine, grpc_listen)
        _log.info("engine_listening", address=address, grpc_address=grpc_address,
                  backend=str(backend.name),
                  devices=[name for _, name in backend.devices], workers=len(engine.workers),
                  memory_budget_bytes=config.memory_budget_bytes, pid=os.getpid())
        drained = await engine.drained()
        _log.info("engine_stopped", drained=drained)
    finally:
        if grpc_server is not None:  # first: the replies of proofs the drain finished go out
            await grpc_server.stop(GRPC_STOP_GRACE_SECS)
        await engine.close()
        await runner.cleanup()
        if address.startswith("unix:"):  # ours only once bound: never what bind refused
            remove_stale_socket(Path(address.removeprefix("unix:")))
        if grpc_address.startswith("unix://"):
            remove_stale_socket(Path(grpc_address.removeprefix("unix://")))
    return 0


def run_bench_command(args: argparse.Namespace) -> int:
    try:
        report = asyncio.run(run_bench(
            args.engine, jobs=args.jobs, kind=args.kind, partitions=args.partitions,
            size_log2=args.size_log2, timeout_secs=args.timeout,
            # A progress bar is for a person watching: never into a log file or a pipe.
            progress=sys.stderr if sys.stderr.isatty() and not args.no_progress else None))
    except (BenchError, OSError) as exc:  # aiohttp.ClientError subclasses OSError (connections)
        print(f"cuzkd bench: {exc}", file=sys.stderr)
        return 1
    print(report.to_json() if args.json else report.to_text())
    return 0 if report.ok else 1
