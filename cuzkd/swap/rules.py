"""Pure decisions of the release store: names on disk, what counts as a binary, what to prune.

Kept apart from :mod:`cuzkd.swap.releases` so the rules can be read and tested without touching
a filesystem, and so recovery, installation and pruning cannot disagree about them.
"""

from __future__ import annotations

import re
import stat
from collections.abc import Sequence, Set

RELEASES_DIR = "releases"
CURRENT_LINK = "current"
PREVIOUS_LINK = "previous"
#: verdicts on each release put into service (see cuzkd.swap.history)
HISTORY_FILE = "history.json"
# Every temporary name the store creates starts with this, in ``state_dir`` (symlinks being
# flipped) and in ``releases/`` (directories being filled or deleted); recovery removes exactly
# these and nothing else, so operators' own files next to the store are never touched.
TEMP_PREFIX = ".tmp-"
# 64 bits of the sha256: collisions between a machine's handful of releases are out of reach,
# and the id stays short enough to read in logs and ``ls``.
ID_HEX_CHARS = 16

_ID_RE = re.compile(rf"[0-9a-f]{{{ID_HEX_CHARS}}}")
_EXEC_BITS = stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH


def release_id(sha256_hex: str) -> str:
    """The release id for content whose sha256 hex digest is ``sha256_hex``."""
    return sha256_hex[:ID_HEX_CHARS]


def is_release_id(name: str) -> bool:
    return _ID_RE.fullmatch(name) is not None


def is_temp_name(name: str) -> bool:
    return name.startswith(TEMP_PREFIX)


def link_target(rid: str) -> str:
    """What ``current``/``previous`` point at: relative, so the state directory can be moved."""
    return f"{RELEASES_DIR}/{rid}"


def parse_link_target(target: str) -> str | None:
    """The release id a ``current``/``previous`` target names, or None if it names none.

    Only the exact form written by :func:`link_target` is accepted: a link edited by hand to
    point elsewhere must not make the store adopt (or later delete) an arbitrary directory.
    """
    prefix = f"{RELEASES_DIR}/"
    if not target.startswith(prefix):
        return None
    rid = target[len(prefix):]
    return rid if is_release_id(rid) else None


def binary_problem(st_mode: int, st_size: int) -> str | None:
    """Why a file with this mode and size cannot be an engine binary, or None if it can.

    Applied both to a source before it is copied and to an installed release when it is read
    back, so a release that was tampered with after installation is treated as missing.
    """
    if stat.S_ISLNK(st_mode):
        return "is a symlink; give the path of the binary itself"
    if stat.S_ISDIR(st_mode):
        return "is a directory, not an engine binary"
    if not stat.S_ISREG(st_mode):
        return "is not a regular file"
    if st_size == 0:
        return "is empty"
    if st_mode & _EXEC_BITS == 0:
        return "is not executable (no x permission bit set)"
    return None


def select_prunable(newest_first: Sequence[str], keep: int, protected: Set[str]) -> list[str]:
    """Ids to delete: everything beyond the ``keep`` newest, except the protected ones.

    Protected releases (active, previous, executing) never count against ``keep``'s budget of
    older releases being removed: they are simply skipped, so a long-running process pins its
    release without pushing a newer one out.
    """
    if keep < 0:
        raise ValueError(f"keep must be >= 0, got {keep}")
    return [rid for rid in newest_first[keep:] if rid not in protected]
