"""The swap's wait-healthy decision, from plain observations (no processes, no clock)."""

from __future__ import annotations

from cuzkd.states import State
from cuzkd.supervisor.core.healthwait import HealthWait, Observation


def seen(now: float, state: State, pid: int | None = 7, error: str | None = None) -> Observation:
    return Observation(now, pid, state, error, f"engine is {state}")


def wait() -> HealthWait:
    return HealthWait(pid=7, start_timeout=30, settle=5, started=100)


def test_answer_then_settle_is_healthy_at_the_end_of_the_settle_period() -> None:
    w = wait()
    assert not w.observe(seen(101, State.STARTING)) and w.deadline == 130
    assert not w.observe(seen(110, State.RUNNING)) and w.deadline == 115  # answered at 110
    assert not w.observe(seen(114.9, State.RUNNING))
    assert w.observe(seen(115, State.RUNNING)) and w.outcome is None


def test_silent_status_fails_at_start_timeout_naming_the_last_error() -> None:
    w = wait()
    assert not w.observe(seen(129, State.STARTING, error="connection refused"))
    assert w.observe(seen(130, State.STARTING, error="connection refused"))
    assert w.outcome == ("status did not answer within start_timeout (30s) "
                         "(last error: connection refused)")


def test_an_exit_before_the_answer_or_during_the_settle_period_says_which() -> None:
    before = wait()
    assert before.observe(seen(105, State.BACKOFF, pid=None))
    assert before.outcome == "process 7 ended before its status answered: engine is backoff"
    during = wait()
    during.observe(seen(110, State.RUNNING))
    assert during.observe(seen(112, State.STOPPING))
    assert during.outcome == ("process 7 did not stay up for the 5s settle period: "
                              "engine is stopping")


def test_another_process_is_not_the_one_waited_for() -> None:
    w = wait()
    w.observe(seen(110, State.RUNNING))
    assert w.observe(seen(111, State.RUNNING, pid=8))  # restarted meanwhile: not healthy
    assert w.outcome is not None and w.outcome.startswith("process 7 did not stay up")
    assert w.observe(seen(200, State.RUNNING))  # over is over
