"""The ``cuzkd`` command line.

Each concern registers its own subcommands (``register(subparsers)``) so this module stays a
table of contents: ``run``/``check-config``/``status``/``reload``/``start``/``stop``/``restart``
come from the supervisor, ``engine``/``bench`` from the reference engine, ``swap`` from the
swap package. Registering is cheap by rule: a subcommand's heavy imports (NumPy, aiohttp, the
daemon, the engine) happen in its handler, so ``cuzkd --version``, ``status``, ``stop``,
``reload`` and ``swap`` start in a fraction of the engine's import time
(``tests/supervisor/test_cli_status.py`` holds it).
Every subcommand handler takes the parsed arguments and returns the process exit code; the
errors every client subcommand can meet are turned into exit codes here, once, following
sysexits.h: 78 (EX_CONFIG) for a bad config, 69 (EX_UNAVAILABLE) when the supervisor's control
socket cannot be reached, 1 when the supervisor refuses a request; 141 (as if SIGPIPE had ended
it) when whoever read the output went away.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence

from cuzkd import __version__
from cuzkd.cli import engine_commands, supervisor_commands, swap_commands
from cuzkd.cli.control_client import ControlRequestFailed, ControlUnavailable
from cuzkd.config import ConfigError
from cuzkd.errors import EX_CONFIG

Handler = Callable[[argparse.Namespace], int]

EX_UNAVAILABLE = 69
#: A command whose output pipe closed exits as if SIGPIPE had ended it (128 + 13).
EX_SIGPIPE = 141


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
    except ConfigError as exc:
        return _fail(exc, EX_CONFIG)
    except ControlUnavailable as exc:
        return _fail(exc, EX_UNAVAILABLE)
    except ControlRequestFailed as exc:
        return _fail(exc, 1)


def _fail(error: Exception, code: int) -> int:
    print(f"cuzkd: {error}", file=sys.stderr)
    return code
