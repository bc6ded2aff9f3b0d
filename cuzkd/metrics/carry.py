"""Counters that continue across ``cuzkd upgrade``: the old code's exported counts, carried.

After the exec the new code's own counts start from zero, while some counts it exports never
restarted at all: the engines' own (``cuzk_*`` from a bundled engine's document), the door
process's, the process's CPU time. So the carry is decided per series, as Prometheus itself
reads a counter: a series whose new value is below what the old code exported was reset, and
from then on it is exported as the old value plus the new; one at or above it continued, and is
exported as it is. A histogram is decided whole, by its ``_count``.

When that is decided matters: the supervisor's own series are decided at the first scrape after
the upgrade, and those it does not show then (an exit cause that comes later) were reset (it
counted them from zero). The series the new code only shows once it has read their source --
the engines' documents and gRPC (``cuzk_*``), the door process's figures -- are decided when
they first appear. No series goes down. What is not carried: increments the new code counted
before the first scrape of a series it then shows above the old value (it reads as continued),
at most a poll's worth, for the figures cuzkd derives from a plain cuzk document.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from fnmatch import fnmatchcase

import msgspec
from prometheus_client.metrics_core import Metric
from prometheus_client.samples import Sample

#: The family types whose samples only grow.
CARRIED_TYPES = ("counter", "histogram")
#: Families whose series first appear once their source was read (see module doc): the
#: engines' (documents and gRPC), and the door process's figures (its own counts, which
#: continue) -- but not the door process's restarts and exits, which are the supervisor's.
_READ_LATER = ("cuzk_*", "cuzkd_door_*")
_SUPERVISORS = "cuzkd_door_process_*"

#: A series' key: its sample name (a histogram's family name) and its labels (less ``le``).
Key = tuple[str, tuple[tuple[str, str], ...]]


class CarriedSample(msgspec.Struct, frozen=True, forbid_unknown_fields=True, array_like=True):
    """One sample of a counter or histogram family as the old code exported it."""

    family: str
    name: str
    labels: dict[str, str]
    value: float


def read_later(family: str) -> bool:
    """Whether ``family``'s series appear only once their source was read."""
    return (any(fnmatchcase(family, pattern) for pattern in _READ_LATER)
            and not fnmatchcase(family, _SUPERVISORS))


def carried_samples(families: Iterable[Metric]) -> list[CarriedSample]:
    """The counter and histogram samples of ``families``, for the hand-over."""
    return [CarriedSample(family.name, s.name, dict(s.labels), float(s.value))
            for family in families if family.type in CARRIED_TYPES for s in family.samples]


class CounterCarry:
    """The old code's counts and, per series, whether they are added to the new code's."""

    def __init__(self, carried: Sequence[CarriedSample] = ()) -> None:
        #: sample name and labels -> the old code's value
        self._old: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
        #: series -> the family it is of
        self._families: dict[Key, str] = {}
        for s in carried:
            labels = tuple(sorted(s.labels.items()))
            self._old[(s.name, labels)] = s.value
            self._families[_key(s.family, s.name, s.labels)] = s.family
        #: series -> carried (True) or continued (False), once decided
        self._decided: dict[Key, bool] = {}
        #: the families with a series undecided or carried: a scrape looks at these alone
        #: (the rest, by far the most once decided, pass as they are)
        self._live = set(self._families.values())
        self._first_scrape = True

    def apply(self, families: Iterable[Metric]) -> Iterator[Metric]:
        """``families`` with the carried counts added (each family rebuilt for this scrape)."""
        if not self._old:
            yield from families
            return
        seen: set[Key] = set()
        decided = len(self._decided)
        for family in families:
            if family.type in CARRIED_TYPES and family.name in self._live:
                self._carry(family, seen)
            yield family
        if self._first_scrape:
            self._first_scrape = False
            for key, name in self._families.items():
                if key not in seen and not read_later(name):
                    self._decided.setdefault(key, True)
        if len(self._decided) != decided:
            self._live = {name for key, name in self._families.items()
                          if self._decided.get(key, True)}

    def _carry(self, family: Metric, seen: set[Key]) -> None:
        samples = family.samples
        for i, s in enumerate(samples):
            key = _key(family.name, s.name, s.labels)
            carried = self._decided.get(key)
            if carried is None:
                carried = self._decide(family, key, s)
                if carried is None:
                    continue
            seen.add(key)
            if carried:
                old = self._old.get((s.name, tuple(sorted(s.labels.items()))), 0.0)
                samples[i] = Sample(s.name, s.labels, s.value + old, s.timestamp, s.exemplar)

    def _decide(self, family: Metric, key: Key, sample: Sample) -> bool | None:
        """Carried or continued, decided by ``sample``'s value against the old one (a
        histogram's by its ``_count``; None: not the sample that decides)."""
        if key not in self._families:
            self._decided[key] = False  # a new series: nothing to carry
            return False
        if family.type == "histogram":
            count_name = family.name + "_count"
            count = next((s for s in family.samples if s.name == count_name
                          and _key(family.name, s.name, s.labels) == key), None)
            if count is None:
                return None
            sample = count
        old = self._old.get((sample.name, tuple(sorted(sample.labels.items()))), 0.0)
        carried = self._decided[key] = sample.value < old
        return carried


def _key(family: str, name: str, labels: dict[str, str]) -> Key:
    """A counter's series is its sample; a histogram's, its family and labels less ``le``."""
    if name != family and not name.endswith("_total"):  # _bucket, _sum, _count
        return family, tuple(sorted((k, v) for k, v in labels.items() if k != "le"))
    return name, tuple(sorted(labels.items()))
