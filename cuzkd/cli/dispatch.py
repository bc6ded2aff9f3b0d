"""The ``cuzkd`` command line.

Each concern registers its own subcommands (``register(subparsers)``) so this module stays a
table of contents: ``run``/``check-config``/``status``/``reload``/``start``/``stop``/``restart``
come from the supervisor, ``engine``/``bench`` from the reference engine, ``swap`` from the
swap package. Registering is cheap by rule: a subcommand's heavy imports (NumPy, aiohttp, the
daemon, the engine) happen in its handler, so ``cuzkd --version``, ``status``, ``stop``,
``reload`` and ``swap`` start in a fraction of the engine's import time
(``tests/cli/test_engine_status.py`` holds it).
Every subcommand handler takes the parsed arguments and returns the process exit code; an error
that escapes a handler is a :class:`~cuzkd.errors.CuzkdError` and ends the command with its own
``exit_code`` (:mod:`cuzkd.errors`, following sysexits.h): 78 (EX_CONFIG) for a bad config, 69
(EX_UNAVAILABLE) when the supervisor's control socket cannot be reached, 1 when the supervisor
refuses a request; 141 (as if SIGPIPE had ended it) when whoever read the output went away.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence

from cuzkd import __version__
from cuzkd.cli import engine_commands, supervisor_commands, swap_commands
from cuzkd.errors import EX_SIGPIPE, CuzkdError

Handler = Callable[[argparse.Namespace], int]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="cuzkd",
        description="Supervise GPU proving engines, export their state to Prometheus, "
        "and swap engine binaries safely.",
    )
    parser.add_argument("--version", action="version", version=f"cuzkd {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    supervisor_commands.register(sub)
    swap_commands.register(sub)
    engine_commands.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(swap_commands.join_smoke_value(sys.argv[1:] if argv is None else argv))
    handler: Handler | None = getattr(args, "handler", None)
    if handler is None:
        parser.print_help()
        return 2
    try:
        code = handler(args)
        sys.stdout.flush()  # a reader gone away shows here, not as a traceback at exit
        return code
    except BrokenPipeError:  # `cuzkd status | head -1`: nobody reads the rest
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # for the exit flush
        return EX_SIGPIPE
    except CuzkdError as exc:
        print(f"cuzkd: {exc}", file=sys.stderr)
        return exc.exit_code
