"""The last lines of a process's stderr, with the head of its first panic kept in its place.

A Rust panic (cuzk's exit 101) writes ``thread 'main' panicked at src/main.rs:12:5:``, its
message (one line or more), ``note: run with `RUST_BACKTRACE=1` ...`` -- and with
``RUST_BACKTRACE`` set, ``stack backtrace:`` and dozens of frame lines. Kept as the last N lines
only, a backtrace pushes out the very lines that say what happened. So the panic's head -- its
first line and the message lines after it, up to ``note:`` or ``stack backtrace:``, at most
:data:`PANIC_HEAD_LINES` -- stays; the lines after it are the last that fit, then those before
it. Pure: lines in, lines out.
"""

from __future__ import annotations

import re
from collections import deque
from collections.abc import Iterator

#: Most lines of a panic's head kept (its first line and message).
PANIC_HEAD_LINES = 8
#: The first line of a Rust panic (``thread 'main' panicked at src/main.rs:12:5:``; before Rust
#: 1.73, ``thread 'main' panicked at 'message', src/main.rs:12:5``).
_PANIC = re.compile(r"thread '[^']*' panicked at ")
#: What a panic's first line holds, to look for it in bytes before splitting them into lines.
PANIC_MARK = b"' panicked at "
#: Where a panic's message ends.
_HEAD_END = ("note: ", "stack backtrace:")


class StderrLines:
    """At most ``maxlen`` lines, in order; iterate for them."""

    def __init__(self, maxlen: int) -> None:
        self.maxlen = maxlen
        #: the lines before the first panic (all of them, while there is none)
        self._before: deque[str] = deque(maxlen=maxlen)
        #: the first panic's head, and whether lines still join it
        self._head: list[str] = []
        self._in_head = False
        #: the lines after the head
        self._after: deque[str] = deque(maxlen=maxlen)

    @property
    def has_panic(self) -> bool:
        """Whether a panic's head is kept (later panics are lines like any other)."""
        return bool(self._head)

    def append(self, line: str) -> None:
        if not self._head and _PANIC.match(line):
            self._head.append(line)
            self._in_head = True
        elif self._in_head and len(self._head) < PANIC_HEAD_LINES and not line.startswith(
                _HEAD_END):
            self._head.append(line)
        elif self._head:
            self._in_head = False
            self._after.append(line)
        else:
            self._before.append(line)

    def __iter__(self) -> Iterator[str]:
        head = self._head[:self.maxlen]
        after = _last(self._after, self.maxlen - len(head))
        before = _last(self._before, self.maxlen - len(head) - len(after))
        return iter([*before, *head, *after])


def _last(lines: deque[str], count: int) -> list[str]:
    """The last ``count`` of ``lines`` (all of them when there are fewer)."""
    return list(lines)[-count:] if count > 0 else []
