"""The vocabulary of :mod:`cuzkd.states` is what the supervisor's decisions produce.

Each word is defined once there; these tests hold the behaviour that depends on it: the exit
cause the lifecycle counts for each of the supervisor's intents is the table's, the intent
causes are the ones the runner treats as the supervisor's doing (and no cause a process dies
of by itself), and the named groups of states cover what the runner's start waits on.
"""

from __future__ import annotations

import signal
from collections.abc import Callable

import pytest

from cuzkd.states import (
    ALIVE,
    AT_REST,
    INTENT_CAUSE,
    INTENT_CAUSES,
    START_PENDING,
    START_SETTLED,
    ExitCause,
    State,
    StopIntent,
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


#: One way to reach each of the supervisor's intents from a running engine.
STOPPED_BY: dict[StopIntent, Callable[[Lifecycle], None]] = {
    StopIntent.STOP: _stop,
    StopIntent.RESTART: _restart,
    StopIntent.SWAP: _swap,
    StopIntent.UNHEALTHY: _unhealthy,
    StopIntent.STALLED: _stalled,
    StopIntent.START_TIMEOUT: _start_timeout,
}


@pytest.mark.parametrize("intent", list(StopIntent))
def test_the_lifecycle_counts_the_tables_cause_for_each_intent(intent: StopIntent) -> None:
    """Whatever the process itself died of, the exit the supervisor caused is counted as
    :data:`~cuzkd.states.INTENT_CAUSE` says."""
    machine = running_engine()
    STOPPED_BY[intent](machine)
    assert machine.state is State.STOPPING
    machine.exited("signal_SIGKILL", False, 20.0)
    assert machine.last_exit_cause == INTENT_CAUSE[intent]
    assert machine.exits[INTENT_CAUSE[intent]] == 1


def test_the_intent_causes_are_every_cause_an_intent_leads_to_and_only_those() -> None:
    """The runner reports an exit as unexpected unless its cause is in INTENT_CAUSES: that set
    is exactly what the lifecycle counts for the supervisor's own stops, and no cause a
    process can die of by itself is in it."""
    counted = set()
    for intent, stop in STOPPED_BY.items():
        machine = running_engine()
        stop(machine)
        machine.exited("exit_0", True, 20.0)
        counted.add(machine.last_exit_cause)
        assert machine.last_exit_cause == INTENT_CAUSE[intent]
    assert counted == set(INTENT_CAUSES)
    assert len(INTENT_CAUSES) == len(counted)  # each once
    by_itself = {process_cause(end, supervisor_killed=False, oom_kills_moved=True,
                               descendants_left=True)[0]
                 for end in (ProcessEnd(signal.SIGKILL, None), ProcessEnd(signal.SIGSEGV, None,
                                                                           core_dumped=True),
                             ProcessEnd(None, 0))}
    assert by_itself == {ExitCause.OOM_KILLED, ExitCause.CORE_DUMPED, ExitCause.DAEMONIZED}
    assert not by_itself & set(INTENT_CAUSES)


def test_the_groups_of_states_cover_every_state_once_after_a_start() -> None:
    """Right after a start request the runner either has a process on the way (alive), will
    not get one (at rest), or waits for the spawn still to come (start pending): no state is
    left out, none in two of them. A start's wait settles in every state but the passages."""
    groups = (ALIVE, AT_REST, START_PENDING)
    assert set().union(*groups) == set(State)
    assert sum(len(group) for group in groups) == len(State)
    assert set(State) - START_SETTLED == {State.STARTING, State.STOPPING}
