"""A swap's wait for one engine process to be healthy, as a pure state object fed ``now``.

The rule (:meth:`~cuzkd.supervisor.engines.engineset.EngineSet.wait_healthy`
 runs it): the process that
runs when the wait begins must answer its status within ``start_timeout`` (the lifecycle leaves
``starting``) and then stay ``running`` for ``settle`` seconds. A different pid, or any other
state, ends the wait with the reason. Deciding from values keeps every branch testable without
processes or clocks; the engine set only feeds observations and sleeps until :attr:`deadline`.
"""

from __future__ import annotations

from dataclasses import dataclass

from cuzkd.states import State


@dataclass(frozen=True)
class Observation:
    """The engine as the runner shows it at one moment."""

    now: float
    pid: int | None
    state: State
    last_error: str | None
    #: why it is not up, in words (``engine is backoff (last exit: exit_1)``)
    not_up: str


@dataclass
class HealthWait:
    pid: int
    start_timeout: float
    settle: float
    started: float
    #: when the status first answered (the settle period's start)
    answered_at: float | None = None
    #: set once the wait is over: None (healthy) or why not
    outcome: str | None = None
    done: bool = False

    @property
    def deadline(self) -> float:
        """When the wait ends by itself if nothing changes before."""
        if self.answered_at is None:
            return self.started + self.start_timeout
        return self.answered_at + self.settle

    def observe(self, seen: Observation) -> bool:
        """Take in what the engine shows now; True once the wait is over (see :attr:`outcome`)."""
        if self.done:
            return True
        gone = seen.pid != self.pid
        if self.answered_at is None:
            if not gone and seen.state is State.STARTING:
                if seen.now >= self.deadline:
                    why = f" (last error: {seen.last_error})" if seen.last_error else ""
                    return self._end(f"status did not answer within start_timeout "
                                     f"({self.start_timeout:g}s){why}")
                return False
            if gone or seen.state is not State.RUNNING:
                return self._end(f"process {self.pid} ended before its status answered: "
                                 f"{seen.not_up}")
            self.answered_at = seen.now
        if gone or seen.state is not State.RUNNING:
            return self._end(f"process {self.pid} did not stay up for the {self.settle:g}s "
                             f"settle period: {seen.not_up}")
        if seen.now >= self.deadline:
            return self._end(None)
        return False

    def _end(self, outcome: str | None) -> bool:
        self.outcome, self.done = outcome, True
        return True
