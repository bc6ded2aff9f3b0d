"""Run jobs through the reference engine's pipeline with a given budget; print peak RSS growth.

    python engine_rss_child.py BUDGET_BYTES SIZE_LOG2 PARTITIONS

Prints one JSON line: ``baseline`` (resident bytes once everything is imported and the engine
built), ``peak`` (``ru_maxrss`` at the end, bytes), ``idle`` (resident bytes once the job is
done, the engine still up), ``used_after`` and ``pinned`` (the
budget's view once the job is done) and the job's ``state``. Run as its own process so the
peak belongs to the engine alone.
"""

from __future__ import annotations

import asyncio
import json
import os
import resource
import sys
import time

from cuzkd.bundled import prover
from cuzkd.bundled.backend import select_backend
from cuzkd.bundled.budget import MemoryBudget
from cuzkd.bundled.heap import return_large_frees
from cuzkd.bundled.pipeline import Engine
from cuzkd.bundled.settings import ProverConfig
from cuzkd.status.tracker import StatusTracker


def resident_bytes() -> int:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


async def main(budget_bytes: int, log_n: int, partitions: int) -> dict[str, object]:
    return_large_frees()  # as `cuzkd engine` does at start
    config = ProverConfig(memory_budget_bytes=budget_bytes, workers_per_gpu=2,
                          synthesis_threads=2, backend="numpy")
    budget = MemoryBudget(budget_bytes, nominal_request=sum(prover.partition_bytes(log_n)))
    engine = Engine(config, select_backend("numpy"), StatusTracker(budget=budget), budget)
    await engine.start()
    baseline = resident_bytes()
    try:
        job = engine.submit("porep-c2", partitions, log_n)
        deadline = time.monotonic() + 240
        while job.finished_at is None:
            assert time.monotonic() < deadline, "the job did not finish"
            await asyncio.sleep(0.01)  # polled: the engine has no completion event to await
        idle = resident_bytes()
    finally:
        await engine.close()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # ru_maxrss is in KiB
    return {"baseline": baseline, "peak": peak, "idle": idle,
            "used_after": budget.used_bytes(), "pinned": budget.pinned_bytes(),
            "state": job.state, "error": job.error}


if __name__ == "__main__":
    budget_arg, log_n_arg, partitions_arg = (int(a) for a in sys.argv[1:4])
    print(json.dumps(asyncio.run(main(budget_arg, log_n_arg, partitions_arg))))
