"""Shared test configuration: where the reference fixtures live.

The suite is self-contained: cuzk's status document description and its example document are
copied into ``tests/fixtures/`` (public reference material), so a plain clone passes without
any sibling directory.
"""

from __future__ import annotations

import signal
from pathlib import Path, PurePosixPath
from typing import Any

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent


def _default_dispositions() -> None:
    """Undo SIGHUP, SIGINT and SIGQUIT ignored by whoever started the suite.

    A suite started with ``nohup`` or as ``cmd &`` from a script inherits them ignored, and so
    would every program a test starts: Ctrl-C would not end ``cuzkd status --watch`` and SIGHUP
    would not kill the cuzk stand-in. The tests check what a program does as a shell or systemd
    starts it, with the default dispositions (each xdist worker imports this file too).
    """
    for signum in (signal.SIGHUP, signal.SIGINT, signal.SIGQUIT):
        if signal.getsignal(signum) == signal.SIG_IGN:
            default = signal.default_int_handler if signum == signal.SIGINT else signal.SIG_DFL
            signal.signal(signum, default)


_default_dispositions()
FIXTURES_DIR = REPO_ROOT / "tests" / "fixtures"


@pytest.fixture(scope="session")
def reference_dir() -> Path:
    """``tests/fixtures``: cuzk's status document description and example."""
    return FIXTURES_DIR


#: Test folders that boot whole machines (systemd as PID 1, podman containers): each is heavy
#: (a few hundred MB, most of a core), and run beside each other they failed (a container's
#: listener not up within a minute, a state directory seen mid-creation), so under ``pytest -n``
#: (scripts/test.sh) they all run on one worker, one after the other, while the other workers
#: take the rest of the suite.
MACHINE_FOLDERS = ("live_systemd", "live_container")


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """Hand out whole test files, and every machine-booting file as one unit.

    xdist's ``loadgroup`` would do this from marks, but under pytest 9 it cannot rename the
    node ids it groups by; a scope function is xdist's documented way to the same end.
    """
    from xdist.scheduler import LoadScopeScheduling

    class MachinesTogether(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            path = nodeid.split("::", 1)[0]
            return "machines" if PurePosixPath(path).parent.name in MACHINE_FOLDERS else path

    return MachinesTogether(config, log)
