"""Who waits for the next bcrypt round: a bounded queue shared fairly between sources.

Until a password is verified a right one costs a bcrypt round like a wrong one, and the rounds
run one at a time; a single bounded FIFO let a flood of wrong passwords hold every place, so
after a restart Prometheus' right password was refused for as long as the flood lasted.
:class:`FairQueue` gives each source, a client address (:func:`cuzkd.supervisor.web.access.
source_of`), a FIFO of its own within a shared bound and serves them by start-time fair
queueing. A flood from one address or a few cannot keep a new one out; one from more addresses
than ``capacity`` still can while it lasts. The queue is pure, with no event loop or clock:
:class:`~cuzkd.supervisor.web.basicauth.BasicAuth` puts its checks in and takes them out. See
docs/supervisor.md, *TLS and basic auth (`[metrics] web_config`)*.
"""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Generic, TypeVar

T = TypeVar("T")

#: Tags of sources with nothing waiting kept, per place. Forgetting one gives that source at
#: most one turn early; keeping every one would let a flood from ever new addresses, each served
#: at once with the virtual time standing still, grow memory without bound.
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
        """Give ``item`` of ``source`` a place if it may have one.

        A source holds at most ``per_source`` places, so the rest of a one-address flood is
        refused without a round. When all ``capacity`` places are taken, a source holding fewer
        than the longest queue's length less one takes that queue's newest place, which waited
        least; a new source is refused only when every place belongs to a different source.
        """
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
        """The next item to serve, None when none waits.

        Each item is tagged with the round it may start in: its source's previous tag plus one,
        never earlier than the tag taken last (the virtual time). The lowest tag goes first,
        ties by arrival, so busy sources are served in turn and a source that had nothing
        waiting goes before a busy one's next item: a right password in a one-address flood
        waits for the round running, never for the flood's queued ones. A source's tag outlives
        its queue only while it is ahead of the virtual time.
        """
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
