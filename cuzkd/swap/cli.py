"""Subcommands of the swap package (placeholder until its issue lands)."""

from __future__ import annotations

import argparse
from typing import Any


def register(sub: argparse._SubParsersAction[Any]) -> None:
    """Add this package's subcommands to ``cuzkd``."""
