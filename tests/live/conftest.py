"""The session's live stack (see live_stack.py), and import paths for the live tests.

pytest's importlib mode puts no test directory on ``sys.path``: add this one (live_support,
live_stack) and those of the helpers reused from other areas (sv_harness, ops_support).
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

_TESTS = Path(__file__).resolve().parent.parent
for _dir in (_TESTS / "live", _TESTS / "supervisor", _TESTS / "ops"):
    if str(_dir) not in sys.path:
        sys.path.insert(0, str(_dir))

from live_stack import LiveStack, live_stack  # noqa: E402


@pytest.fixture(scope="package")
def live(tmp_path_factory: pytest.TempPathFactory, reference_dir: Path) -> Iterator[LiveStack]:
    """One supervisor + engines + Prometheus for the live tests (started on first use), stopped
    after the last of them: its demo engines keep most of a core busy, which every later test
    on a 2-core CI machine would pay for."""
    with live_stack(tmp_path_factory.mktemp("live"),
                    reference_dir / "cuzk-status.example.json") as stack:
        yield stack
