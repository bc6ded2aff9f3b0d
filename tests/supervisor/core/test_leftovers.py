"""The leftover rule with plain facts: what a wrapper left after the stop signal reached its
group finishes within stop_timeout; any other exit's group is SIGKILLed at once."""

from __future__ import annotations

import pytest

from cuzkd.supervisor.core.leftovers import LeftoverStop, leftover_stop


def test_leftovers_of_a_wrapper_the_stop_signal_reached_get_to_finish() -> None:
    assert leftover_stop(stop_signalled=True, supervisor_killed=False,
                         leftovers=True) is LeftoverStop.FINISH


@pytest.mark.parametrize(("signalled", "killed", "leftovers"), [
    (False, False, True),  # a crash: its helpers would hold the GPU from its replacement
    (True, True, True),  # SIGKILLed: nothing is finishing
    (True, False, False),  # nothing left but (maybe) its group
    (False, False, False),
])
def test_any_other_exits_group_is_killed_at_once(signalled: bool, killed: bool,
                                                  leftovers: bool) -> None:
    assert leftover_stop(stop_signalled=signalled, supervisor_killed=killed,
                         leftovers=leftovers) is LeftoverStop.KILL_GROUP
