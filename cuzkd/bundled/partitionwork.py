"""What the per-partition stages of the bundled engine (synthesis, finalizing) all work with.

One record instead of the same six arguments to each stage, so a stage's constructor says
only what is its own (its thread pool, its settings).
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any

from cuzkd.bundled.budget import MemoryBudget
from cuzkd.bundled.jobbook import JobBook
from cuzkd.status.tracker import StatusTracker


@dataclass(frozen=True)
class PartitionWork:
    """The engine's tracker, memory budget and job book; its clock; ``publish`` (a new status
    document); ``spawn`` (runs a partition's task, owned by the engine)."""

    tracker: StatusTracker
    budget: MemoryBudget
    book: JobBook
    clock: Callable[[], float]
    publish: Callable[[], None]
    spawn: Callable[[Coroutine[Any, Any, None]], None]
