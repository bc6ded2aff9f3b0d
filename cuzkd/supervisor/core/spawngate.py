"""The spawn gate: does a spawn the lifecycle asks for run now, or wait, and for what.

A replacement spawned while the previous process's leftovers still hold its port or GPU memory
would fail and count as a crash, so it waits for them to be stopped; an engine pinned to GPUs
also waits for their memory (:mod:`.gpugate`). Pure: the facts in, the decision out; the
waiting is the engine's spawner's (:mod:`cuzkd.supervisor.engines.spawner`).
"""

from __future__ import annotations

import enum


class SpawnGate(enum.Enum):
    """What a spawn asked for does; a waiting one's value is its ``starting`` transition's
    reason."""

    #: spawn at once
    OPEN = "open"
    #: a spawn already waits: it is the one asked for
    WAITING_ALREADY = "waiting already"
    LEFTOVERS = "waiting for the previous process's leftovers to stop"
    GPU_MEMORY = "waiting for GPU memory"


def spawn_gate(*, waiting: bool, leftovers_stopping: bool, gpu_gated: bool) -> SpawnGate:
    """The gate for a spawn asked for now. ``waiting``: a spawn already waits;
    ``leftovers_stopping``: leftovers of an exited process are being stopped; ``gpu_gated``:
    the engine waits for GPU memory before each spawn. Leftovers are waited for first: the GPU
    memory they hold is only read once they are gone."""
    if waiting:
        return SpawnGate.WAITING_ALREADY
    if leftovers_stopping:
        return SpawnGate.LEFTOVERS
    if gpu_gated:
        return SpawnGate.GPU_MEMORY
    return SpawnGate.OPEN
