"""What a forced stop throws away, counted per job and kind in the runner, on virtual time: a
busy engine's document lists hundreds of jobs; every one is counted, and the log event names
a bounded number of them."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import structlog
from support.big_status import big_document
from support.piece_server import PieceServer
from support.virtual_clock import run_virtual
from support.virtual_engines import Script, StandInEngines, config_of, in_state

from cuzkd.states import State
from cuzkd.supervisor.engines.runclock import RunClock
from cuzkd.supervisor.engines.runner import EngineRunner
from cuzkd.supervisor.engines.stopper import LOGGED_JOB_IDS


def test_a_forced_stop_counts_every_job_and_names_a_bounded_few(tmp_path: Path) -> None:
    body = big_document(2**18)
    pipelines = json.loads(body)["pipelines"]
    by_kind: dict[str, list[str]] = {}  # the event names them kind by kind, in document order
    for pipe in pipelines:
        if {q["state"] for q in pipe["partitions"]} - {"done"}:
            by_kind.setdefault(pipe["proof_kind"], []).append(pipe["job_id"])
    in_flight = [job for jobs in by_kind.values() for job in jobs]
    assert len(in_flight) > LOGGED_JOB_IDS

    async def main() -> tuple[EngineRunner, list[dict[str, object]]]:
        server = PieceServer(body)
        address = await server.start_unix(tmp_path / "status.sock")
        config = config_of(tmp_path, {"name": "e", "status_url": address, "stall_after": "0s",
                                      "drain": "none"})
        runner = EngineRunner(config.engine[0], config, children=StandInEngines(Script()).table,
                              binary_resolver=lambda: "unused", on_change=lambda: None,
                              clock=RunClock(asyncio.get_running_loop().time))
        runner.start()
        await in_state(runner, State.RUNNING)
        with structlog.testing.capture_logs() as logs:
            await runner.stop()
        await runner.close()
        await server.close()
        return runner, logs

    runner, logs = run_virtual(main)
    assert sum(runner.jobs_lost.values()) == len(in_flight)
    [event] = [e for e in logs if e["event"] == "engine_jobs_lost"]
    assert event["job_ids"] == in_flight[:LOGGED_JOB_IDS]
    assert event["job_ids_left_out"] == len(in_flight) - LOGGED_JOB_IDS
    assert sum(event["jobs"].values()) == len(in_flight)  # type: ignore[attr-defined]
