"""The release history on disk: ``<state_dir>/history.json``, replaced whole and durably.

A verdict that a power cut could undo would let a rollback pick a release already known to
crash, so a new history is written to a temporary file, fsynced, renamed over the old one and
the directory fsynced (:data:`SAVE_STEPS`): readers and the next start see the old history or
the new one, never a mix. Temporary names are the store's (``.tmp-*``), so recovery removes
what an interrupted save left.

The file is read without following a symlink and without blocking on a FIFO, and a file that
is not a history (damaged by hand, by a failing disk, or from a newer cuzkd) is reported as
:class:`~cuzkd.errors.HistoryError` naming the file and the problem.
"""

from __future__ import annotations

import errno
import os
import stat
import time
from collections.abc import Generator, Sequence
from pathlib import Path

from cuzkd.errors import HistoryError
from cuzkd.swap import history
from cuzkd.swap.fsutil import replace_durably, temp_path
from cuzkd.swap.history import Record

SAVE_STEPS = ("history_written", "history_replaced")

#: Far above MAX_RECORDS records with long reasons; a larger file is not ours.
MAX_BYTES = 4 << 20


class HistoryFile:
    """One history file; the records are cached after the first read (one writer: the store)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._records: list[Record] | None = None

    def records(self) -> list[Record]:
        """The records, oldest first; an absent file is an empty history."""
        if self._records is None:
            self._records = self._read()
        return list(self._records)

    def save(self, records: Sequence[Record]) -> None:
        """Replace the file with ``records``, durably (all of :data:`SAVE_STEPS`)."""
        for _ in self.save_steps(records):
            pass

    def save_steps(self, records: Sequence[Record]) -> Generator[str, None, None]:
        """:meth:`save`, yielding each step of :data:`SAVE_STEPS`."""
        data = history.encode(records)
        temp = temp_path(self.path.parent)
        fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                     0o644)
        try:
            with open(fd, "wb") as out:
                out.write(data)
                out.flush()
                os.fsync(out.fileno())
            yield "history_written"
            replace_durably(temp, self.path)
        except BaseException:
            temp.unlink(missing_ok=True)
            raise
        self._records = list(records)
        yield "history_replaced"

    def set_aside(self) -> Path:
        """Rename an unreadable file out of the way (kept for the operator); its new path."""
        aside = self.path.with_name(f"{self.path.name}.unreadable-{time.time_ns()}")
        replace_durably(self.path, aside)
        self._records = None
        return aside

    def _read(self) -> list[Record]:
        flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
        try:
            fd = os.open(self.path, flags)
        except FileNotFoundError:
            return []
        except OSError as exc:
            problem = "is a symlink" if exc.errno == errno.ELOOP else exc.strerror
            raise HistoryError(f"release history {self.path}: {problem}") from None
        with open(fd, "rb") as src:
            st = os.fstat(src.fileno())
            if not stat.S_ISREG(st.st_mode):
                raise HistoryError(f"release history {self.path}: not a regular file")
            data = src.read(MAX_BYTES + 1)
        if len(data) > MAX_BYTES:
            raise HistoryError(f"release history {self.path}: larger than {MAX_BYTES} bytes")
        try:
            return history.decode(data)
        except HistoryError as exc:
            raise HistoryError(f"release history {self.path}: {exc}") from None
