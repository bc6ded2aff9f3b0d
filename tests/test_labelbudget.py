"""Label budgets: the first N distinct values of a label stay, later ones are dropped, counted."""

from __future__ import annotations

import structlog

from cuzkd.labelbudget import DEFAULT_LIMITS, MAX_VALUE_LENGTH, LabelBudget, LabelBudgets


def test_the_first_values_seen_keep_their_slots_while_later_ones_are_refused() -> None:
    budget = LabelBudget(3)
    assert [budget.admits(v) for v in ("a", "b", "a", "c", "d", "e")] == [
        True, True, True, True, False, False]
    # an admitted value keeps its slot even after documents stop naming it: "d" never gets in
    assert budget.admits("d") is False
    assert budget.admits("a") is True


def test_clear_frees_every_slot() -> None:
    budget = LabelBudget(1)
    assert budget.admits("old")
    assert not budget.admits("new")
    budget.clear()
    assert budget.admits("new")
    assert not budget.admits("old")


def test_a_value_too_long_is_refused_whatever_the_room() -> None:
    budget = LabelBudget(10)
    assert budget.admits("k" * MAX_VALUE_LENGTH)
    assert not budget.admits("k" * (MAX_VALUE_LENGTH + 1))
    assert not budget.admits("x" * 2**20)


def test_keep_counts_each_value_left_out_once_per_call_and_logs_once() -> None:
    labels = LabelBudgets("e0", {"worker": 2})
    with structlog.testing.capture_logs() as lines:
        for _ in range(100):
            kept = labels.keep("worker", [0, 1, 2, 3, 4], str)
            assert kept == [0, 1]
        labels.keep("proof_kind", [f"kind-{i}" for i in range(40)], str)
    assert labels.dropped_total == {"worker": 300, "proof_kind": 40 - DEFAULT_LIMITS["proof_kind"]}
    # one line per label per 10 s, however many scrapes drop values
    assert [(r["event"], r["engine"], r["label"], r["limit"], r["dropped"], r["first_dropped"])
            for r in lines] == [
        ("label_values_dropped", "e0", "worker", 2, 3, "2"),
        ("label_values_dropped", "e0", "proof_kind", 32, 8, "kind-32"),
    ]


def test_a_refused_value_is_quoted_short_in_the_log_line() -> None:
    labels = LabelBudgets("e0", {"proof_kind": 1})
    with structlog.testing.capture_logs() as lines:
        labels.keep("proof_kind", ["porep-c2", "\x1b[31m" + "x" * 10_000], str)
    (line,) = lines
    assert len(line["first_dropped"]) <= 64


def test_nothing_dropped_nothing_counted_nor_logged() -> None:
    labels = LabelBudgets("e0")
    with structlog.testing.capture_logs() as lines:
        assert labels.keep("proof_kind", ["porep-c2", "snap-update"], str) == [
            "porep-c2", "snap-update"]
    assert lines == []
    assert labels.dropped_total == {}


def test_a_budgets_admits_shares_the_slots_with_keep_and_counts_nothing() -> None:
    labels = LabelBudgets("e0", {"proof_kind": 1})
    assert labels.budget("proof_kind").admits("window-post")
    assert not labels.budget("proof_kind").admits("winning-post")
    assert labels.dropped_total == {}
    assert labels.keep("proof_kind", ["winning-post", "window-post"], str) == ["window-post"]
    assert labels.dropped_total == {"proof_kind": 1}
