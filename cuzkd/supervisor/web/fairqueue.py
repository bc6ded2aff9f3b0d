"""Who waits for the next bcrypt round: a bounded queue shared fairly between sources.

Before cuzkd has verified a password it cannot tell a right one from a wrong one: both cost a
bcrypt round, and the rounds run one at a time. A single bounded FIFO let a flood of wrong
passwords hold every place, so after a restart (nothing verified yet) Prometheus' right
password was refused with all the others for as long as the flood lasted. Here each source (a
client address: see :func:`cuzkd.supervisor.web.access.source_of`) has a FIFO of its own:

* a source may hold at most ``per_source`` places: a flood from one address gets that many and
  the rest of its requests are refused at once, without a round;
* when all ``capacity`` places are taken, a source holding fewer than the longest queue's
  length less one takes a place from that queue (its newest request, which waited least, is
  refused): a new source is refused only when every place belongs to a different source;
* :meth:`FairQueue.take` serves the sources by start-time fair queueing: each item is tagged
  with the round it may start in -- its source's previous item's tag plus one, but never
  earlier than the tag of the item taken last (the system's virtual time) -- and the lowest tag
  goes first (ties: the one that came first). Sources that stay busy are served in turn; a
  source that had nothing waiting starts at the current tag, so it goes before a busy source's
  next item: a right password arriving in a flood from one address waits for the round running
  and then has its own, never for the flood's queued ones.

A source's tag outlives its queue only while it is ahead of the virtual time (it was served
recently: a newcomer's start would be earlier), and at most :data:`REMEMBERED` per place are
kept: forgetting one gives that source at most one turn early, while keeping every one would let
a flood from ever new addresses (each served at once, the virtual time standing still) grow
memory without bound.

A source that floods from many addresses (more than ``capacity``) can still keep a new one out
while it lasts; one address, or a few, cannot. The queue is pure (no event loop, no clock):
:class:`~cuzkd.supervisor.web.basicauth.BasicAuth` puts its checks in it and takes them out.
"""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Generic, TypeVar

T = TypeVar("T")

#: Tags of sources with nothing waiting kept, per place (see the module).
REMEMBERED = 4


@dataclass(frozen=True)
class Admission(Generic[T]):
    """What :meth:`FairQueue.admit` did: whether the item got a place, and the item it took
    the place from (refused: its owner must be told), if any."""

    admitted: bool
    evicted: T | None = None


@dataclass(frozen=True, eq=False)
class _Entry(Generic[T]):
    tag: int
    order: int
    item: T


class FairQueue(Generic[T]):
    """Items waiting per source, at most ``capacity`` in all and ``per_source`` per source."""

    def __init__(self, capacity: int, per_source: int) -> None:
        if not 1 <= per_source <= capacity:
            raise ValueError(f"need 1 <= per_source ({per_source}) <= capacity ({capacity})")
        self.capacity = capacity
        self.per_source = per_source
        #: source -> its entries, oldest first (only sources with some waiting)
        self._queues: dict[Hashable, deque[_Entry[T]]] = {}
        #: source -> the tag after its newest entry's (only while above the virtual time)
        self._next_tag: dict[Hashable, int] = {}
        #: the tag of the entry taken last
        self._now = 0
        self._order = itertools.count()
        self._len = 0

    def __len__(self) -> int:
        return self._len

    @property
    def remembered(self) -> int:
        """Sources whose next tag is kept (those waiting, and some served recently)."""
        return len(self._next_tag)

    def waiting(self, source: Hashable) -> int:
        """How many of ``source``'s items wait."""
        queue = self._queues.get(source)
        return len(queue) if queue is not None else 0

    def admit(self, source: Hashable, item: T) -> Admission[T]:
        """Give ``item`` of ``source`` a place if it may have one (see the module)."""
        own = self.waiting(source)
        if own >= self.per_source:
            return Admission(False)
        evicted: T | None = None
        if self._len >= self.capacity:
            longest = max(self._queues, key=lambda s: len(self._queues[s]))
            if len(self._queues[longest]) <= own + 1:
                return Admission(False)  # as fair as it gets: every place is someone's share
            evicted = self._remove(longest, self._queues[longest][-1])
        tag = max(self._now, self._next_tag.get(source, 0))
        if source not in self._next_tag and len(self._next_tag) >= REMEMBERED * self.capacity:
            self._forget(lambda s: s not in self._queues)
        self._next_tag[source] = tag + 1
        self._queues.setdefault(source, deque()).append(_Entry(tag, next(self._order), item))
        self._len += 1
        return Admission(True, evicted)

    def take(self) -> T | None:
        """The next item to serve: the lowest tag's (see the module); None when none waits."""
        if not self._queues:
            return None
        source = min(self._queues, key=lambda s: (self._queues[s][0].tag,
                                                  self._queues[s][0].order))
        queue = self._queues[source]
        entry = queue.popleft()
        self._len -= 1
        if not queue:
            del self._queues[source]
        self._now = entry.tag
        # no advance left over a newcomer: nothing to remember
        self._forget(lambda s: self._next_tag[s] <= self._now and s not in self._queues)
        return entry.item

    def discard(self, source: Hashable, item: T) -> bool:
        """Remove ``item`` (its owner stopped waiting); False when it no longer waits."""
        for entry in self._queues.get(source, ()):
            if entry.item is item:
                self._remove(source, entry)
                return True
        return False

    def _forget(self, idle: Callable[[Hashable], bool]) -> None:
        for source in [s for s in self._next_tag if idle(s)]:
            del self._next_tag[source]

    def _remove(self, source: Hashable, entry: _Entry[T]) -> T:
        """Take ``entry`` out of ``source``'s queue; the newest gives its tag back."""
        queue = self._queues[source]
        newest = queue[-1] is entry
        queue.remove(entry)
        self._len -= 1
        if newest:
            self._next_tag[source] = entry.tag
        if not queue:
            del self._queues[source]
        return entry.item
