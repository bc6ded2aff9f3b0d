"""Label budgets: how many distinct values one engine may give each label of its series.

Label values such as proof kinds, worker ids, GPU ordinals and circuit ids are the engine's own
words, and a broken or hostile engine naming 100,000 kinds once broke the host's whole scrape.
Every per-value series and every per-value state the supervisor keeps for an engine therefore
passes its budget for the label: the first values seen keep their slot while the engine's process
lives, later ones are refused, counted and logged. :class:`LabelBudget` is the pure rule for one
label; :class:`LabelBudgets` is one engine's set, with the counting and the log line: exporters
use :meth:`LabelBudgets.keep`, state kept between documents asks :meth:`LabelBudgets.budget`'s
``admits``, and :func:`attribute_value` shortens ``_info`` values instead. See docs/metrics.md,
*Label budgets*.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from typing import TypeVar

import structlog

from cuzkd.log.ratelimit import LimitedLog

T = TypeVar("T")

#: The labels with a budget (the ``label`` values of ``cuzkd_label_values_dropped_total``) and
#: their default limits. A real host has at most 16 GPUs with a few workers each and cuzk's 4
#: proof kinds (8 while the old and new names coexist), a dozen circuits: each default leaves
#: room for several times that, and one engine at its limits still exports a few thousand series
#: (32 kinds x ~85 series, 256 workers x 3, 64 GPUs x 4, 64 circuits x 2).
DEFAULT_LIMITS: Mapping[str, int] = {"proof_kind": 32, "worker": 256, "gpu": 64, "circuit": 64}
#: A label value longer than this is refused whatever the room: one 1 MB proof kind would be
#: repeated on ~85 lines of every scrape.
MAX_VALUE_LENGTH = 128
#: How many characters of a refused value its log line quotes.
_QUOTED = 64

_log = structlog.get_logger("cuzkd.metrics")


def attribute_value(value: str) -> str:
    """An ``_info`` label's value (a GPU's name, a backend) cut to :data:`MAX_VALUE_LENGTH`:
    it names no series (the series is its engine's or GPU's), so shortening it can make no
    two series one, and a megabyte name costs a line of 128 characters."""
    return value[:MAX_VALUE_LENGTH]


class LabelBudget:
    """The values one label of one engine may take: the first ``limit`` distinct ones."""

    __slots__ = ("_admitted", "limit")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._admitted: set[str] = set()

    def admits(self, value: str) -> bool:
        """True for a value admitted now or before; False once the budget is full, or for a
        value longer than :data:`MAX_VALUE_LENGTH`."""
        if len(value) > MAX_VALUE_LENGTH:
            return False
        if value in self._admitted:
            return True
        if len(self._admitted) >= self.limit:
            return False
        self._admitted.add(value)
        return True

    def clear(self) -> None:
        self._admitted.clear()


class LabelBudgets:
    """One engine's budgets, one per label of :data:`DEFAULT_LIMITS`, and what they dropped.

    ``limits`` overrides some defaults (the engine's config).
    """

    def __init__(self, engine: str, limits: Mapping[str, int] | None = None) -> None:
        self.engine = engine
        merged = {**DEFAULT_LIMITS, **(limits or {})}
        self._budgets = {label: LabelBudget(limit) for label, limit in merged.items()}
        #: label -> values left out of scrapes (one per value per scrape that left it out)
        self.dropped_total: Counter[str] = Counter()
        self._limited = LimitedLog()

    def budget(self, label: str) -> LabelBudget:
        """The budget of ``label`` (one of :data:`DEFAULT_LIMITS`), for state kept between
        documents (the deriver's): its ``admits`` counts nothing, since what it refuses is
        counted when its series are left out."""
        return self._budgets[label]

    def keep(self, label: str, items: Iterable[T], value: Callable[[T], str]) -> list[T]:
        """The items whose ``value`` the budget of ``label`` admits, in order; the others are
        counted as dropped and logged (rate-limited)."""
        budget = self._budgets[label]
        kept: list[T] = []
        dropped, first = 0, ""
        for item in items:
            v = value(item)
            if budget.admits(v):
                kept.append(item)
                continue
            if not dropped:
                first = v
            dropped += 1
        if dropped:
            self.dropped_total[label] += dropped
            self._limited.log(_log, "warning", "label_values_dropped", key=label,
                              engine=self.engine, label=label, limit=budget.limit,
                              dropped=dropped, first_dropped=first[:_QUOTED])
        return kept

    def clear(self) -> None:
        """Free every slot (a new process of the engine starts); the drop counts stay."""
        for budget in self._budgets.values():
            budget.clear()
