"""One spawned process of an engine and what the supervisor did to it.

A record per spawn, so nothing known of one process (was it SIGKILLed by the supervisor,
signalled to stop, admitted by its door seat, drained clean) can leak into the next: the runner
drops it when the process exits, and the stop sequence still holding it sees it exited.
"""

from __future__ import annotations

import asyncio
import signal
from dataclasses import dataclass, field

from cuzkd.supervisor.proc.children import ChildProcess
from cuzkd.supervisor.proc.oom import OomCounters


@dataclass
class SpawnRecord:
    """One engine process as the supervisor spawned it (the reaper's `ChildProcess`) and what
    it has done to it since."""

    child: ChildProcess
    #: unix time of its spawn
    started_at: float
    #: the OOM-kill counters covering it, read when it exits
    oom: OomCounters
    #: set once the reaper collected it
    exited: asyncio.Event = field(default_factory=asyncio.Event)
    #: the supervisor sent it SIGKILL (never an OOM kill then)
    killed: bool = False
    #: the stop signal went to its group (its survivors may finish)
    stop_signalled: bool = False
    #: its seat was told it takes calls (at its first answer)
    admitted: bool = False
    #: its stop drained it through the door: nothing was in flight
    drained_clean: bool = False
    #: the tasks watching it while it lives (its health loop, its telemetry)
    watchers: list[asyncio.Task[None]] = field(default_factory=list)

    @property
    def pid(self) -> int:
        return self.child.pid

    def kill(self) -> None:
        """SIGKILL the group, remembering it so the death is not blamed on the OOM killer."""
        self.killed = True
        self.child.signal_group(signal.SIGKILL)

    def signal_stop(self, signum: int) -> None:
        """Send the engine's stop signal to the group."""
        self.stop_signalled = True
        self.child.signal_group(signum)

    def ended(self) -> None:
        """The reaper collected it: stop watching it, wake whoever waits for its exit."""
        self.exited.set()
        for task in self.watchers:
            task.cancel()
