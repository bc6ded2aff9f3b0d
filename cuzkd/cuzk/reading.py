"""What one ``GetStatus`` of a cuzk said, as plain values (no grpc here): the pure drain
(:mod:`cuzkd.supervisor.core.drain`) decides on it; :mod:`cuzkd.cuzk.client` reads it."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field


@dataclass(frozen=True)
class KindQueue:
    """One proof kind in the engine's scheduler: queued, and dispatched but not finished."""

    pending: int
    in_progress: int

    @property
    def jobs(self) -> int:
        return self.pending + self.in_progress


@dataclass(frozen=True)
class QueueReading:
    """One ``GetStatus`` answer, reduced to what a stop needs; ``error`` set: unknown."""

    #: kind label (``porep-c2``, ..., ``other``) -> its queue
    queues: Mapping[str, KindQueue] = field(default_factory=dict)
    #: job ids the GPUs are proving now (PoSt included, unlike /status's workers)
    current_jobs: tuple[str, ...] = ()
    total_completed: int = 0
    total_failed: int = 0
    #: why nothing is known ("" when the engine answered)
    error: str = ""

    @property
    def known(self) -> bool:
        return not self.error

    @property
    def holds_work(self) -> bool:
        """Some job queued or in progress, or nothing known (which must not end a drain)."""
        return not self.known or any(q.jobs for q in self.queues.values())

    @classmethod
    def unknown(cls, error: str) -> QueueReading:
        return cls(error=error)
