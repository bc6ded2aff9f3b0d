"""Crash-injection child: run one release-store operation and SIGKILL itself after a step.

Usage: swap_crash_child.py STATE_DIR OPERATION ARGUMENT STEP
  install SOURCE | activate RELEASE_ID | rollback - | prune KEEP | judge RELEASE_ID

Drives the same ``*_steps`` generators the store's public methods run, so the crash happens
inside the real sequence. Exits 3 if STEP never came (the test then fails).
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Generator
from pathlib import Path
from typing import Any

from cuzkd.swap.releases import ReleaseStore


def steps(store: ReleaseStore, operation: str, argument: str) -> Generator[str, None, Any]:
    if operation == "install":
        return store.install_steps(Path(argument))
    if operation == "activate":
        return store.activate_steps(next(r for r in store.releases() if r.id == argument))
    if operation == "rollback":
        return store.rollback_steps()
    if operation == "prune":
        return store.prune_steps(int(argument))
    if operation == "judge":  # accept the release: one durable save of the history
        release = next(r for r in store.releases() if r.id == argument)
        return store.judge_steps(release, "accepted", "healthy")
    raise SystemExit(f"unknown operation {operation!r}")


def main() -> int:
    state_dir, operation, argument, crash_after = sys.argv[1:]
    for step in steps(ReleaseStore(Path(state_dir)), operation, argument):
        if step == crash_after:
            os.kill(os.getpid(), signal.SIGKILL)
    return 3


if __name__ == "__main__":
    sys.exit(main())
