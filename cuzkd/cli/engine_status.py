"""``cuzkd status NAME``: one engine's pipeline on a terminal, from its status document.

What operators used to script by hand against cuzk's ``/status``: every GPU worker (state,
full job id, partition, current busy time), every listed job (kind, age, partitions per
phase) and the memory budget -- and its trouble: exits by cause, stalls, and the last stderr
lines of the process that exited last. Pure rendering of a control-API engine entry (an
:class:`~cuzkd.supervisor.engines.info.EngineInfo`) plus a decoded
:class:`~cuzkd.status.document.StatusDocument`, so it reads the bundled engine and a plain
cuzk alike; job ids are printed whole, however long -- they are what an operator greps logs for.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from cuzkd.status.document import PartitionState, StatusDocument, WorkerState
from cuzkd.supervisor.engines.info import EngineInfo
from cuzkd.units import format_bytes, format_duration


def render_engine(info: EngineInfo, doc: StatusDocument | None, error: str | None,
                  now: float) -> str:
    """The whole view; ``doc`` is None when the status could not be read (``error`` says why)."""
    lines = [_headline(info, now), *_trouble_lines(info)]
    if doc is None:
        lines.append(f"status: unavailable ({error or 'engine not running'})")
    else:
        lines.append(_budget_line(doc))
        lines.append("")
        lines.extend(_workers_table(doc, frozenset(info.phantom_busy_workers)))
        lines.append("")
        lines.extend(_pipelines_table(doc))
    lines.extend(_stale_lines(info))
    lines.extend(_stderr_lines(info))
    return "\n".join(lines) + "\n"


def _trouble_lines(info: EngineInfo) -> list[str]:
    """Last exit cause with the count per cause, the stall watchdog's view, a start held by
    the GPU memory gate, the supervisor's last error for the engine (why its status or its
    spawn failed), and the values of its status document that did not decode."""
    exits = ", ".join(f"{cause} {n}" for cause, n in sorted(info.exits.items()))
    stalled = "   STALLED now" if info.stalled else ""
    gate = "   waiting for GPU memory" if info.waiting_for_gpu else ""
    error = [f"last error: {info.last_error}"] if info.last_error else []
    if info.status_field_errors:
        error.append(f"status fields {info.status_field_errors}")
    return [f"last exit {info.last_exit_cause or '-'}   exits {exits or '-'}   "
            f"stalls {info.stalls_total}{stalled}{gate}", *error]


def _stderr_lines(info: EngineInfo) -> list[str]:
    tail = info.last_exit_stderr
    if not tail:
        return []
    return ["", f"stderr of the last exited process (last {len(tail)} lines):",
            *(f"  | {line}" for line in tail)]


def _headline(info: EngineInfo, now: float) -> str:
    started = info.started_at
    up = format_duration(now - started) if started is not None else "-"
    return (f"{info.name}  {info.state}  pid {info.pid or '-'}  up {up}  "
            f"restarts {info.restarts}  status {info.status_address or '-'}")


def _budget_line(doc: StatusDocument) -> str:
    mem = doc.memory
    share = (f" ({100 * mem.used_bytes / mem.total_bytes:.0f}%)"
             if mem.total_bytes and mem.used_bytes is not None else "")
    ext = doc.cuzkd_extensions
    in_flight = f"   jobs in flight {_figure(ext.jobs_in_flight)}" if ext is not None else ""
    return (f"budget {_bytes(mem.used_bytes)} / {_bytes(mem.total_bytes)} used"
            f"{share}   synthesis {_figure(doc.synthesis.active)} / "
            f"{_figure(doc.synthesis.max_concurrent)} active"
            f"   queue {_figure(doc.counters.queue_depth)}{in_flight}")


def _figure(value: int | None) -> str:
    """A figure of the document; ``?`` for one the engine served that did not decode."""
    return "?" if value is None else str(value)


def _bytes(value: int | None) -> str:
    return "?" if value is None else format_bytes(value)


def _workers_table(doc: StatusDocument, phantom: frozenset[int]) -> list[str]:
    """A worker the supervisor found shown proving but not busy is ``phantom``."""
    rows = [["WORKER", "GPU", "STATE", "BUSY", "PARTITION", "JOB"]]
    for w in doc.gpu_workers:
        state = "phantom" if w.state == WorkerState.PROVING and w.worker_id in phantom else w.state
        rows.append([str(w.worker_id), str(w.gpu_ordinal), state,
                     "-" if w.busy_secs is None else _seconds(w.busy_secs),
                     "-" if w.current_partition is None else str(w.current_partition),
                     w.current_job or "-"])
    if len(rows) == 1:
        return ["no GPU workers"]
    return _table(rows)


def _pipelines_table(doc: StatusDocument) -> list[str]:
    if not doc.pipelines:
        return ["no jobs"]
    rows = [["JOB", "KIND", "AGE", "DONE", *(p.upper() for p in PartitionState)]]
    for p in doc.pipelines:
        phases = Counter(part.state for part in p.partitions)
        rows.append([p.job_id, p.proof_kind, _seconds(p.started_secs_ago),
                     f"{p.partitions_done}/{p.total_partitions}",
                     *(str(phases[s]) for s in PartitionState)])
    return _table(rows)


def _stale_lines(info: EngineInfo) -> list[str]:
    """The supervisor's stale jobs: listed by the engine, failed work."""
    if not info.stale_jobs:
        return []
    rows = [["JOB", "KIND", "AGE", "NO PROGRESS FOR", "FAILED PARTITIONS"]]
    rows += [[job.job_id, job.proof_kind, _seconds(job.age_secs), _seconds(job.idle_secs),
              str(job.failed_partitions)] for job in info.stale_jobs]
    return ["", "stale jobs (leftovers of failed work: not in flight, not busy):",
            *_table(rows)]


def _seconds(secs: float) -> str:
    """Sub-minute times keep a decimal (a reference-engine partition takes milliseconds)."""
    return f"{secs:.1f}s" if secs < 60 else format_duration(secs)


def _table(rows: Sequence[Sequence[str]]) -> list[str]:
    """Left-aligned columns two spaces apart; the last column is never padded or cut."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]) - 1)]
    return ["  ".join([*(cell.ljust(w) for cell, w in zip(row, widths, strict=False)), row[-1]])
            for row in rows]
