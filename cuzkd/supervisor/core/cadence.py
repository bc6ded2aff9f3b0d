"""When an engine's health loop reads what, as a small state object fed ``now``.

The runner's health loop polls the engine's status, walks its process tree for descendants and
feeds the stall watch. Each has its own pace, chosen for cost; keeping those choices here, away
from the loop's awaits, lets them be tested with plain numbers. The decisions the polls lead to
(which failures are the start, start_timeout, unhealthy_after, restarts and their backoff)
belong to :class:`~cuzkd.supervisor.core.lifecycle.Lifecycle`.
"""

from __future__ import annotations

from dataclasses import dataclass

from cuzkd.states import State

#: Poll period while waiting for the first answer, so "running" is noticed quickly.
STARTING_POLL = 0.1
#: How long an engine without ``status_url`` must stay alive to count as running
#: (supervisord's ``startsecs`` default); bounded by its start_timeout.
PROCESS_SETTLE = 1.0
#: Seconds between two walks of an engine's process tree for its descendants: the walk reads
#: one file per engine thread (3 ms for 200 threads); the adopted children, read at every poll,
#: cost a fraction of a millisecond.
DESCENDANT_WALK = 10.0
#: The stall watch is fed at most this many documents per ``stall_after`` (and at most one per
#: health poll): decoding and walking a busy engine's 1 MB document at every 1 s poll only for
#: a decision on a scale of minutes would be most of the supervisor's CPU.
STALL_SAMPLES = 60


@dataclass
class HealthCadence:
    health_interval: float
    start_timeout: float
    #: the stall watch's limit (0: no stall watch)
    stall_after: float
    #: monotonic time of the next tree walk / stall sample (0: at the first chance)
    next_walk: float = 0.0
    next_stall_sample: float = 0.0

    def spawned(self) -> None:
        """A new process: walk its tree and sample it for the stall watch at the first poll."""
        self.next_walk = self.next_stall_sample = 0.0

    @property
    def settle_delay(self) -> float:
        """How long an engine without a status address must live to count as running."""
        return min(PROCESS_SETTLE, self.start_timeout)

    def poll_delay(self, state: State) -> float:
        """The pause before the next status poll: short until the first answer."""
        if state is State.STARTING:
            return min(STARTING_POLL, self.health_interval)
        return self.health_interval

    def walk_due(self, now: float) -> bool:
        """True when the process tree is to be walked now (and the next walk is scheduled)."""
        if now < self.next_walk:
            return False
        self.next_walk = now + DESCENDANT_WALK
        return True

    def stall_sample_due(self, now: float) -> bool:
        return self.stall_after > 0 and now >= self.next_stall_sample

    def stall_sampled(self, now: float) -> None:
        self.next_stall_sample = now + self.stall_after / STALL_SAMPLES
