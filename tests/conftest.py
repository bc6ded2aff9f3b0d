"""Shared test configuration: where the reference fixtures live.

The suite is self-contained: cuzk's status document description and its example document are
copied into ``tests/fixtures/`` (public reference material), so a plain clone passes without
any sibling directory.
"""

from __future__ import annotations

from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent
FIXTURES_DIR = REPO_ROOT / "tests" / "fixtures"


@pytest.fixture(scope="session")
def reference_dir() -> Path:
    """``tests/fixtures``: cuzk's status document description and example."""
    return FIXTURES_DIR
