"""Parsing of human-written durations and sizes.

Config files are written by operators, so both ``"250ms"`` and ``0.25`` must mean a quarter
second, and ``"8GiB"`` must mean 8 × 2**30 bytes. Every parser raises ``ValueError`` with a
message that quotes the bad value; the config loader adds the key and the file.
"""

from __future__ import annotations

import re

_DURATION_UNITS = {"ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
_DURATION_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h)?\s*$")

_SIZE_UNITS = {
    "": 1,
    "B": 1,
    "KB": 10**3,
    "MB": 10**6,
    "GB": 10**9,
    "TB": 10**12,
    "KiB": 2**10,
    "MiB": 2**20,
    "GiB": 2**30,
    "TiB": 2**40,
}
_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]i?B|B)?\s*$")


def parse_duration(value: str | int | float) -> float:
    """Return seconds for ``"250ms"``, ``"30s"``, ``"5m"``, ``"1h"`` or a plain number."""
    if isinstance(value, bool):
        raise ValueError(f"expected a duration, got {value!r}")
    if isinstance(value, int | float):
        seconds = float(value)
    else:
        match = _DURATION_RE.match(value)
        if match is None:
            raise ValueError(
                f"invalid duration {value!r}: use a number of seconds or a number with "
                "one of the units ms, s, m, h (e.g. '250ms', '30s')"
            )
        seconds = float(match.group(1)) * _DURATION_UNITS[match.group(2) or "s"]
    if seconds < 0:
        raise ValueError(f"duration must not be negative, got {value!r}")
    return seconds


def parse_size(value: str | int) -> int:
    """Return bytes for ``"8GiB"``, ``"512MB"``, ``"1024"`` or a plain integer."""
    if isinstance(value, bool):
        raise ValueError(f"expected a size, got {value!r}")
    if isinstance(value, int):
        size = value
    else:
        match = _SIZE_RE.match(value)
        if match is None:
            raise ValueError(
                f"invalid size {value!r}: use bytes or a number with a unit such as "
                "'512MiB', '8GiB', '4GB'"
            )
        size = int(float(match.group(1)) * _SIZE_UNITS[match.group(2) or ""])
    if size < 0:
        raise ValueError(f"size must not be negative, got {value!r}")
    return size
