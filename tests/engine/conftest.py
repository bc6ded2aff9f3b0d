"""Engine test helpers: the cuzk field-list checker, reused from the status tests."""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

_SCHEMA_TESTS = Path(__file__).resolve().parent.parent / "status" / "test_status_schema.py"


@pytest.fixture(scope="session")
def cuzk_field_errors() -> Callable[[bytes], list[str]]:
    """``errors(raw_json)``: every mismatch with cuzk's documented field list (empty = valid).

    The schema is the one the status tests maintain from ``cuzk-status.md``; loading it here
    keeps one definition of cuzk's fields.
    """
    spec = importlib.util.spec_from_file_location("_engine_cuzk_schema", _SCHEMA_TESTS)
    assert spec is not None and spec.loader is not None
    module: Any = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)

    def errors(raw: bytes) -> list[str]:
        import json

        found: list[str] = module.check(json.loads(raw), module.SCHEMA,
                                        extra_keys=frozenset({"cuzkd_extensions"}))
        return found

    return errors
