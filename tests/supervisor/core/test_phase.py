"""The supervisor's phase: one owner, and every reader sees the same answer."""

from __future__ import annotations

from cuzkd.supervisor.core.phase import Phase, PhaseView, SupervisorPhase


def test_starting_running_reloading_and_back() -> None:
    phase = SupervisorPhase(started_at=100.0)
    assert (phase.phase, phase.stopping) == (Phase.STARTING, False)
    assert phase.begin_reload() == "still starting"  # the engines come from the file just read
    assert phase.phase is Phase.STARTING
    phase.started()
    assert phase.phase is Phase.RUNNING
    assert phase.begin_reload() is None and phase.phase is Phase.RELOADING
    assert phase.end_reload() and phase.phase is Phase.RUNNING


def test_the_reload_outcome_starts_as_the_config_read_at_start() -> None:
    phase = SupervisorPhase(started_at=100.0)
    assert (phase.reload_ok, phase.reload_success_at) == (True, 100.0)
    phase.started()
    phase.begin_reload()
    phase.reload_read(False, 150.0)  # refused: the last success stays where it was
    assert (phase.reload_ok, phase.reload_success_at) == (False, 100.0)
    phase.end_reload()
    phase.begin_reload()
    phase.reload_read(True, 200.0)
    assert (phase.reload_ok, phase.reload_success_at) == (True, 200.0)


def test_stopping_is_for_good_from_any_phase() -> None:
    """A stop during start-up is not undone when the start-up ends, nor one during a reload
    when the reload ends (no ``READY=1`` after ``STOPPING=1``)."""
    during_start = SupervisorPhase(started_at=0.0)
    during_start.stop()
    during_start.started()
    assert during_start.phase is Phase.STOPPING and during_start.stopping

    during_reload = SupervisorPhase(started_at=0.0)
    during_reload.started()
    assert during_reload.begin_reload() is None
    during_reload.stop()
    assert not during_reload.end_reload()
    assert during_reload.phase is Phase.STOPPING
    assert during_reload.begin_reload() == "stopping"
    assert during_reload.phase is Phase.STOPPING


def test_readers_get_the_read_only_half() -> None:
    """What the views, routes and engine set are handed has no way to change the phase."""
    writes = {"started", "stop", "begin_reload", "reload_read", "end_reload"}
    assert not writes & set(dir(PhaseView))
    assert writes <= set(dir(SupervisorPhase))
    assert {str(p) for p in Phase} == {"starting", "running", "reloading", "stopping",
                                       "upgrading"}


def test_an_upgrade_holds_reloads_off_and_ends_running_unless_a_stop_came() -> None:
    phase = SupervisorPhase(started_at=100.0)
    phase.begin_upgrade()  # not while starting
    assert phase.phase is Phase.STARTING
    phase.started()
    phase.begin_upgrade()
    assert phase.phase is Phase.UPGRADING
    assert phase.begin_reload() == "upgrading"
    phase.end_upgrade()
    assert phase.phase is Phase.RUNNING
    phase.begin_upgrade()
    phase.stop()
    phase.end_upgrade()
    assert phase.phase is Phase.STOPPING


def test_the_new_code_takes_the_last_reloads_outcome_over() -> None:
    phase = SupervisorPhase(started_at=500.0)
    phase.adopted(False, 120.0)
    assert (phase.reload_ok, phase.reload_success_at) == (False, 120.0)
