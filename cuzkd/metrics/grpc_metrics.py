"""The ``cuzk_grpc_*`` families: what a cuzk engine's gRPC said at its last telemetry poll.

Apart from the ``/status``-derived ``cuzk_*`` families by design: gRPC counts every proof kind
(WindowPoSt and WinningPoSt included, which ``/status`` never lists) and every failure (which
``/status`` never counts), so the two disagree and neither may be read as the other. The queues
and the per-GPU activity give all four of cuzk's kinds a series (0 when idle) so a PoSt that
starts is a change, not a new series; a kind cuzk does not have is ``other``
(:func:`cuzkd.kinds.reported_kind`). GPU ordinals pass the engine's label budget.

``cuzkd_engine_grpc_errors_total`` exists for every cuzk engine, each reason at 0 until one
happens, whether or not its gRPC answers now.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, InfoMetricFamily
from prometheus_client.metrics_core import Metric

from cuzkd.cuzk.telemetry import FAILURE_REASONS, Telemetry
from cuzkd.kinds import ProofKind
from cuzkd.labelbudget import LabelBudgets, attribute_value
from cuzkd.metrics.sample import EngineSample

_KIND = ["engine", "proof_kind"]
_GPU = ["engine", "gpu"]


def _kinds(*seen: Iterable[str]) -> list[str]:
    """cuzk's four kinds, then any other seen (``other``), each once."""
    return list(dict.fromkeys([*ProofKind, *sorted(set().union(*seen))]))


class GrpcFamilies:
    """The gRPC families of every cuzk engine of one scrape."""

    def __init__(self) -> None:
        g, c = GaugeMetricFamily, CounterMetricFamily
        self.queued = g("cuzk_grpc_proofs_queued",
                        "Proofs waiting in the engine's scheduler (gRPC GetStatus pending), "
                        "every kind.", labels=_KIND)
        self.in_progress = g("cuzk_grpc_proofs_in_progress",
                             "Proofs dispatched and not finished (gRPC GetStatus in_progress), "
                             "every kind.", labels=_KIND)
        self.completed = c("cuzk_grpc_proofs_completed",
                           "Proofs completed since the engine started (gRPC GetMetrics), "
                           "every kind.", labels=_KIND)
        self.failed = c("cuzk_grpc_proofs_failed",
                        "Proofs failed since the engine started (gRPC GetMetrics), every "
                        "kind and every failure.", labels=_KIND)
        self.gpu_total = g("cuzk_grpc_gpu_memory_total_bytes",
                           "Device memory size (gRPC GetStatus, nvidia-smi).", labels=_GPU)
        self.gpu_free = g("cuzk_grpc_gpu_memory_free_bytes",
                          "Device memory free (gRPC GetStatus, nvidia-smi).", labels=_GPU)
        self.gpu_info = InfoMetricFamily(
            "cuzk_grpc_gpu", "Device name of each GPU ordinal (gRPC GetStatus).", labels=_GPU)
        self.proving = g("cuzk_grpc_gpu_workers_proving",
                         "GPU workers of the GPU proving a proof of the kind now (gRPC "
                         "GetStatus; PoSt included, unlike cuzk_gpu_worker_busy).",
                         labels=["engine", "gpu", "proof_kind"])
        self.errors = c("cuzkd_engine_grpc_errors_total",
                        "gRPC telemetry reads of a cuzk engine that told nothing, by reason "
                        f"({', '.join(FAILURE_REASONS)}); not a health failure.",
                        labels=["engine", "reason"])

    def add(self, engine: EngineSample, labels: LabelBudgets) -> None:
        """One engine's series: its error counts when it is a cuzk engine, and what its last
        poll said when it answered."""
        if not engine.grpc_polled:
            return
        for reason in FAILURE_REASONS:
            self.errors.add_metric([engine.name, reason], engine.grpc_errors_total.get(reason, 0))
        if engine.grpc is not None:
            self._add_telemetry(engine.name, engine.grpc, labels)

    def _add_telemetry(self, name: str, telemetry: Telemetry, labels: LabelBudgets) -> None:
        queues = telemetry.queues or {}
        for kind in labels.keep("proof_kind", _kinds(queues), str):
            queue = queues.get(kind)
            self.queued.add_metric([name, kind], queue.pending if queue else 0)
            self.in_progress.add_metric([name, kind], queue.in_progress if queue else 0)
        if (outcomes := telemetry.outcomes) is not None:
            for kind in labels.keep("proof_kind", _kinds(outcomes.completed, outcomes.failed),
                                    str):
                self.completed.add_metric([name, kind], outcomes.completed.get(kind, 0))
                self.failed.add_metric([name, kind], outcomes.failed.get(kind, 0))
        gpus = labels.keep("gpu", telemetry.gpus or (), lambda gpu: str(gpu.ordinal))
        for gpu in gpus:
            at = [name, str(gpu.ordinal)]
            self.gpu_total.add_metric(at, gpu.vram_total_bytes)
            self.gpu_free.add_metric(at, gpu.vram_free_bytes)
            self.gpu_info.add_metric(at, {"name": attribute_value(gpu.name)})
            for kind in labels.keep("proof_kind", _kinds(gpu.proving), str):
                self.proving.add_metric([*at, kind], gpu.proving.get(kind, 0))

    def families(self) -> list[Metric]:
        return [value for value in vars(self).values() if isinstance(value, Metric)]


def grpc_families(engines: Sequence[EngineSample]) -> list[Metric]:
    """Every engine's gRPC families (``engines`` without duplicate names, each with its label
    budgets)."""
    families = GrpcFamilies()
    for engine in engines:
        families.add(engine, engine.labels or LabelBudgets(engine.name))
    return families.families()
