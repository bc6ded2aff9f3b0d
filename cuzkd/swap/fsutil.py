"""Durable filesystem primitives for the release store.

A rename is atomic for readers but is only durable once the directory holding it is fsynced;
without that, a power cut can bring back the old name after the supervisor already acted on the
new one. Every helper here fsyncs what it changed before returning.
"""

from __future__ import annotations

import os
import secrets
import shutil
import stat
from pathlib import Path

from cuzkd.swap.rules import TEMP_PREFIX


def fsync_dir(path: Path) -> None:
    """Make the entries of directory ``path`` (creations, renames, removals) durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def temp_path(directory: Path) -> Path:
    """A fresh name in ``directory`` that recovery recognises as temporary."""
    return directory / f"{TEMP_PREFIX}{secrets.token_hex(8)}"


def make_temp_symlink(directory: Path, target: str) -> Path:
    """Create a symlink to ``target`` under a temporary name in ``directory``."""
    link = temp_path(directory)
    link.symlink_to(target)
    return link


def replace_durably(src: Path, dest: Path) -> None:
    """rename(2) ``src`` over ``dest`` (atomic: readers see the old or the new, never neither)."""
    src.replace(dest)
    fsync_dir(dest.parent)


def remove_entry(path: Path) -> None:
    """Remove a file, symlink or whole directory tree at ``path`` without following symlinks."""
    if stat.S_ISDIR(os.lstat(path).st_mode):
        shutil.rmtree(path)
    else:
        path.unlink()
