"""The ``cuzkd`` command line.

Each concern registers its own subcommands (``register(subparsers)``) so this module stays a
table of contents: ``run``/``check-config``/``status``/``start``/``stop``/``restart`` come from
the supervisor, ``engine``/``bench`` from the reference engine, ``swap`` from the swap package.
Every subcommand handler takes the parsed arguments and returns the process exit code.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence

from cuzkd import __version__
from cuzkd.engine import cli as engine_cli
from cuzkd.supervisor import cli as supervisor_cli
from cuzkd.swap import cli as swap_cli

Handler = Callable[[argparse.Namespace], int]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="cuzkd",
        description="Supervise GPU proving engines, export their state to Prometheus, "
        "and swap engine binaries safely.",
    )
    parser.add_argument("--version", action="version", version=f"cuzkd {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    supervisor_cli.register(sub)
    swap_cli.register(sub)
    engine_cli.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(swap_cli.join_smoke_value(sys.argv[1:] if argv is None else argv))
    handler: Handler | None = getattr(args, "handler", None)
    if handler is None:
        parser.print_help()
        return 2
    return handler(args)
