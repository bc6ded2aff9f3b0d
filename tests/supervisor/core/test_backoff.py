"""Backoff policy: immediate after a healthy run, exponential with bounded jitter otherwise."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from cuzkd.supervisor.core.backoff import Backoff


def make(rand: float = 0.0) -> Backoff:
    return Backoff(initial=0.1, maximum=30.0, multiplier=2.0, reset_after=60.0,
                   rand=lambda: rand)


def test_crash_loop_grows_exponentially_to_the_cap() -> None:
    b = make()
    delays = [b.next_delay(None) for _ in range(14)]
    assert delays[:6] == [0.0, 0.1, 0.2, 0.4, 0.8, 1.6]
    assert delays[-1] == 30.0
    assert max(delays) == 30.0


def test_healthy_run_resets_to_an_immediate_restart() -> None:
    b = make()
    for _ in range(5):
        b.next_delay(None)
    assert b.next_delay(59.0) > 0  # not healthy long enough
    assert b.next_delay(60.0) == 0.0
    assert b.next_delay(1.0) == 0.1


def test_jitter_only_shortens() -> None:
    b = make(rand=1.0)
    assert [b.next_delay(None) for _ in range(3)] == [0.0, 0.1 * 0.8, 0.2 * 0.8]


def test_long_crash_loop_does_not_overflow() -> None:
    b = Backoff(initial=0.1, maximum=30.0, multiplier=100.0, reset_after=60.0)
    for _ in range(5000):
        assert b.next_delay(None) <= 30.0


@given(st.lists(st.floats(min_value=0.0, max_value=1.0), min_size=2, max_size=40))
def test_delays_never_exceed_the_cap_and_grow_until_it(rands: list[float]) -> None:
    it = iter(rands)
    b = Backoff(initial=0.05, maximum=5.0, multiplier=2.0, reset_after=60.0,
                rand=lambda: next(it, 0.5))
    delays = [b.next_delay(None) for _ in rands]
    assert all(0 <= d <= 5.0 for d in delays)
    below_cap = [d for d in delays[1:] if d < 5.0 * 0.8]
    assert below_cap == sorted(below_cap)
