"""``supervisor/core/sendbudget.py``: the unsent bytes of all connections, bounded by evicting
the longest waiting (pure: plain keys and byte counts)."""

from __future__ import annotations

from cuzkd.supervisor.core.sendbudget import SendBudget


def test_within_the_limit_nobody_is_evicted() -> None:
    budget: SendBudget[str] = SendBudget(100)
    assert budget.hold("a", 40) == [] and budget.hold("b", 60) == []
    assert budget.held == 100 and len(budget) == 2


def test_past_the_limit_the_longest_waiting_go_first() -> None:
    budget: SendBudget[str] = SendBudget(100)
    for key in "abc":
        budget.hold(key, 40)  # c takes it to 120: a, the oldest, goes
    assert budget.held == 80
    assert budget.hold("d", 90) == ["b", "c"]
    assert budget.held == 90 and len(budget) == 1


def test_a_reader_that_frees_its_bytes_is_young_again() -> None:
    budget: SendBudget[str] = SendBudget(100)
    budget.hold("reader", 40)
    budget.hold("stuck", 40)
    budget.release("reader")  # its slice left: it reads
    budget.hold("reader", 40)  # its next slice waits: it is now the youngest
    assert budget.hold("new", 40) == ["stuck"]


def test_the_asker_is_never_evicted_for_its_own_wait() -> None:
    budget: SendBudget[str] = SendBudget(10)
    budget.hold("a", 5)
    assert budget.hold("big", 50) == ["a"]
    assert budget.held == 50


def test_holding_again_replaces_and_release_forgets() -> None:
    budget: SendBudget[str] = SendBudget(100)
    budget.hold("a", 70)
    budget.hold("a", 30)
    assert budget.held == 30
    budget.release("a")
    budget.release("a")  # twice, or never held: nothing
    assert budget.held == 0 and len(budget) == 0
