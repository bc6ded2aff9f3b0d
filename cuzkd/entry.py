"""The ``cuzkd`` console script and ``python -m cuzkd``.

For ``cuzkd run`` the signals are taken in hand (:func:`cuzkd.supervisor.signalinstall.hold`)
before :mod:`cuzkd.cli` and everything it pulls in are imported: the daemon's imports and its
config read take most of a second, and a signal in that window must be one more stop (or an
ignored stray), never a silent death or a ``KeyboardInterrupt`` traceback. Other subcommands keep
Python's defaults (Ctrl-C ends ``cuzkd status --watch`` as it should).
"""

from __future__ import annotations

import sys


def main() -> int:
    if sys.argv[1:2] == ["run"]:
        from cuzkd.supervisor import signalinstall

        signalinstall.hold()
    from cuzkd.cli import main as cli_main

    return cli_main()
