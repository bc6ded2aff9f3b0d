"""The live stack of the live tests (see tests/support/live_stack.py)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from support.live_stack import LiveStack, live_stack


@pytest.fixture(scope="package")
def live(tmp_path_factory: pytest.TempPathFactory, reference_dir: Path) -> Iterator[LiveStack]:
    """One supervisor + engines + Prometheus for the live tests (started on first use), stopped
    after the last of them: its demo engines keep most of a core busy, which every later test
    on a 2-core CI machine would pay for."""
    with live_stack(tmp_path_factory.mktemp("live"),
                    reference_dir / "cuzk-status.example.json") as stack:
        yield stack
