"""Make ``k8s_support`` importable from the Kubernetes tests (pytest's importlib mode puts no
test directory on ``sys.path``), and ``ops_support``/``live_support`` that they reuse."""

from __future__ import annotations

import sys
from pathlib import Path

_TESTS = Path(__file__).resolve().parent.parent
for _dir in (_TESTS / "k8s", _TESTS / "ops", _TESTS / "live", _TESTS / "supervisor"):
    if str(_dir) not in sys.path:
        sys.path.insert(0, str(_dir))
