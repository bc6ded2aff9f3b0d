"""Engine test helpers: the cuzk field-list checker from tests/support."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from support.cuzk_schema import document_errors


@pytest.fixture(scope="session")
def cuzk_field_errors() -> Callable[[bytes], list[str]]:
    """``errors(raw_json)``: every mismatch with cuzk's documented field list (empty = valid)."""
    return document_errors
