"""Make ``ops_support`` importable from the ops tests.

pytest runs with ``--import-mode=importlib``, which puts no test directory on ``sys.path``;
the shared helpers live beside the tests (tests/ops/ops_support.py), so add this directory.
The module name is prefixed to avoid clashing with anything else on the path.
"""

from __future__ import annotations

import sys
from pathlib import Path

_HERE = str(Path(__file__).resolve().parent)
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)
