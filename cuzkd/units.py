"""Parsing of human-written durations, sizes and listen addresses.

Config files are written by operators, so both ``"250ms"`` and ``0.25`` must mean a quarter
second, and ``"8GiB"`` must mean 8 × 2**30 bytes. Every parser raises ``ValueError`` with a
message that quotes the bad value; the config loader adds the key and the file. The supervisor
config, the engine config and the APIs all parse through here, so they accept and refuse the
same things.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

#: Longest duration accepted anywhere: a year. Longer is a typo ("30000000s"), and timers
#: fed with it (or with TOML's inf/nan) overflow or never fire.
MAX_DURATION = 365 * 24 * 3600.0

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
    if not math.isfinite(seconds):  # TOML and JSON numbers include inf and nan
        raise ValueError(f"expected a finite duration, got {value!r}")
    if seconds < 0:
        raise ValueError(f"duration must not be negative, got {value!r}")
    if seconds > MAX_DURATION:
        raise ValueError(f"duration {value!r} is longer than 365 days")
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


@dataclass(frozen=True)
class ListenAddress:
    """A parsed ``HOST:PORT`` (``[::1]:9822`` for IPv6) or ``unix:PATH``."""

    host: str = ""
    port: int = 0
    #: the socket path of a ``unix:`` address, else ""
    path: str = ""

    @property
    def is_unix(self) -> bool:
        return bool(self.path)


def parse_listen(value: str, *, allow_unix: bool = True) -> ListenAddress:
    """``"127.0.0.1:9822"`` / ``"[::1]:9822"`` / ``"unix:/run/x.sock"``; ValueError otherwise."""
    if value.startswith("unix:"):
        path = value.removeprefix("unix:")
        if not allow_unix:
            raise ValueError(f"{value!r} is not HOST:PORT (a Unix socket is not allowed here)")
        if not path:
            raise ValueError("'unix:' needs a socket path ('unix:/run/x.sock')")
        if "\0" in path:
            raise ValueError(f"{value!r}: a socket path must not contain NUL")
        return ListenAddress(path=path)
    host, sep, port = value.rpartition(":")
    host = host.removeprefix("[").removesuffix("]")
    # isascii: str.isdigit() and int() also take other scripts' digits ("٩٨٢١")
    if not sep or not host or not (port.isascii() and port.isdigit()) or int(port) > 65535:
        expected = "HOST:PORT or unix:PATH" if allow_unix else "HOST:PORT"
        raise ValueError(f"{value!r} is not {expected}")
    return ListenAddress(host=host, port=int(port))


def format_duration(seconds: float) -> str:
    """A duration the way people read it: ``"45s"``, ``"59m"``, ``"1h02m"``, ``"3d4h"``.

    Two units at most, the larger first, truncated (never rounded up: a 59 min 59 s uptime is
    ``"59m"``, not ``"1h00m"``); negative durations (clock steps) read as ``"0s"``.
    """
    secs = max(0, int(seconds))
    if secs < 60:
        return f"{secs}s"
    if secs < 3600:
        return f"{secs // 60}m"
    if secs < 86400:
        return f"{secs // 3600}h{secs % 3600 // 60:02d}m"
    return f"{secs // 86400}d{secs % 86400 // 3600}h"


def format_bytes(size: int) -> str:
    """Binary units with one decimal: ``"512 B"``, ``"18.0 MiB"``, ``"2.0 GiB"``."""
    if size < 1024:
        return f"{size} B"
    value = size / 1024
    for unit in ("KiB", "MiB", "GiB"):
        if value < 1024:
            return f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} TiB"
