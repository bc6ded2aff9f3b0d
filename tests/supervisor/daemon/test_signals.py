"""The signal table and its decisions, from plain values; its installation, with real signals
sent to this process (the handlers are put back after each test).

What a real ``cuzkd run`` does with each signal is in test_signals_e2e.py.
"""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import Iterator

import pytest

from cuzkd.states import Phase
from cuzkd.supervisor.core.signals import LEFT_ALONE, TABLE, Decision, Meaning, decide, name_of
from cuzkd.supervisor.daemon import signalinstall

FAULTS = {signal.SIGSEGV, signal.SIGBUS, signal.SIGFPE, signal.SIGILL, signal.SIGSYS,
          signal.SIGABRT, signal.SIGTRAP}
#: Signals whose default action ends a process, faults aside (signal(7)).
TERMINATING = {signal.SIGHUP, signal.SIGINT, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2,
               signal.SIGALRM, signal.SIGTERM, signal.SIGSTKFLT, signal.SIGXCPU, signal.SIGXFSZ,
               signal.SIGVTALRM, signal.SIGPROF, signal.SIGIO, signal.SIGPWR,
               *range(signal.SIGRTMIN, signal.SIGRTMAX + 1)}


def test_every_signal_that_ends_a_process_by_default_is_handled_and_faults_are_not() -> None:
    assert set(TABLE) == TERMINATING
    assert FAULTS | {signal.SIGPIPE, signal.SIGCHLD} <= LEFT_ALONE
    # Nothing is forgotten: each signal is handled or left alone on purpose, never both.
    assert set(TABLE) | LEFT_ALONE == set(signal.valid_signals())
    assert not set(TABLE) & LEFT_ALONE


def test_each_meaning() -> None:
    assert {s for s, m in TABLE.items() if m is Meaning.STOP} == {signal.SIGTERM, signal.SIGINT}
    assert TABLE[signal.SIGHUP] is Meaning.RELOAD
    assert TABLE[signal.SIGUSR1] is Meaning.DUMP_STATE
    assert TABLE[signal.SIGQUIT] is Meaning.DUMP_STACKS
    assert all(TABLE[s] is Meaning.IGNORE
               for s in (signal.SIGUSR2, signal.SIGALRM, signal.SIGRTMIN, signal.SIGRTMAX))


def test_the_first_stop_signal_stops_and_any_later_one_hurries_in_every_phase() -> None:
    for phase in Phase:
        for signum in (signal.SIGTERM, signal.SIGINT):
            assert decide(signum, phase, stops=0) is Decision.STOP
            assert decide(signum, phase, stops=1) is Decision.HURRY
            assert decide(signum, phase, stops=7) is Decision.HURRY


def test_sighup_reloads_only_while_running_or_reloading() -> None:
    assert decide(signal.SIGHUP, Phase.RUNNING, 0) is Decision.RELOAD
    assert decide(signal.SIGHUP, Phase.RELOADING, 0) is Decision.RELOAD  # queued behind it
    assert decide(signal.SIGHUP, Phase.STARTING, 0) is Decision.NO_RELOAD
    assert decide(signal.SIGHUP, Phase.STOPPING, 1) is Decision.NO_RELOAD
    assert Decision.NO_RELOAD.event == "signal_ignored"
    assert Decision.RELOAD.event is None  # the reload logs its own outcome


def test_dumps_in_any_phase_and_the_rest_is_ignored_with_a_line() -> None:
    for phase in (Phase.STARTING, Phase.RUNNING, Phase.STOPPING):
        assert decide(signal.SIGUSR1, phase, 1) is Decision.DUMP_STATE
        assert decide(signal.SIGQUIT, phase, 1) is Decision.DUMP_STACKS
        assert decide(signal.SIGRTMIN + 3, phase, 0) is Decision.IGNORE
    assert decide(signal.SIGSEGV, Phase.RUNNING, 0) is Decision.IGNORE  # not installed; if asked
    assert Decision.IGNORE.event == "signal_ignored" and Decision.IGNORE.level == "warning"


def test_names_for_the_log() -> None:
    assert name_of(signal.SIGUSR1) == "SIGUSR1"
    assert name_of(signal.SIGRTMIN) == "SIGRTMIN"
    assert name_of(signal.SIGRTMIN + 3) == "SIGRTMIN+3"
    assert name_of(signal.SIGRTMAX) == "SIGRTMAX"


@pytest.fixture
def dispositions() -> Iterator[None]:
    """Put this process's handlers for the table's signals back as they were."""
    saved = {signum: signal.getsignal(signum) for signum in TABLE}
    try:
        yield
    finally:
        signalinstall.handover()
        for signum, handler in saved.items():
            signal.signal(signum, handler if handler is not None else signal.SIG_DFL)


def test_hold_notes_signals_until_handed_over_then_ignores_them(dispositions: None) -> None:
    signalinstall.hold()
    for signum in (signal.SIGTERM, signal.SIGUSR2, signal.SIGTERM, signal.SIGTERM,
                   signal.SIGRTMIN + 1):
        os.kill(os.getpid(), signum)  # Python runs the handler before the next line
    assert signalinstall.handover() == [signal.SIGTERM, signal.SIGTERM, signal.SIGUSR2,
                                        signal.SIGRTMIN + 1]  # a stop twice at most: it hurries
    os.kill(os.getpid(), signal.SIGTERM)  # still handled, no longer noted: nothing happens
    assert signalinstall.handover() == []


def test_loop_signals_take_over_replay_and_put_the_previous_handlers_back(
        dispositions: None) -> None:
    signalinstall.hold()
    os.kill(os.getpid(), signal.SIGINT)  # no KeyboardInterrupt: noted
    held = signal.getsignal(signal.SIGUSR2)

    async def main() -> tuple[list[int], list[int]]:
        seen: list[int] = []
        arrived = asyncio.Event()

        def on_signal(signum: int) -> None:
            seen.append(signum)
            arrived.set()

        loop_signals = signalinstall.LoopSignals(asyncio.get_running_loop(), on_signal)
        replay = loop_signals.install()
        os.kill(os.getpid(), signal.SIGUSR2)
        await arrived.wait()
        loop_signals.uninstall()
        return replay, seen

    replay, seen = asyncio.run(main())
    assert replay == [signal.SIGINT] and seen == [signal.SIGUSR2]
    assert signal.getsignal(signal.SIGUSR2) is held  # the noting handler, idle: exit is safe
