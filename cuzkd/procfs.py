"""The kernel's ``/proc``: the root every reader of it takes, and the pids it lists.

Each function that reads ``/proc`` takes the root as an argument (``proc_root``, defaulting to
:data:`PROC_ROOT`), as prometheus_client's ``ProcessCollector(proc=...)`` does. The live tree
cannot be made to show the cases the parsers must survive -- a command name with spaces and
parentheses, a process gone between the listing and the read, a field that does not parse, an
executable replaced under a running process -- so the tests write those files under a
temporary directory and point the readers at it. Dependency-free: every layer may import it.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

PROC_ROOT = Path("/proc")


def listed_pids(proc_root: Path = PROC_ROOT) -> Iterator[int]:
    """The pids ``proc_root`` lists (its numeric entries), as it lists them."""
    return (int(entry.name) for entry in proc_root.iterdir() if entry.name.isdigit())
