"""The ``cuzkd`` command line: the console script (``cuzkd.cli:main``), ``python -m cuzkd``.

For ``cuzkd run`` the signals are taken in hand
(:func:`~cuzkd.supervisor.daemon.signalinstall.hold`) before :mod:`.dispatch` and everything it
pulls in are imported: the daemon's imports and its config read take most of a second, and a
signal in that window must be one more stop (or an ignored stray), never a silent death or a
``KeyboardInterrupt`` traceback. Other subcommands keep Python's defaults (Ctrl-C ends
``cuzkd status --watch`` as it should).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["run"]:
        from cuzkd.supervisor.daemon import signalinstall

        signalinstall.hold()
        signalinstall.unblock_after_exec(args)  # cuzkd upgrade's exec blocked them all
    from cuzkd.cli.dispatch import main as dispatch_main

    return dispatch_main(argv)
