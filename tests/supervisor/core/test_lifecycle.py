"""The engine lifecycle state machine, driven directly with a fake clock (no processes)."""

from __future__ import annotations

from cuzkd.states import State, StopReason
from cuzkd.supervisor.core.backoff import Backoff
from cuzkd.supervisor.core.lifecycle import (
    Action,
    CancelScheduledStart,
    Lifecycle,
    Policy,
    ScheduleStart,
    Spawn,
    Stop,
)


def machine(restart: str = "always") -> Lifecycle:
    return Lifecycle(Policy(restart=restart, start_timeout=10.0, unhealthy_after=5.0),
                     Backoff(initial=1.0, maximum=8.0, multiplier=2.0, reset_after=60.0,
                             rand=lambda: 0.0))


def running(m: Lifecycle, pid: int = 100, now: float = 0.0) -> Lifecycle:
    assert m.start_requested(now) == [Spawn()]
    m.spawned(pid, now)
    m.poll(now + 0.1, ok=True)
    assert m.state is State.RUNNING
    return m


def test_start_spawn_and_first_answer_make_it_running() -> None:
    m = machine()
    assert m.state is State.STOPPED
    assert m.start_requested(0.0) == [Spawn()]
    m.spawned(42, 0.0)
    assert (m.state, m.pid) == (State.STARTING, 42)
    assert m.poll(0.5, ok=False) == []
    assert m.poll(1.0, ok=True) == []
    assert m.state is State.RUNNING
    assert m.restarts == 0


def test_crash_loop_backs_off_with_growing_delays() -> None:
    m = machine()
    m.start_requested(0.0)
    m.spawned(1, 0.0)
    now, delays = 0.0, []
    for pid in range(2, 8):
        now += 0.05
        actions = m.exited("exit_1", clean=False, now=now)
        if actions == [Spawn()]:
            delays.append(0.0)
        else:
            assert m.state is State.BACKOFF
            [sched] = actions
            assert isinstance(sched, ScheduleStart)
            delays.append(sched.delay)
            assert m.next_start_at == now + sched.delay
            now += sched.delay
            assert m.backoff_elapsed(now) == [Spawn()]
        m.spawned(pid, now)
    assert delays == [0.0, 1.0, 2.0, 4.0, 8.0, 8.0]
    assert m.exits["exit_1"] == 6
    assert m.restarts == 6
    assert m.last_exit_cause == "exit_1"


def test_exit_after_healthy_run_restarts_at_once() -> None:
    m = running(machine())
    for _ in range(3):  # build up some backoff first
        m.exited("exit_1", clean=False, now=1.0)
        m.backoff_elapsed(2.0)
        m.spawned(7, 2.0)
    m.poll(2.0, ok=True)
    assert m.exited("signal_SIGKILL", clean=False, now=2.0 + 61.0) == [Spawn()]
    assert m.exits["signal_SIGKILL"] == 1


def test_silent_status_while_running_kills_and_counts_unhealthy() -> None:
    m = running(machine(), now=0.0)
    m.poll(1.0, ok=True)
    assert m.poll(5.9, ok=False) == []
    assert m.poll(6.0, ok=False) == [Stop(reason=StopReason.UNHEALTHY)]
    assert m.state is State.STOPPING
    actions = m.exited("signal_SIGTERM", clean=False, now=6.1)
    assert m.exits == {"unhealthy": 1}
    assert m.last_exit_cause == "unhealthy"
    assert actions in ([Spawn()], [ScheduleStart(1.0)])


def test_a_document_too_large_to_take_is_reported_but_the_engine_is_not_unhealthy() -> None:
    """A cuzk keeps failed jobs in /status for good, so its document can grow past what cuzkd
    reads while the engine serves on: an answer, reported as the engine's last error, never a
    kill; a usable document clears the error."""
    m = running(machine(), now=0.0)
    too_large = "status document larger than 16777216 bytes"
    for at in (1.0, 6.0, 60.0):
        assert m.poll(at, ok=False, error=too_large, answered=True) == []
    assert m.state is State.RUNNING and m.last_error == too_large
    m.poll(61.0, ok=True)
    assert m.last_error is None
    fresh = machine()
    fresh.start_requested(0.0)
    fresh.spawned(5, 0.0)
    fresh.poll(1.0, ok=False, error=too_large, answered=True)  # its first answer
    assert fresh.state is State.RUNNING


def test_never_answering_is_killed_after_start_timeout() -> None:
    m = machine()
    m.start_requested(0.0)
    m.spawned(5, 0.0)
    assert m.poll(9.9, ok=False) == []
    assert m.poll(10.0, ok=False) == [Stop(reason=StopReason.START_TIMEOUT)]
    m.exited("signal_SIGKILL", clean=False, now=10.5)
    assert m.exits == {"start_timeout": 1}


def test_status_errors_are_kept_named_in_the_kill_and_cleared_by_an_answer() -> None:
    m = machine()
    m.start_requested(0.0)
    m.spawned(5, 0.0)
    m.poll(1.0, ok=False, error="HTTP 500 Internal Server Error")
    assert m.last_error == "HTTP 500 Internal Server Error"
    assert m.poll(10.0, ok=False, error="no answer from unix:/s within 1s") == [
        Stop(reason=StopReason.START_TIMEOUT)]
    assert m.take_transitions()[-1].reason == (
        "status did not answer within start_timeout (last error: no answer from unix:/s "
        "within 1s)")
    m.exited("signal_SIGTERM", clean=False, now=10.1)
    assert m.last_error == "no answer from unix:/s within 1s"  # still says why in backoff
    m.backoff_elapsed(11.0)
    m.spawned(6, 11.0)
    m.poll(11.2, ok=False, error="cannot connect to unix:/s: Connection refused")
    assert m.last_error == "cannot connect to unix:/s: Connection refused"
    m.poll(11.5, ok=True)
    assert m.last_error is None
    m.poll(12.0, ok=False, error="invalid status document: JSON is malformed")
    assert m.poll(16.5, ok=False) == [Stop(reason=StopReason.UNHEALTHY)]
    assert m.take_transitions()[-1].reason == (
        "status silent for unhealthy_after (last error: invalid status document: JSON is "
        "malformed)")


def test_stop_request_stops_without_restart() -> None:
    m = running(machine())
    assert m.stop_requested(1.0) == [Stop(drain=True)]
    assert m.exited("signal_SIGTERM", clean=False, now=1.1) == []
    assert m.state is State.STOPPED
    assert m.poll(2.0, ok=False) == []


def test_stop_during_backoff_cancels_the_timer() -> None:
    m = running(machine())
    m.exited("exit_1", clean=False, now=1.0)  # immediate (first failure)
    m.spawned(9, 1.0)
    assert isinstance(m.exited("exit_1", clean=False, now=1.1)[0], ScheduleStart)
    assert m.stop_requested(1.2) == [CancelScheduledStart()]
    assert m.state is State.STOPPED
    assert m.next_start_at is None
    assert m.backoff_elapsed(3.0) == []


def test_restart_request_respawns_immediately_after_exit() -> None:
    m = running(machine())
    assert m.restart_requested(1.0) == [Stop(drain=True)]
    assert m.exited("signal_SIGTERM", clean=False, now=1.2) == [Spawn()]
    m.spawned(200, 1.2)
    assert m.restarts == 1


def test_start_while_in_backoff_spawns_now() -> None:
    m = running(machine())
    m.exited("exit_1", clean=False, now=1.0)
    m.spawned(9, 1.0)
    m.exited("exit_1", clean=False, now=1.1)
    assert m.start_requested(1.2) == [CancelScheduledStart(), Spawn()]


def test_restart_policies() -> None:
    never = running(machine("never"))
    assert never.exited("exit_0", clean=True, now=1.0) == []
    assert never.state is State.STOPPED
    never2 = running(machine("never"))
    never2.exited("exit_3", clean=False, now=1.0)
    assert never2.state is State.FAILED
    on_failure = running(machine("on-failure"))
    assert on_failure.exited("exit_0", clean=True, now=1.0) == []
    assert on_failure.state is State.STOPPED
    on_failure2 = running(machine("on-failure"))
    assert on_failure2.exited("exit_2", clean=False, now=1.0) == [Spawn()]


def test_spawn_failure_is_failed_with_the_error() -> None:
    m = machine()
    m.start_requested(0.0)
    m.spawn_failed("no such file", 0.0)
    assert m.state is State.FAILED
    assert m.last_error == "no such file"
    assert m.start_requested(1.0) == [Spawn()]


def test_transient_spawn_failure_backs_off_and_retries() -> None:
    m = machine()
    assert m.start_requested(0.0) == [Spawn()]
    assert m.spawn_failed("Too many open files", 0.0, transient=True) == [Spawn()]  # at once
    assert m.spawn_failed("Too many open files", 0.0, transient=True) == [ScheduleStart(1.0)]
    assert m.state is State.BACKOFF
    assert m.last_error == "Too many open files"
    assert m.backoff_elapsed(1.0) == [Spawn()]
    assert m.spawn_failed("Too many open files", 1.0, transient=True) == [ScheduleStart(2.0)]
    m.spawned(200, 3.0)
    assert m.state is State.STARTING
    assert m.last_error is None


def test_every_change_is_reported_once() -> None:
    m = running(machine())
    taken = m.take_transitions()
    assert [(str(t.old), str(t.new)) for t in taken] == [("stopped", "starting"),
                                                         ("starting", "running")]
    assert m.take_transitions() == []


def test_settled_makes_a_process_only_engine_running_and_counts_as_healthy() -> None:
    m = machine()
    m.start_requested(0.0)
    m.spawned(7, 0.0)
    m.settled(1.0)
    assert m.state is State.RUNNING
    # Healthy since it settled: an exit after backoff's reset_after restarts at once.
    assert m.exited("exit_1", False, 100.0) == [Spawn()]
    m.spawned(8, 100.0)
    assert m.exited("exit_1", False, 100.5) == [ScheduleStart(1.0)]  # not settled: backs off
    m.settled(200.0)  # too late: no process is starting
    assert m.state is State.BACKOFF


def test_a_stall_kills_at_once_and_respawns_counting_stalled() -> None:
    m = running(machine(restart="never"))
    assert m.stalled(1.0) == [Stop(kill=True, why="stalled", reason=StopReason.STALL)]
    assert m.state is State.STOPPING
    assert m.exited("signal_SIGKILL", clean=False, now=1.1) == [Spawn()]
    assert (m.exits, m.last_exit_cause) == ({"stalled": 1}, "stalled")


def test_a_stall_outside_running_does_nothing() -> None:
    m = machine()
    assert m.stalled(0.0) == []
    m.start_requested(0.0)
    m.spawned(1, 0.0)
    assert m.stalled(0.5) == []  # starting: the start_timeout rule owns it


def test_intent_causes_stopped_and_swap_override_the_process_cause() -> None:
    m = running(machine())
    assert m.restart_requested(1.0, swap=True) == [Stop(drain=True, reason=StopReason.SWAP)]
    assert m.exited("signal_SIGTERM", clean=False, now=1.1) == [Spawn()]
    m.spawned(2, 1.2)
    m.poll(1.3, ok=True)
    assert m.restart_requested(2.0) == [Stop(drain=True)]
    assert m.exited("exit_0", clean=True, now=2.1) == [Spawn()]
    m.spawned(3, 2.2)
    m.poll(2.3, ok=True)
    assert m.stop_requested(3.0) == [Stop(drain=True)]
    assert m.exited("signal_SIGKILL", clean=False, now=3.1) == []
    assert m.exits == {"swap": 1, "stopped": 2}


def test_process_causes_count_as_given_without_intent() -> None:
    m = running(machine())
    m.exited("oom_killed", clean=False, now=1.0)
    assert m.last_exit_cause == "oom_killed"


def test_a_requested_stop_drains_only_an_engine_that_answered() -> None:
    m = machine()
    m.start_requested(0.0)
    m.spawned(1, 0.0)
    assert m.stop_requested(0.5) == [Stop(drain=False)]  # starting: no work to let end
    m.exited("signal_SIGTERM", clean=False, now=0.6)
    m.start_requested(1.0)
    m.spawned(2, 1.0)
    m.poll(1.1, ok=True)
    assert m.restart_requested(2.0) == [Stop(drain=True)]


def test_a_spawn_abandoned_while_waiting_for_gpus_leaves_it_stopped() -> None:
    m = running(machine())
    assert m.exited("exit_1", clean=False, now=100.0) == [Spawn()]  # healthy long: at once
    m.spawn_abandoned(100.5)  # the runner's gate was waiting; a stop came
    assert (m.state, m.pid) == (State.STOPPED, None)
    assert m.stop_requested(100.6) == []
    assert m.start_requested(101.0) == [Spawn()]


def test_every_event_returns_a_list_of_actions_for_the_shell_to_carry_out() -> None:
    """The runner handles each event alike (``_apply(m.event(...))``): the events that never
    ask for anything answer an empty list, never None."""
    m = machine()
    assert m.start_requested(0.0) == [Spawn()]
    assert m.spawn_waiting("waiting for GPU memory") == []
    assert m.spawned(1, 0.0) == []
    assert m.settled(0.5) == []  # a process-only engine alive through its settle time
    assert m.state is State.RUNNING
    assert m.stalled(1.0) == [Stop(kill=True, why="stalled", reason=StopReason.STALL)]
    assert m.exited("signal_SIGKILL", False, 1.1) == [Spawn()]  # the first restart: at once
    assert m.backoff_elapsed(2.1) == []  # not in backoff
    assert m.spawn_waiting("waiting for the previous process's leftovers to stop") == []
    assert m.spawn_abandoned(2.2) == []
    assert m.state is State.STOPPED


def test_failed_polls_before_the_first_answer_within_start_timeout_are_the_start() -> None:
    """in_start: no answer yet and start_timeout (10 s) not over, or the spawn still waits
    (nothing exists to answer a scrape); not stopped, not running, not once the start ran
    out."""
    m = machine()
    assert not m.in_start(0.0)  # stopped: nobody means it to answer
    m.start_requested(0.0)
    m.spawn_waiting("waiting for GPU memory")
    assert m.in_start(500.0)  # the gate's wait has its own bound (gpu_release_timeout)
    m.spawned(1, 1.0)
    assert m.in_start(1.0) and m.in_start(10.99)
    assert not m.in_start(11.0)  # start_timeout over: a failure now is a failure
    m.poll(3.0, ok=False, error="cannot connect")
    assert m.last_error == "cannot connect"  # still named (a start_timeout kill says it)
    m.poll(3.5, ok=True)
    assert m.state is State.RUNNING and not m.in_start(4.0)


def test_the_first_answer_time_is_kept_until_the_next_process_answers() -> None:
    m = machine()
    assert m.first_answer_seconds is None
    m.start_requested(0.0)
    m.spawned(1, 2.0)
    m.poll(14.5, ok=True)
    assert m.first_answer_seconds == 12.5
    m.poll(20.0, ok=True)  # later answers change nothing
    assert m.first_answer_seconds == 12.5
    assert m.exited("exit_1", clean=False, now=30.0) == [Spawn()]  # the first crash: at once
    m.spawned(2, 31.0)
    assert m.first_answer_seconds == 12.5  # the new process has not answered yet
    m.poll(33.0, ok=True)
    assert m.first_answer_seconds == 2.0


def test_what_an_exit_said_it_died_of_is_the_last_error_until_a_spawn() -> None:
    """exit_explained comes a moment after the exit (its stderr read to the end): it is the
    last error while no process replaced the one that exited, and dropped once one did."""
    m = machine("never")
    m.start_requested(0.0)
    m.spawned(1, 0.0)
    assert m.exited("panic", clean=False, now=0.5) == []
    assert m.exit_explained("thread 'main' panicked at src/main.rs:1:1: boom") == []
    assert (m.state, m.last_error) == (
        State.FAILED, "thread 'main' panicked at src/main.rs:1:1: boom")
    m.start_requested(1.5)
    m.spawned(2, 1.5)
    assert m.last_error is None
    m.exit_explained("too late: another process runs")
    assert m.last_error is None

    healthy = running(machine())
    assert healthy.exited("panic", clean=False, now=100.0) == [Spawn()]  # at once
    healthy.spawned(101, 100.0)
    healthy.exit_explained("thread 'main' panicked at src/main.rs:1:1: boom")
    assert healthy.last_error is None  # the new process's errors are the current ones

    failed = running(machine())
    failed.exited("error", clean=False, now=100.0)
    failed.spawn_failed("No such file or directory", 100.0)
    failed.exit_explained("Error: failed to load config")
    assert failed.last_error == "No such file or directory"  # the spawn failed after it


def reason_and_bound(actions: list[Action]) -> tuple[StopReason, float | None]:
    [stop] = actions
    assert isinstance(stop, Stop)
    return stop.reason, stop.within


def test_a_stop_carries_the_reason_and_the_bound_it_was_requested_with() -> None:
    assert reason_and_bound(running(machine()).stop_requested(1.0)) == (StopReason.OPERATOR,
                                                                        None)
    assert reason_and_bound(running(machine()).stop_requested(
        1.0, StopReason.SHUTDOWN, within=30.0)) == (StopReason.SHUTDOWN, 30.0)
    assert reason_and_bound(running(machine()).stop_requested(1.0, StopReason.RELOAD)) == (
        StopReason.RELOAD, None)


def test_a_restart_stops_for_the_operator_or_the_swap() -> None:
    assert reason_and_bound(running(machine()).restart_requested(1.0)) == (StopReason.OPERATOR,
                                                                           None)
    assert reason_and_bound(running(machine()).restart_requested(1.0, swap=True)) == (
        StopReason.SWAP, None)


def test_the_lifecycles_own_stops_name_their_reason() -> None:
    assert reason_and_bound(running(machine()).stalled(1.0)) == (StopReason.STALL, None)
    assert reason_and_bound(running(machine()).answers_broken(1.0, "not cuzk's")) == (
        StopReason.UNHEALTHY, None)
    m = running(machine())
    assert reason_and_bound(m.poll(6.0, ok=False)) == (StopReason.UNHEALTHY, None)
    m = machine()
    m.start_requested(0.0)
    m.spawned(1, 0.0)
    assert reason_and_bound(m.poll(10.0, ok=False)) == (StopReason.START_TIMEOUT, None)


def test_a_shutdown_during_a_restart_leaves_it_stopped() -> None:
    m = running(machine())
    m.restart_requested(1.0)
    assert m.stop_requested(1.5, StopReason.SHUTDOWN, within=30.0) == []  # already stopping
    assert m.exited("signal_SIGTERM", clean=False, now=2.0) == []
    assert (m.state, m.last_exit_cause) == (State.STOPPED, "stopped")


# -- cuzkd upgrade ---------------------------------------------------------------------------


def _handed_over(m: Lifecycle, now: float) -> tuple[Lifecycle, list[Action]]:
    fresh = machine()
    return fresh, fresh.adopt(m.handover(), now)


def test_a_running_engine_carries_on_where_it_was() -> None:
    m = running(machine(), pid=7, now=0.0)
    m.stop_requested(1.0)
    m.exited("signal_SIGTERM", False, 2.0)
    m.start_requested(3.0)
    m.spawned(8, 3.0)
    m.poll(3.5, ok=True)
    new, actions = _handed_over(m, 10.0)
    assert actions == []
    assert new.handover() == m.handover()
    assert (new.state, new.pid, new.restarts, dict(new.exits)) == (
        State.RUNNING, 8, 1, {"stopped": 1})
    # its deadlines run on: silent from 3.5 on, it is unhealthy 5 s later, not 5 s after 10
    assert new.poll(8.6, ok=False) == [Stop(reason=StopReason.UNHEALTHY)]


def test_a_backoff_goes_on_for_what_is_left_of_it_and_counts_failures_on() -> None:
    m = running(machine(), now=0.0)
    m.exited("exit_1", False, 1.0)  # healthy for 0.9 s: the first failure restarts at once
    m.spawned(101, 1.0)
    assert m.exited("exit_1", False, 1.5) == [ScheduleStart(1.0)]
    new, actions = _handed_over(m, 2.0)
    assert actions == [ScheduleStart(0.5)]
    assert new.state is State.BACKOFF and new.backoff.failures == 2
    assert new.backoff_elapsed(2.5) == [Spawn()]
    new.spawned(102, 2.5)
    assert new.exited("exit_1", False, 3.0) == [ScheduleStart(2.0)]  # doubled, not reset


def test_a_backoff_that_ran_out_during_the_exec_restarts_at_once() -> None:
    m = running(machine(), now=0.0)
    m.exited("exit_1", False, 1.0)
    m.spawned(101, 1.0)
    m.exited("exit_1", False, 1.5)
    _, actions = _handed_over(m, 9.0)
    assert actions == [ScheduleStart(0.0)]
