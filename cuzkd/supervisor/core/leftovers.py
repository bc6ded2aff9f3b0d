"""What is done with an engine's leftovers when its main process exits.

Leftover helpers of a dead engine would hold GPU memory (or its port) from its replacement, so
they are stopped; but a wrapper shell that does not exec dies of the stop signal at once while
the engine under it still shuts down, and a SIGKILL then would throw away the work it is
finishing. Pure: the facts of the exit in, the decision out; the stopping is the descendant
watch's (:mod:`cuzkd.supervisor.proc.descendants`).
"""

from __future__ import annotations

import enum


class LeftoverStop(enum.Enum):
    """How the exited process's group and leftovers are stopped."""

    #: the stop signal reached the whole group: what is left gets stop_timeout to finish (no
    #: second signal), then SIGKILL
    FINISH = "finish"
    #: SIGKILL the group at once; leftovers that escaped it get the stop signal and
    #: stop_timeout
    KILL_GROUP = "kill_group"


def leftover_stop(*, stop_signalled: bool, supervisor_killed: bool,
                  leftovers: bool) -> LeftoverStop:
    """The stop of what a main process left when it exited. ``stop_signalled``: the supervisor
    sent the stop signal to its group; ``supervisor_killed``: it sent SIGKILL (nothing is left
    to finish); ``leftovers``: some of its descendants outlived it."""
    if stop_signalled and not supervisor_killed and leftovers:
        return LeftoverStop.FINISH
    return LeftoverStop.KILL_GROUP
