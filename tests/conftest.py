"""Shared test configuration: paths to the reference material beside the checkout."""

from __future__ import annotations

from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent
SHARED_REFERENCE = REPO_ROOT.parent / "shared" / "reference"


@pytest.fixture(scope="session")
def reference_dir() -> Path:
    """``../shared/reference``: cuzk's status document description and example."""
    if not SHARED_REFERENCE.is_dir():
        pytest.fail(f"reference material missing: {SHARED_REFERENCE}")
    return SHARED_REFERENCE
