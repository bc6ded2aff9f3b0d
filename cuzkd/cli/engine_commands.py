"""``cuzkd engine`` and ``cuzkd bench``: their arguments.

Kept outside the engine package on purpose: every ``cuzkd`` call registers every subcommand,
and ``cuzkd status`` or ``cuzkd --version`` must not pay for NumPy and the engine. The
handlers in :mod:`cuzkd.bundled.handlers` are imported when one of these two commands runs.
"""

from __future__ import annotations

import argparse
import sys
from fractions import Fraction
from pathlib import Path
from typing import Any

from cuzkd.kinds import ProofKind, deprecation, normalise_kind
from cuzkd.log.configure import LogFormat, LogLevel
from cuzkd.status.document import PARTITIONS


def register(sub: argparse._SubParsersAction[Any]) -> None:
    """Add ``engine`` and ``bench`` to ``cuzkd``."""
    engine = sub.add_parser("engine", help="run the bundled reference proving engine")
    preset = engine.add_mutually_exclusive_group()
    preset.add_argument("--config", type=Path, help="engine TOML config (defaults if absent)")
    preset.add_argument("--demo", action="store_true",
                        help="the engine `cuzkd run --demo` starts: a budget bursts fill and "
                             "synthesis as costly as proving (docs/engine.md)")
    engine.add_argument("--listen", required=True,
                        help="HOST:PORT (port 0 picks a free one) or unix:PATH")
    engine.add_argument("--grpc-listen", metavar="ADDR",
                        help="also serve cuzk's gRPC (cuzk.v1.ProvingEngine) at "
                             "unix:///ABSOLUTE/PATH or HOST:PORT (default: not served)")
    engine.add_argument("--log-level", default=LogLevel.INFO.value,
                        choices=[level.value for level in LogLevel])
    engine.add_argument("--log-format", choices=[f.value for f in LogFormat],
                        default=LogFormat.AUTO.value,
                        help="console lines, JSON lines, or auto: console on a terminal, "
                             "else JSON (under a supervisor: JSON, re-logged as fields)")
    # Test-only switches: a release that proves slower or fails jobs, for exercising swap
    # analysis and its benchmark (docs/engine.md); never for production.
    engine.add_argument("--test-slowdown", type=_slowdown, default=1.0, metavar="FACTOR",
                        help="TEST ONLY: GPU phases take FACTOR times as long (>= 1)")
    engine.add_argument("--test-failure-rate", type=_rate, default=0.0, metavar="RATE",
                        help="TEST ONLY: this share of jobs fails (0..1; 1/3: every third)")
    engine.set_defaults(handler=_run_engine)

    bench = sub.add_parser("bench", help="submit jobs to an engine and report throughput")
    bench.add_argument("--engine", required=True, help="http://HOST:PORT or unix:PATH")
    bench.add_argument("--jobs", type=int, default=10)
    bench.add_argument("--kind", default=ProofKind.SNAP_UPDATE, type=_kind,
                       choices=sorted(PARTITIONS))
    bench.add_argument("--partitions", type=int, help="override the kind's partition count")
    bench.add_argument("--size-log2", type=int, help="override the engine's size for the kind")
    bench.add_argument("--timeout", type=float, default=600.0, help="seconds for the whole run")
    bench.add_argument("--json", action="store_true", help="print the report as JSON")
    bench.add_argument("--no-progress", action="store_true",
                       help="no progress bar (there is none unless stderr is a terminal)")
    bench.set_defaults(handler=_run_bench)


def _run_engine(args: argparse.Namespace) -> int:
    from cuzkd.bundled.handlers import run_engine

    return run_engine(args)


def _run_bench(args: argparse.Namespace) -> int:
    from cuzkd.bundled.handlers import run_bench_command

    return run_bench_command(args)


def _slowdown(text: str) -> float:
    value = float(text)
    if not 1.0 <= value <= 100.0:
        raise argparse.ArgumentTypeError(f"{text!r}: a factor from 1 to 100")
    return value


def _kind(text: str) -> str:
    """A ``--kind`` by cuzk's name; an old name is taken with a warning on stderr (here, where
    the typed word is still known: argparse checks the choices on what this returns)."""
    if (warning := deprecation(text)) is not None:
        print(f"cuzkd bench: warning: {warning}", file=sys.stderr)
    return normalise_kind(text)


def _rate(text: str) -> float:
    """A share as a decimal or a fraction (``1/3``)."""
    value = float(Fraction(text))
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"{text!r}: a share from 0 to 1")
    return value
