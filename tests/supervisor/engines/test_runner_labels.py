"""An engine's label budgets in the runner: set by its config, shared by the deriver and the
exporter, freed when a new process starts. In-process on virtual time (see
test_runner_virtual.py), the status served by a real socket."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from support.piece_server import PieceServer
from support.virtual_clock import run_virtual
from support.virtual_engines import Script, StandInEngines, config_of, exited, in_state

from cuzkd.metrics.http import render
from cuzkd.metrics.sample import EngineSample, SupervisorSample
from cuzkd.states import State
from cuzkd.supervisor.engines.runclock import RunClock
from cuzkd.supervisor.engines.runner import EngineRunner


def plain_document(prefix: str, uptime: float) -> bytes:
    """cuzk's plain document listing one job of each of 20 kinds named ``prefix-N``."""
    figures = {"total_bytes": 0, "used_bytes": 0, "available_bytes": 0}
    jobs = [{"job_id": f"{prefix}-job-{i}", "proof_kind": f"{prefix}-{i:02d}",
             "started_secs_ago": 1.0, "total_partitions": 1, "partitions_done": 0,
             "partitions": [{"index": 0, "state": "synthesizing", "synth_ms": None,
                             "gpu_ms": None}]} for i in range(20)]
    return json.dumps({
        "uptime_secs": uptime, "memory": figures,
        "synthesis": {"max_concurrent": 1, "active": 1}, "pipelines": jobs, "gpu_workers": [],
        "allocations": {"srs": [], "pce": []},
        "counters": {"total_completed": 0, "total_failed": 0, "completed_by_kind": {},
                     "failed_by_kind": {}, "queue_depth": 0},
        "buffers": dict.fromkeys(("synth_in_flight", "provers_in_flight", "aux_in_flight",
                                  "shells_in_flight", "pending_handles"), 0),
    }).encode()


def kinds_in(text: str) -> set[str]:
    return {line.split('proof_kind="')[1].split('"')[0] for line in text.splitlines()
            if line.startswith("cuzk_partition_phase_transitions_total{")}


def render_one(sample: EngineSample) -> str:
    return render(SupervisorSample(engines=[sample], zombies_reaped_total=0), accept="",
                  accept_encoding="").body.decode()


def test_a_new_process_of_the_engine_gets_the_slots_afresh(tmp_path: Path) -> None:
    async def main() -> tuple[str, str, str]:
        server = PieceServer(plain_document("old", 1000.0))
        address = await server.start_unix(tmp_path / "status.sock")
        engines = StandInEngines(Script(runs_for=30, status=exited(1)), Script())
        config = config_of(tmp_path, {"name": "e", "status_url": address, "drain": "none",
                                      "max_proof_kinds": 3, "restart": "always"})
        runner = EngineRunner(config.engine[0], config, children=engines.table,
                              binary_resolver=lambda: "unused", on_change=lambda: None,
                              clock=RunClock(asyncio.get_running_loop().time))
        runner.start()
        await in_state(runner, State.RUNNING)
        first = render_one(await runner.sample(0))
        dropped = render_one(await runner.sample(0))
        server.body = plain_document("new", 5.0)  # the next process names other kinds
        await engines.next_spawn()
        await in_state(runner, State.RUNNING)
        second = render_one(await runner.sample(0))
        await runner.stop()
        await runner.close()
        await server.close()
        return first, dropped, second

    first, again, second = run_virtual(main)
    assert kinds_in(first) == {"old-00", "old-01", "old-02"}
    assert 'cuzkd_label_values_dropped_total{engine="e",label="proof_kind"} 17.0' in first
    assert 'cuzkd_label_values_dropped_total{engine="e",label="proof_kind"} 34.0' in again
    assert kinds_in(second) == {"new-00", "new-01", "new-02"}
    assert 'cuzkd_label_values_dropped_total{engine="e",label="proof_kind"} 51.0' in second
