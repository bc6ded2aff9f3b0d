"""``supervisor/core/sendbudget.py``: the bytes all responses hold (bodies once each, waiting
slices), bounded by evicting those that progressed longest ago (pure: plain keys, sizes)."""

from __future__ import annotations

from cuzkd.supervisor.core.sendbudget import SendBudget


def test_a_shared_body_counts_once() -> None:
    budget: SendBudget[str] = SendBudget(100)
    assert budget.start("a", "v1", 60) == [] and budget.start("b", "v1", 60) == []
    assert budget.held == 60 and len(budget) == 2
    budget.finish("a")
    assert budget.held == 60  # b still sends it
    budget.finish("b")
    assert budget.held == 0


def test_past_the_limit_the_longest_without_progress_go_first() -> None:
    budget: SendBudget[str] = SendBudget(100)
    for key in "abc":
        budget.start(key, "v1", 10)
        budget.hold(key, 30)  # c takes it to 100: all fit
    assert budget.held == 100
    assert budget.hold("d", 30) == []  # d never started: not in flight, nothing held
    assert budget.start("d", "v2", 50) == ["a", "b"]  # 150 -> 120 -> 90
    assert budget.held == 90 and len(budget) == 2


def test_a_reader_that_progresses_is_young_again() -> None:
    budget: SendBudget[str] = SendBudget(100)
    budget.start("reader", "v1", 20)
    budget.start("stuck", "v1", 20)
    budget.hold("stuck", 30)
    budget.hold("reader", 30)  # its next slice waits: it progressed, it is the youngest
    assert budget.start("new", "v2", 30) == ["stuck"]
    assert budget.held == 20 + 30 + 30


def test_versions_are_bodies_of_their_own() -> None:
    budget: SendBudget[str] = SendBudget(100)
    budget.start("old", "v1", 40)
    budget.start("older-reader", "v1", 40)
    assert budget.start("new", "v2", 40) == []
    assert budget.start("newest", "v3", 40) == ["old", "older-reader"]  # v1 freed with them
    assert budget.held == 80


def test_the_asker_is_never_evicted_for_itself() -> None:
    budget: SendBudget[str] = SendBudget(10)
    budget.start("a", "v1", 5)
    assert budget.start("big", "v2", 50) == ["a"]
    assert budget.held == 50
    assert budget.hold("big", 8) == [] and budget.held == 58


def test_release_and_finish_forget_and_repeat_harmlessly() -> None:
    budget: SendBudget[str] = SendBudget(100)
    budget.start("a", "v1", 10)
    budget.hold("a", 70)
    budget.hold("a", 30)
    assert budget.held == 40
    budget.release("a")
    assert budget.held == 10
    budget.finish("a")
    budget.finish("a")  # twice, or never started: nothing
    budget.release("zzz")
    assert budget.held == 0 and len(budget) == 0
