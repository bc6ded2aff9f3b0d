"""The vocabulary of :mod:`cuzkd.states` is what the supervisor's decisions produce.

Each word is defined once there; these tests hold the behaviour that depends on it: the exit
cause the lifecycle counts for each of the supervisor's stop reasons is the table's, the
supervisor's causes are the ones the runner treats as its doing (and no cause a process dies
of by itself), and the named groups of states cover what the runner's start waits on.
"""

from __future__ import annotations

import signal
from collections.abc import Callable

import pytest

from cuzkd.states import (
    ALIVE,
    AT_REST,
    START_PENDING,
    START_SETTLED,
    STOP_EXIT_CAUSES,
    SUPERVISOR_CAUSES,
    ExitCause,
    State,
    StopReason,
)
from cuzkd.supervisor.core.backoff import Backoff
from cuzkd.supervisor.core.exitcause import ProcessEnd, process_cause
from cuzkd.supervisor.core.lifecycle import Lifecycle, Policy


def running_engine() -> Lifecycle:
    """An engine whose process answered its first status poll at t=1."""
    machine = Lifecycle(Policy(restart="always", start_timeout=10.0, unhealthy_after=5.0),
                        Backoff(initial=1.0, maximum=8.0, multiplier=2.0, reset_after=60.0,
                                rand=lambda: 0.0))
    machine.start_requested(0.0)
    machine.spawned(100, 0.0)
    machine.poll(1.0, ok=True)
    return machine


def _stop(machine: Lifecycle) -> None:
    machine.stop_requested(2.0)


def _reload(machine: Lifecycle) -> None:
    machine.stop_requested(2.0, StopReason.RELOAD)


def _shutdown(machine: Lifecycle) -> None:
    machine.stop_requested(2.0, StopReason.SHUTDOWN, within=30.0)


def _restart(machine: Lifecycle) -> None:
    machine.restart_requested(2.0)


def _swap(machine: Lifecycle) -> None:
    machine.restart_requested(2.0, swap=True)


def _unhealthy(machine: Lifecycle) -> None:
    machine.poll(7.0, ok=False, error="connection refused")  # silent for unhealthy_after


def _stalled(machine: Lifecycle) -> None:
    machine.stalled(2.0)


def _start_timeout(machine: Lifecycle) -> None:
    machine.spawned(101, 2.0)  # a fresh process that never answers
    machine.poll(13.0, ok=False)


#: One way to stop a running engine for each of the supervisor's reasons (an operator's stop
#: and restart both).
STOPPED_BY: list[tuple[StopReason, Callable[[Lifecycle], None]]] = [
    (StopReason.OPERATOR, _stop),
    (StopReason.OPERATOR, _restart),
    (StopReason.RELOAD, _reload),
    (StopReason.SHUTDOWN, _shutdown),
    (StopReason.SWAP, _swap),
    (StopReason.UNHEALTHY, _unhealthy),
    (StopReason.STALL, _stalled),
    (StopReason.START_TIMEOUT, _start_timeout),
]


def test_every_stop_reason_has_a_way_to_it() -> None:
    assert {reason for reason, _ in STOPPED_BY} == set(StopReason) == set(STOP_EXIT_CAUSES)


@pytest.mark.parametrize(("reason", "stop"), STOPPED_BY)
def test_the_lifecycle_counts_the_tables_cause_for_each_reason(
        reason: StopReason, stop: Callable[[Lifecycle], None]) -> None:
    """Whatever the process itself died of, the exit the supervisor caused is counted as
    :data:`~cuzkd.states.STOP_EXIT_CAUSES` says."""
    machine = running_engine()
    stop(machine)
    assert machine.state is State.STOPPING
    machine.exited("signal_SIGKILL", False, 20.0)
    assert machine.last_exit_cause == STOP_EXIT_CAUSES[reason]
    assert machine.exits[STOP_EXIT_CAUSES[reason]] == 1


def test_the_supervisors_causes_are_every_cause_a_stop_leads_to_and_only_those() -> None:
    """The runner reports an exit as unexpected unless its cause is in SUPERVISOR_CAUSES: that
    set is exactly what the lifecycle counts for the supervisor's own stops, and no cause a
    process can die of by itself is in it."""
    counted = set()
    for reason, stop in STOPPED_BY:
        machine = running_engine()
        stop(machine)
        machine.exited("exit_0", True, 20.0)
        counted.add(machine.last_exit_cause)
        assert machine.last_exit_cause == STOP_EXIT_CAUSES[reason]
    assert counted == SUPERVISOR_CAUSES
    by_itself = {process_cause(end, supervisor_killed=False, oom_kills_moved=True,
                               descendants_left=True)[0]
                 for end in (ProcessEnd(signal.SIGKILL, None), ProcessEnd(signal.SIGSEGV, None,
                                                                           core_dumped=True),
                             ProcessEnd(None, 0))}
    assert by_itself == {ExitCause.OOM_KILLED, ExitCause.CORE_DUMPED, ExitCause.DAEMONIZED}
    assert not by_itself & SUPERVISOR_CAUSES


def test_the_groups_of_states_cover_every_state_once_after_a_start() -> None:
    """Right after a start request the runner either has a process on the way (alive), will
    not get one (at rest), or waits for the spawn still to come (start pending): no state is
    left out, none in two of them. A start's wait settles in every state but the passages."""
    groups = (ALIVE, AT_REST, START_PENDING)
    assert set().union(*groups) == set(State)
    assert sum(len(group) for group in groups) == len(State)
    assert set(State) - START_SETTLED == {State.STARTING, State.STOPPING}
