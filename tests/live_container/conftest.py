"""Import paths for the container tests (pytest's importlib mode adds no test directory):
this one (podman_support) and those of the helpers reused from other areas (sv_harness,
live_support)."""

from __future__ import annotations

import sys
from pathlib import Path

_TESTS = Path(__file__).resolve().parent.parent
for _dir in (_TESTS / "live_container", _TESTS / "live", _TESTS / "supervisor"):
    if str(_dir) not in sys.path:
        sys.path.insert(0, str(_dir))
