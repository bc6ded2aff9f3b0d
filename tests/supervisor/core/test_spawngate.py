"""The spawn gate with plain facts: a waiting spawn is the one asked for, leftovers are waited
for before GPU memory, and nothing in the way spawns at once."""

from __future__ import annotations

import pytest

from cuzkd.supervisor.core.spawngate import SpawnGate, spawn_gate


@pytest.mark.parametrize(("waiting", "leftovers", "gpu", "gate"), [
    (False, False, False, SpawnGate.OPEN),
    (False, False, True, SpawnGate.GPU_MEMORY),
    (False, True, False, SpawnGate.LEFTOVERS),
    (False, True, True, SpawnGate.LEFTOVERS),  # their GPU memory is read once they are gone
    (True, False, False, SpawnGate.WAITING_ALREADY),
    (True, True, True, SpawnGate.WAITING_ALREADY),
])
def test_the_gate_of_a_spawn(waiting: bool, leftovers: bool, gpu: bool, gate: SpawnGate) -> None:
    assert spawn_gate(waiting=waiting, leftovers_stopping=leftovers, gpu_gated=gpu) is gate


def test_a_waiting_spawn_says_what_it_waits_for() -> None:
    assert SpawnGate.LEFTOVERS.value == "waiting for the previous process's leftovers to stop"
    assert SpawnGate.GPU_MEMORY.value == "waiting for GPU memory"
