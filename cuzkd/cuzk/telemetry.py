"""What one telemetry poll of a cuzk's gRPC said, as plain values (no grpc here).

cuzk's ``/status`` never shows WindowPoSt or WinningPoSt (proved whole, outside its pipelines)
and its GPU workers read ``idle`` while they prove them; gRPC's ``GetStatus`` and
``GetMetrics`` do show them. :mod:`cuzkd.cuzk.client` reads both and builds a
:class:`Telemetry`; the exporter publishes it as its own ``cuzk_grpc_*`` families, never mixed
into the ``/status``-derived ones (the two count different things: ``/status`` only partitioned
jobs, gRPC every kind and every failure).

Everything an engine sends is bounded here: proof kinds become :func:`~cuzkd.kinds.reported_kind`
(cuzk's four and ``other``), and a failure is one of :data:`FAILURE_REASONS`, so a hostile
engine can make neither label grow.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families

from cuzkd.cuzk.reading import KindQueue
from cuzkd.kinds import reported_kind

#: ``GetMetrics``' per-kind counters (cuzk names them without ``_total``; only the samples with
#: a ``proof_kind`` count, its all-kinds ``_total`` counters have none): completed, failed.
COMPLETED_SAMPLE = "cuzk_proofs_completed"
FAILED_SAMPLE = "cuzk_proofs_failed"

#: Why a read told nothing: the ``reason`` of ``cuzkd_engine_grpc_errors_total``, a fixed set
#: (the gRPC status code itself is in the logged message).
UNAVAILABLE = "unavailable"  # nothing listens, the connection was refused or reset
TIMEOUT = "timeout"  # no answer within the timeout (a hung engine)
TOO_LARGE = "too_large"  # a reply over the client's limit, refused unread
ERROR_STATUS = "error_status"  # the engine answered another gRPC error status
UNDECODABLE = "undecodable"  # the reply is not the message the method answers
BAD_METRICS_TEXT = "bad_metrics_text"  # GetMetrics' string is not Prometheus exposition
CLIENT_ERROR = "client_error"  # grpc refused the address, or failed outside any call
FAILURE_REASONS = (UNAVAILABLE, TIMEOUT, TOO_LARGE, ERROR_STATUS, UNDECODABLE,
                   BAD_METRICS_TEXT, CLIENT_ERROR)


#: GPU ordinals one reading keeps: a host has at most 16 GPUs, but a 1 MiB reply of a hostile
#: engine could list ~300,000 (the label budget, 64 by default, still bounds the series).
MAX_GPUS = 1024


@dataclass(frozen=True)
class Failure:
    """One method of one poll that told nothing: a bounded reason and the sentence to log."""

    reason: str
    message: str


@dataclass(frozen=True)
class GpuReading:
    """One GPU ordinal of ``GetStatus`` (cuzk lists one entry per GPU *worker*: merged here)."""

    ordinal: int
    name: str
    vram_total_bytes: int
    vram_free_bytes: int
    #: proof kind -> workers of this GPU proving one of that kind now (PoSt included)
    proving: Mapping[str, int]


@dataclass(frozen=True)
class Outcomes:
    """``GetMetrics``' per-kind counters: every kind and every failure since the engine
    started (they reset when it restarts)."""

    completed: Mapping[str, float]
    failed: Mapping[str, float]


@dataclass(frozen=True)
class Telemetry:
    """One poll: ``GetStatus``'s queues and GPUs, ``GetMetrics``' outcomes, each None when its
    method failed (the other still counts), and the failures of this poll."""

    queues: Mapping[str, KindQueue] | None = None
    gpus: tuple[GpuReading, ...] | None = None
    outcomes: Outcomes | None = None
    failures: tuple[Failure, ...] = ()


def gpus_of(entries: list[tuple[int, str, int, int, str]]) -> tuple[GpuReading, ...]:
    """``(ordinal, name, vram_total, vram_free, current_proof_kind)`` per GPU worker as one
    reading per ordinal, in order: name and memory from its first entry (``nvidia-smi``'s,
    the same for every worker of the GPU), the kinds its workers prove counted; the first
    :data:`MAX_GPUS` ordinals only."""
    first: dict[int, tuple[str, int, int]] = {}
    proving: dict[int, Counter[str]] = {}
    for ordinal, name, total, free, kind in entries:
        if ordinal not in first and len(first) >= MAX_GPUS:
            continue
        first.setdefault(ordinal, (name, total, free))
        counts = proving.setdefault(ordinal, Counter())
        if kind:
            counts[reported_kind(kind)] += 1
    return tuple(GpuReading(ordinal, *first[ordinal], dict(proving[ordinal]))
                 for ordinal in sorted(first))


def outcomes_of(text: str) -> Outcomes:
    """The per-kind completed and failed counters of a ``GetMetrics`` text; a kind named in two
    spellings is summed. Raises ValueError for a text that is not Prometheus exposition, or a
    counter that is negative or not finite (no engine counts so)."""
    completed: dict[str, float] = {}
    failed: dict[str, float] = {}
    try:
        samples = [s for family in text_string_to_metric_families(text) for s in family.samples]
    except Exception as exc:  # the parser's errors are ValueError, IndexError, ...: all "bad"
        raise ValueError(f"not Prometheus exposition: {exc}") from exc
    for sample in samples:
        # the parser names a typed counter's samples ``_total``; an untyped one's keep the name
        into = {COMPLETED_SAMPLE: completed, FAILED_SAMPLE: failed}.get(
            sample.name.removesuffix("_total"))
        if into is None or "proof_kind" not in sample.labels:
            continue
        value = float(sample.value)
        if not math.isfinite(value) or value < 0:
            raise ValueError(f"{sample.name} is {value}")
        kind = reported_kind(sample.labels["proof_kind"])
        into[kind] = into.get(kind, 0.0) + value
    return Outcomes(completed, failed)
