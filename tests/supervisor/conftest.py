"""Supervisor tests: put this directory on sys.path for ``sv_harness`` and the fake engine."""

from __future__ import annotations

import sys
from pathlib import Path

HERE = str(Path(__file__).resolve().parent)
if HERE not in sys.path:
    sys.path.insert(0, HERE)
