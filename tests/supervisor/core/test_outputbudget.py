"""The output budget: which engine lines are logged, how refused ones are counted and reported."""

from __future__ import annotations

from cuzkd.supervisor.core.outputbudget import (
    REPORT_INTERVAL,
    OutputBudget,
    OutputLimits,
    Suppressed,
)

LIMITS = OutputLimits(lines_per_second=10, bytes_per_second=1000, burst_lines=5, burst_bytes=500)


def test_a_burst_is_admitted_then_lines_at_the_rate() -> None:
    budget = OutputBudget(LIMITS, now=0.0)
    assert [budget.admit(10, 0.0) for _ in range(7)] == [True] * 5 + [False] * 2
    assert not budget.admit(10, 0.05)  # half a line refilled
    assert budget.admit(10, 0.1)  # one line per 0.1 s
    assert not budget.admit(10, 0.1)
    assert [budget.admit(10, 100.0) for _ in range(6)] == [True] * 5 + [False]  # burst cap
    assert (budget.dropped_lines_total, budget.dropped_bytes_total) == (5, 50)


def test_bytes_limit_too_and_a_line_longer_than_the_burst_passes_a_full_bucket() -> None:
    budget = OutputBudget(LIMITS, now=0.0)
    assert budget.admit(400, 0.0)
    assert not budget.admit(200, 0.0)  # 100 bytes left
    assert budget.admit(100, 0.0)
    assert not budget.admit(5000, 0.1)  # 100 bytes back: not full
    assert budget.admit(5000, 10.0)  # full: taken, and the bucket is empty
    assert not budget.admit(1, 10.0)
    assert budget.dropped_bytes_total == 5201


def test_suppressed_lines_are_reported_at_once_then_once_per_interval_and_at_the_end() -> None:
    budget = OutputBudget(LIMITS, now=0.0)
    assert budget.report(0.0) is None  # nothing suppressed
    for _ in range(5):
        budget.admit(1, 0.0)
    assert not budget.admit(7, 0.0)  # refused: the first report comes at once
    assert budget.report(0.0) == Suppressed(lines=1, bytes=7, seconds=0.0)
    budget.refuse(100, 4000, 2.0)  # a read's rest, in bulk
    assert budget.report(2.0) is None  # within the interval
    budget.refuse(1, 3, 3.0)
    assert budget.report(REPORT_INTERVAL) == Suppressed(101, 4003, REPORT_INTERVAL - 2)
    budget.refuse(2, 2, 12.0)
    assert budget.report(13.0) is None
    assert budget.report(13.0, final=True) == Suppressed(2, 2, 1.0)  # the output ended
    assert budget.report(50.0, final=True) is None
    budget.cut(1000)  # an over-long line's rest: bytes, not a line refused, nothing to report
    assert budget.report(100.0) is None
    assert (budget.dropped_lines_total, budget.dropped_bytes_total) == (104, 5012)
