"""One engine read for the outside: its :class:`EngineInfo` and its scrape's sample.

Both gather what the engine's parts keep (lifecycle, status source, stall watch, stop counts,
descendant watch, output budget, telemetry) into one value. Separate from the runner because
reading an engine changes nothing of it, and the samples' thirty fields would bury what the
runner does.
"""

from __future__ import annotations

import time

from structlog.typing import FilteringBoundLogger

from cuzkd.config import EngineConfig
from cuzkd.errortext import error_text
from cuzkd.labelbudget import LabelBudgets
from cuzkd.log.ratelimit import LimitedLog
from cuzkd.metrics.sample import EngineSample
from cuzkd.states import ALIVE, State
from cuzkd.supervisor.core.lifecycle import Lifecycle
from cuzkd.supervisor.core.outputbudget import OutputBudget
from cuzkd.supervisor.engines.healthwatch import HealthWatch
from cuzkd.supervisor.engines.info import MAX_STALE_JOBS_SHOWN, EngineInfo
from cuzkd.supervisor.engines.runclock import RunClock
from cuzkd.supervisor.engines.spawner import EngineSpawner
from cuzkd.supervisor.engines.spawnrecord import SpawnRecord
from cuzkd.supervisor.engines.stopper import EngineStopper
from cuzkd.supervisor.engines.telemetry import GrpcTelemetry
from cuzkd.supervisor.proc.descendants import DescendantWatch
from cuzkd.supervisor.proc.tree import tree_usage


class EngineReadings:
    """Reads one engine from its parts; owns nothing of it."""

    def __init__(self, spec: EngineConfig, lifecycle: Lifecycle, clock: RunClock, *,
                 health: HealthWatch, stopper: EngineStopper, spawner: EngineSpawner,
                 descendants: DescendantWatch, output_budget: OutputBudget,
                 labels: LabelBudgets, telemetry: GrpcTelemetry | None,
                 log: FilteringBoundLogger, limited: LimitedLog) -> None:
        self._spec = spec
        self._lifecycle = lifecycle
        self._clock = clock
        self._health = health
        self._stopper = stopper
        self._spawner = spawner
        self._descendants = descendants
        self._output_budget = output_budget
        self._labels = labels
        self._telemetry = telemetry
        self._log = log
        self._limited = limited

    def entry(self, process: SpawnRecord | None, release: str | None) -> EngineInfo:
        """The engine for the control API, ``/status`` and the CLI; ``process``: the one
        running (None: none); ``release``: the one it executes."""
        m, source, stall = self._lifecycle, self._health.status_source, self._health.stall
        stale, phantom = source.failed_work() if source is not None else ([], [])
        return EngineInfo(
            name=self._spec.name,
            state=m.state,
            pid=m.pid,
            started_at=process.started_at if process is not None else None,
            restarts=m.restarts,
            last_exit_cause=m.last_exit_cause,
            exits=dict(m.exits),
            next_restart_at=(_wall(m.next_start_at, self._clock.now())
                             if m.state is State.BACKOFF else None),
            last_error=m.last_error,
            waiting_for_gpu=self._spawner.waiting_for_gpu,
            stalled=stall.stalled,
            stalls_total=stall.stalls_total,
            last_exit_stderr=list(self._spawner.stderr.last_exit),
            status_address=source.address if source is not None else None,
            command=list(self._spawner.argv),
            release=release,
            # the last decoded document's values that did not decode (a healthy engine)
            status_field_errors=source.field_errors if source is not None else None,
            stale_jobs=sorted(stale, key=lambda job: -job.age_secs)[:MAX_STALE_JOBS_SHOWN],
            phantom_busy_workers=phantom,
        )

    async def sample(self, process: SpawnRecord | None, max_age: float) -> EngineSample:
        """The engine for a scrape. Whatever goes wrong reading its document or its process
        tree costs only those figures (status absent, so ``cuzkd_engine_up`` 0), logged: one
        engine never fails the scrape of every other."""
        m, health, stopper = self._lifecycle, self._health, self._stopper
        source, telemetry = health.status_source, self._telemetry
        doc, ext, rss, cpu = None, None, None, None
        try:
            if m.state in ALIVE and source is not None:
                doc = await source.fetch(max_age)
                ext = source.extensions() if doc is not None else None
            if m.pid is not None:
                rss, cpu = tree_usage(m.pid)
        except Exception as exc:  # this engine's figures only; the scrape goes on
            doc = ext = None
            self._limited.log(self._log, "error", "engine_sample_failed",
                              key=type(exc).__name__, error=error_text(exc), exc_info=exc)
        return EngineSample(
            name=self._spec.name,
            state=str(m.state),
            restarts_total=m.restarts,
            exits_total=dict(m.exits),
            start_time_seconds=process.started_at if process is not None else None,
            resident_memory_bytes=rss,
            cpu_seconds_total=cpu,
            status=doc,
            extensions=ext,
            fetch_duration_seconds=source.last_fetch_duration_seconds if source else None,
            fetch_errors_total=source.fetch_errors_total if source else 0,
            first_answer_seconds=m.first_answer_seconds if source else None,
            status_field_errors_total=dict(source.field_errors_total) if source else {},
            status_polled=source is not None,
            descendants_killed_total=self._descendants.killed,
            stalls_total=health.stall.stalls_total,
            stalled=health.stall.stalled,
            stop_inflight_partitions_total=dict(stopper.stop_inflight),
            jobs_lost_total=dict(stopper.jobs_lost),
            drains_total=dict(stopper.drains),
            health_loop_failures_total=health.health_loop_failures,
            max_parallel_synthesis=(None if self._spec.cuzk_file is None
                                    else self._spec.cuzk_file.pipeline.max_parallel_synthesis),
            output_dropped_lines_total=self._output_budget.dropped_lines_total,
            output_dropped_bytes_total=self._output_budget.dropped_bytes_total,
            labels=self._labels,
            # a stopping engine's last answer is not what it holds now
            grpc=(telemetry.latest if telemetry is not None
                  and m.state is State.RUNNING else None),
            grpc_polled=telemetry is not None,
            grpc_errors_total=dict(telemetry.errors_total) if telemetry is not None else {},
        )


def _wall(at: float | None, now: float) -> float | None:
    """Unix time of a monotonic instant."""
    return None if at is None else time.time() + (at - now)
