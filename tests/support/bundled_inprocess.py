"""The bundled engine built in-process on NumPy, for tests of its pipeline and its HTTP API."""

from __future__ import annotations

from cuzkd.bundled import prover
from cuzkd.bundled.backend import select_backend
from cuzkd.bundled.budget import MemoryBudget
from cuzkd.bundled.pipeline import Engine
from cuzkd.bundled.settings import ProverConfig, Sizes
from cuzkd.status.tracker import StatusTracker

K = 10  # partition size used throughout: fast on 2 cores


def make_engine(budget_bytes: int, nominal_log2: int = K, sizes: Sizes | None = None) -> Engine:
    """An engine with two GPU workers and two synthesis threads; ``close()`` it when done.
    ``sizes``: each kind's default partition size (the engine's defaults when None)."""
    config = ProverConfig(memory_budget_bytes=budget_bytes, workers_per_gpu=2,
                          synthesis_threads=2, backend="numpy", sizes=sizes or Sizes())
    budget = MemoryBudget(budget_bytes,
                          nominal_request=sum(prover.partition_bytes(nominal_log2)))
    return Engine(config, select_backend("numpy"), StatusTracker(budget=budget), budget)
