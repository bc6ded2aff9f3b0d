"""When ``cuzkd upgrade`` may re-execute the supervisor, and why not.

The hand-over carries each engine at rest or running, never in the middle of a step the old
code was carrying out: a stop sequence (its drain, its timers), a spawn waiting at its gate, the
leftovers of an exited process being stopped, a swap or a reload. Refused at such a moment, the
upgrade changes nothing; the operator tries again once it is over.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from cuzkd.states import Phase, State


@dataclass(frozen=True)
class EngineMoment:
    """What an engine is doing, as far as an upgrade is concerned."""

    name: str
    state: State
    #: a spawn waits at its gate (leftovers, GPU memory): STARTING without a process
    spawn_waiting: bool = False
    #: leftovers of an exited process are being stopped
    sweeping: bool = False


def upgrade_refusal(phase: Phase, *, swapping: bool, engines: Iterable[EngineMoment]) -> str | None:
    """Why an upgrade may not begin now (None: it may)."""
    if phase is not Phase.RUNNING:
        return {Phase.STARTING: "the supervisor is still starting",
                Phase.RELOADING: "a config reload is under way",
                Phase.STOPPING: "the supervisor is stopping",
                Phase.UPGRADING: "an upgrade is already under way"}[phase]
    if swapping:
        return "a binary swap is under way"
    for engine in engines:
        if engine.state is State.STOPPING:
            return f"engine {engine.name} is stopping"
        if engine.spawn_waiting:
            return f"engine {engine.name} waits to spawn"
        if engine.sweeping:
            return f"leftovers of engine {engine.name} are being stopped"
    return None
