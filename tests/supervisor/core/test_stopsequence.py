"""The stop sequence's decisions with plain numbers: every step, deadline and drain verdict."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cuzkd.supervisor.core.stopsequence import (
    DRAIN_POLL,
    DrainOver,
    Finished,
    ReadStatus,
    RequestDrain,
    SendSignal,
    Step,
    StopSequence,
    WaitUntil,
)

STOP_SIGNAL = SendSignal(kill=False, ends_work=True)
KILL_AFTER_TIMEOUT = SendSignal(kill=True, ends_work=False, why="stop_timeout elapsed")


def begin(mode: str = "none", *, now: float = 100.0, kill: str | None = None,
          health_interval: float = 1.0) -> StopSequence:
    return StopSequence.begin(now, drain_mode=mode, drain_timeout=20.0, stop_timeout=10.0,
                              health_interval=health_interval, kill_reason=kill)


def test_without_a_drain_the_stop_signal_goes_at_once_then_sigkill_at_stop_timeout() -> None:
    seq = begin()
    assert not seq.draining
    assert seq.step(100.0, exited=False) == STOP_SIGNAL
    assert seq.step(100.0, exited=False) == WaitUntil(110.0)
    assert seq.step(109.99, exited=False) == WaitUntil(110.0)
    assert seq.step(110.0, exited=False) == KILL_AFTER_TIMEOUT
    assert seq.step(110.5, exited=False) == Finished()


def test_an_engine_that_exits_on_the_stop_signal_gets_no_sigkill() -> None:
    seq = begin()
    assert seq.step(100.0, exited=False) == STOP_SIGNAL
    assert seq.step(103.0, exited=True) == Finished()
    assert seq.step(200.0, exited=True) == Finished()


def test_a_stalled_engine_is_killed_at_once_and_that_kill_ends_the_work() -> None:
    seq = begin("http", kill="stalled")
    assert not seq.draining
    assert seq.step(100.0, exited=False) == SendSignal(kill=True, ends_work=True, why="stalled")
    assert seq.step(100.0, exited=False) == Finished()


def test_a_kill_of_a_process_already_gone_sends_nothing_and_counts_no_lost_work() -> None:
    assert begin(kill="stalled").step(100.0, exited=True) == Finished()


def test_http_drain_asks_once_then_reads_the_status_every_poll_until_the_engine_exits() -> None:
    seq = begin("http")
    assert seq.draining
    assert seq.step(100.0, exited=False) == RequestDrain(by=120.0)  # bounded by drain_timeout
    seq.drain_answered(True)
    assert seq.step(100.1, exited=False) == ReadStatus(by=120.0)
    seq.status_read(quiet=True)  # an http drain waits for the exit, not for a quiet moment
    assert seq.step(100.1, exited=False) == WaitUntil(100.1 + DRAIN_POLL)
    assert seq.step(100.6, exited=False) == ReadStatus(by=120.0)
    assert seq.step(104.0, exited=True) == DrainOver("clean", 4.0)
    assert seq.step(104.0, exited=True) == Finished()


def test_a_refused_drain_request_counts_no_drain_and_signals_at_once() -> None:
    seq = begin("http")
    assert seq.step(100.0, exited=False) == RequestDrain(by=120.0)
    seq.drain_answered(False)
    assert seq.step(105.0, exited=False) == STOP_SIGNAL
    assert seq.step(105.0, exited=False) == WaitUntil(115.0)


def test_quiet_drain_ends_clean_at_the_first_quiet_status_then_signals() -> None:
    seq = begin("quiet")
    assert seq.step(100.0, exited=False) == ReadStatus(by=120.0)  # no request: reads at once
    seq.status_read(quiet=False)
    assert seq.step(100.0, exited=False) == WaitUntil(100.0 + DRAIN_POLL)
    assert seq.step(100.5, exited=False) == ReadStatus(by=120.0)
    seq.status_read(quiet=True)
    assert seq.step(100.5, exited=False) == DrainOver("clean", 0.5)
    assert seq.step(100.5, exited=False) == STOP_SIGNAL
    assert seq.step(100.5, exited=False) == WaitUntil(110.5)


def test_a_drain_that_reaches_drain_timeout_is_judged_timeout_and_the_signal_follows() -> None:
    seq = begin("quiet")
    now = 100.0
    while isinstance(step := seq.step(now, exited=False), ReadStatus | WaitUntil):
        if isinstance(step, WaitUntil):
            assert step.at <= 120.0  # never waits past drain_timeout
            now = step.at
        else:
            seq.status_read(quiet=False)
    assert (now, step) == (120.0, DrainOver("timeout", 20.0))
    assert seq.step(now, exited=False) == STOP_SIGNAL
    assert seq.step(now, exited=False) == WaitUntil(130.0)


def test_an_exit_during_a_drain_after_a_hurried_kill_is_no_clean_drain() -> None:
    seq = begin("quiet")
    assert seq.step(100.0, exited=False) == ReadStatus(by=120.0)
    assert seq.step(101.0, exited=True, killed=True) == DrainOver("timeout", 1.0)
    assert seq.step(101.0, exited=True) == Finished()


def test_an_exit_while_the_signal_is_due_ends_the_sequence_without_a_signal() -> None:
    seq = begin("http")
    assert seq.step(100.0, exited=False) == RequestDrain(by=120.0)
    seq.drain_answered(False)
    assert seq.step(100.2, exited=True) == Finished()


@pytest.mark.parametrize(("health_interval", "every"), [(0.1, 0.1), (5.0, DRAIN_POLL)])
def test_status_reads_while_draining_follow_the_shorter_of_health_interval_and_drain_poll(
        health_interval: float, every: float) -> None:
    seq = begin("quiet", health_interval=health_interval)
    steps: list[Step] = []
    now = 100.0
    while now < 102.0:
        step = seq.step(now, exited=False)
        steps.append(step)
        if isinstance(step, WaitUntil):
            now = step.at
    reads = sum(isinstance(s, ReadStatus) for s in steps)
    assert reads == pytest.approx(2.0 / every, abs=1)


@settings(max_examples=300, deadline=None)
@given(mode=st.sampled_from(["http", "quiet", "none"]),
       kill=st.sampled_from([None, "stalled"]),
       accepted=st.booleans(),
       quiet_reads=st.lists(st.booleans(), max_size=80),
       exit_after=st.one_of(st.none(), st.floats(0, 40)),
       killed=st.booleans())
def test_any_schedule_ends_in_bounded_time_with_one_work_ending_signal(
        mode: str, kill: str | None, accepted: bool, quiet_reads: list[bool],
        exit_after: float | None, killed: bool) -> None:
    """Whatever the engine does (accepts the drain or not, shows quiet moments or not, exits
    at any moment or never): the sequence ends by drain_timeout + stop_timeout, throws work
    away at most once and with its first signal, signals nothing after the exit, and sends
    SIGKILL only at stop_timeout after the stop signal (or at once for a kill)."""
    start = 100.0
    seq = begin(mode, now=start, kill=kill)
    now, reads = start, iter(quiet_reads)
    signals: list[tuple[float, SendSignal]] = []
    drains: list[DrainOver] = []
    exited_at = None if exit_after is None else start + exit_after
    for _ in range(1000):
        exited = exited_at is not None and now >= exited_at
        step = seq.step(now, exited=exited, killed=killed and exited)
        if isinstance(step, Finished):
            break
        if isinstance(step, SendSignal):
            assert not exited, "a signal after the exit"
            signals.append((now, step))
        elif isinstance(step, DrainOver):
            assert not signals and not drains, "one verdict, before any signal"
            drains.append(step)
        elif isinstance(step, RequestDrain):
            seq.drain_answered(accepted)
        elif isinstance(step, ReadStatus):
            seq.status_read(next(reads, False))
        else:
            assert isinstance(step, WaitUntil) and step.at >= now
            # the wait ends at its time, or earlier when the process exits meanwhile
            now = step.at if exited_at is None or exited_at <= now else min(step.at, exited_at)
    else:
        pytest.fail("the sequence never finished")
    assert seq.step(now + 1000, exited=True) == Finished()
    assert now <= start + 20.0 + 10.0
    assert [s.ends_work for _, s in signals][:1] in ([], [True])
    assert sum(s.ends_work for _, s in signals) <= 1
    if kill is not None:
        gone_at_once = exited_at is not None and exited_at <= start
        assert [s for _, s in signals] == ([] if gone_at_once else
                                           [SendSignal(kill=True, ends_work=True, why=kill)])
        assert not drains
    else:
        if mode == "none":
            assert not drains
        kills = [at for at, s in signals if s.kill]
        stops = [at for at, s in signals if not s.kill]
        assert len(stops) <= 1 and len(kills) <= 1
        if kills:
            assert stops and kills[0] >= stops[0] + 10.0
