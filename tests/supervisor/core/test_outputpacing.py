"""Pacing a flooding pipe, on a virtual CPU clock: when the reader pauses and for how long."""

from __future__ import annotations

import pytest

from cuzkd.supervisor.core.outputpacing import (
    FLOOR_BYTES_PER_SECOND,
    MAX_PAUSE,
    MIN_PAUSE,
    SHARE,
    OutputPacer,
    PacingTotals,
    longest_pause,
    pause_for,
)

PIPE = 1 << 20
#: Reads as asyncio's pipe transport makes them: at most 256 KiB.
READ = 256 << 10


def test_output_read_without_a_discard_is_never_paused() -> None:
    pacer = OutputPacer(PIPE, cpu=0.0)
    assert [pacer.read(READ, discarded=False, cpu=i / 10) for i in range(100)] == [None] * 100
    assert pacer.totals == PacingTotals()


def test_a_flood_pauses_at_the_end_of_each_pipe_worth_for_its_cost_over_the_share() -> None:
    """A discard anywhere in a window pauses the reader once the window (a pipe's worth) is
    read; the pause makes the window's CPU time SHARE of the window and its pause."""
    pacer = OutputPacer(PIPE, cpu=10.0)
    assert pacer.read(READ, discarded=False, cpu=10.001) is None
    assert pacer.read(READ, discarded=True, cpu=10.002) is None  # the window is not over
    assert pacer.read(READ, discarded=False, cpu=10.003) is None
    pause = pacer.read(READ, discarded=False, cpu=10.004)
    assert pause == pytest.approx(0.004 * (1 - SHARE) / SHARE)
    assert 0.004 / (0.004 + pause) == pytest.approx(SHARE)
    # Reading again: the next window's cost counts from the resume, not from the pause.
    pacer.resumed(cpu=20.0)
    assert pacer.read(PIPE - 1, discarded=True, cpu=20.001) is None
    assert pacer.read(1, discarded=True, cpu=20.002) == pytest.approx(0.002 * (1 - SHARE) / SHARE)
    assert pacer.totals.pauses == 2
    assert pacer.totals.longest_pause == pytest.approx(0.004 * (1 - SHARE) / SHARE)
    assert pacer.totals.paused_seconds == pytest.approx(0.006 * (1 - SHARE) / SHARE)


def test_a_window_without_a_discard_ends_the_pacing() -> None:
    pacer = OutputPacer(PIPE, cpu=0.0)
    assert pacer.read(PIPE, discarded=True, cpu=0.001) is not None
    pacer.resumed(cpu=0.001)
    assert pacer.read(PIPE, discarded=False, cpu=0.002) is None  # the flood is over
    assert pacer.read(PIPE // 2, discarded=True, cpu=0.003) is None  # a new window
    assert pacer.read(PIPE // 2, discarded=False, cpu=0.004) is not None
    assert pacer.totals.pauses == 2


def test_pauses_stay_between_the_shortest_and_the_longest() -> None:
    assert pause_for(0.0, PIPE) == MIN_PAUSE  # a cheap window: the wake-ups are bounded
    assert pause_for(-1.0, PIPE) == MIN_PAUSE  # a clock that went back
    assert pause_for(10.0, PIPE) == MAX_PAUSE  # a window that took long (other work on the loop)
    assert longest_pause(PIPE) == MAX_PAUSE
    # A pipe left at the 64 KiB default: a pipe's worth a pause is still the floor rate.
    small = 64 << 10
    assert longest_pause(small) == pytest.approx(small / FLOOR_BYTES_PER_SECOND)
    assert longest_pause(small) < MAX_PAUSE
    assert pause_for(10.0, small) == pytest.approx(0.0625)
    pacer = OutputPacer(small, cpu=0.0)
    assert pacer.read(small, discarded=True, cpu=5.0) == pytest.approx(0.0625)


def test_the_pauses_never_hold_a_writer_below_the_floor_rate() -> None:
    """A writer blocked on its full pipe: each resume reads a pipe's worth before the next
    pause, however costly the reading, so the pauses hold it to no less than the floor."""
    pacer, cpu, freed = OutputPacer(PIPE, cpu=0.0), 0.0, 0
    for _ in range(50):
        pacer.resumed(cpu)
        pause = None
        while pause is None:
            cpu += 1.0  # as costly as it gets: every read takes a CPU second
            freed += READ
            pause = pacer.read(READ, discarded=True, cpu=cpu)
    assert (pacer.totals.pauses, pacer.totals.longest_pause) == (50, MAX_PAUSE)
    assert freed == 50 * PIPE
    assert freed / pacer.totals.paused_seconds >= FLOOR_BYTES_PER_SECOND
