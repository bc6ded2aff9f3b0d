"""When ``cuzkd upgrade`` may begin: only in ``running``, with no swap, no stop sequence, no
spawn waiting at its gate and no leftovers being stopped; each refusal names what to wait for."""

from __future__ import annotations

import pytest

from cuzkd.states import Phase, State
from cuzkd.supervisor.core.upgradegate import EngineMoment, upgrade_refusal

CALM = [EngineMoment("a", State.RUNNING), EngineMoment("b", State.BACKOFF),
        EngineMoment("c", State.STOPPED), EngineMoment("d", State.FAILED),
        EngineMoment("e", State.STARTING)]


def test_running_engines_at_rest_or_in_backoff_may_be_handed_over() -> None:
    assert upgrade_refusal(Phase.RUNNING, swapping=False, engines=CALM) is None
    assert upgrade_refusal(Phase.RUNNING, swapping=False, engines=[]) is None


@pytest.mark.parametrize(("phase", "why"), [
    (Phase.STARTING, "still starting"), (Phase.RELOADING, "config reload"),
    (Phase.STOPPING, "stopping"), (Phase.UPGRADING, "already under way")])
def test_any_other_phase_refuses(phase: Phase, why: str) -> None:
    refusal = upgrade_refusal(phase, swapping=False, engines=CALM)
    assert refusal is not None and why in refusal


def test_a_swap_refuses() -> None:
    assert upgrade_refusal(Phase.RUNNING, swapping=True, engines=CALM) == \
        "a binary swap is under way"


@pytest.mark.parametrize(("moment", "why"), [
    (EngineMoment("x", State.STOPPING), "engine x is stopping"),
    (EngineMoment("x", State.STARTING, spawn_waiting=True), "engine x waits to spawn"),
    (EngineMoment("x", State.BACKOFF, sweeping=True),
     "leftovers of engine x are being stopped")])
def test_an_engine_in_the_middle_of_a_step_refuses_naming_it(moment: EngineMoment,
                                                             why: str) -> None:
    assert upgrade_refusal(Phase.RUNNING, swapping=False, engines=[*CALM, moment]) == why
