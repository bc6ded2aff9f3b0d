"""Canary analysis: is the new release as good as the old one, on the work it really does?

An engine that answers ``/status`` and stays up can still prove 40 % slower, or fail every third
proof. ``cuzkd swap --analysis DURATION`` therefore moves the canary engines first and compares
them, over the same window, with the engines still on the old release (or, on a one-engine host,
with the canary's own window before the swap):

- **throughput per proof kind**: partitions done per busy GPU-worker second, i.e. the growth of
  the ``done`` phase counter over the growth of the GPU-phase duration sum; a kind counts when
  each side finished at least ``min_partitions`` of it, and the canary must reach
  ``min_throughput_ratio`` of the baseline on every kind that counts;
- **failures**: at most ``max_failed_jobs`` failed jobs on the canary;
- **the operator's check** (``--check CMD``): exit 0 passes.

A failure of any of these (or a canary that restarted or went silent in the window) is
``fail``; otherwise, with no kind that counts, ``inconclusive``;
else ``pass``. This module is pure -- cumulative counters in, a report out -- so every rule is
unit-tested; the swap coordinator reads the counters and runs the check.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from cuzkd.status.document import Extensions, StatusDocument


class AnalysisResult(enum.StrEnum):
    """What the analysis found of the canary (the module docstring says when each is given)."""

    PASS = "pass"  # noqa: S105 (a result, not a password)
    FAIL = "fail"
    INCONCLUSIVE = "inconclusive"


class Baseline(enum.StrEnum):
    """What the canary was compared with: the engines still on the old release, or its own
    window before the swap (no old engine left to compare with, e.g. a one-GPU host)."""

    PEERS = "peers"
    SELF = "self"


@dataclass(frozen=True)
class Tally:
    """One engine's cumulative counters at one moment, or their growth over a window."""

    #: proof kind -> partitions that reached ``done``
    done: Mapping[str, int] = field(default_factory=dict)
    #: proof kind -> seconds of finished GPU phases (GPU-worker busy time)
    gpu_seconds: Mapping[str, float] = field(default_factory=dict)
    failed_jobs: int = 0


def tally_of(doc: StatusDocument, extensions: Extensions) -> Tally | None:
    """The counters of one status document (``extensions``: the engine's own, or derived);
    None when one of them did not decode (the document is no reading of them)."""
    failed = doc.counters.total_failed
    done: dict[str, int] = {}
    for kind, phases in extensions.phase_transitions.items():
        count = phases.get("done", 0)
        if count is None:
            return None
        done[kind] = count
    if failed is None:
        return None
    return Tally(
        done=done,
        gpu_seconds={kind: hist.sum for kind, hist in extensions.gpu_duration_seconds.items()},
        failed_jobs=failed,
    )


def growth(before: Tally, after: Tally) -> Tally | None:
    """What happened between two readings; None when a counter went back (the engine
    restarted in between: the window says nothing)."""
    done = {k: v - before.done.get(k, 0) for k, v in after.done.items()}
    gpu = {k: v - before.gpu_seconds.get(k, 0.0) for k, v in after.gpu_seconds.items()}
    failed = after.failed_jobs - before.failed_jobs
    lost = set(before.done) - set(after.done) or set(before.gpu_seconds) - set(after.gpu_seconds)
    if lost or failed < 0 or any(v < 0 for v in done.values()) or any(
            v < 0 for v in gpu.values()):
        return None
    return Tally(done=done, gpu_seconds=gpu, failed_jobs=failed)


def combine(tallies: Iterable[Tally]) -> Tally:
    """Several engines' windows as one side of the comparison."""
    done: dict[str, int] = {}
    gpu: dict[str, float] = {}
    failed = 0
    for tally in tallies:
        for kind, count in tally.done.items():
            done[kind] = done.get(kind, 0) + count
        for kind, seconds in tally.gpu_seconds.items():
            gpu[kind] = gpu.get(kind, 0.0) + seconds
        failed += tally.failed_jobs
    return Tally(done=done, gpu_seconds=gpu, failed_jobs=failed)


@dataclass(frozen=True)
class Criteria:
    min_throughput_ratio: float = 0.8
    min_partitions: int = 20
    max_failed_jobs: int = 0


@dataclass(frozen=True)
class KindComparison:
    """One proof kind on both sides; ``ratio`` is None when it does not count (too few)."""

    proof_kind: str
    canary_partitions: int
    baseline_partitions: int
    #: partitions per busy GPU-worker second; None without any busy time
    canary_rate: float | None
    baseline_rate: float | None
    ratio: float | None


@dataclass(frozen=True)
class CanaryReport:
    """What one canary analysis found, and why."""

    result: AnalysisResult
    #: why, one line per finding (for ``fail`` and ``inconclusive``), or what passed
    reasons: list[str]
    kinds: list[KindComparison]
    canary_failed_jobs: int
    baseline: Baseline
    criteria: Criteria
    #: the operator's check: None when there was none, else its exit cause (``exit_0``, ...)
    check: str | None = None

    def as_json(self) -> dict[str, Any]:
        """The report as stored in the release history and streamed to ``cuzkd swap``."""
        return asdict(self)

    def summary(self) -> str:
        """One line for the operator."""
        rates = ", ".join(f"{k.proof_kind} {k.ratio:.2f}x" for k in self.kinds
                          if k.ratio is not None)
        return f"analysis {self.result}: " + "; ".join(
            self.reasons + ([f"throughput vs {self.baseline}: {rates}"] if rates else []))


def _rate(tally: Tally, kind: str) -> float | None:
    seconds = tally.gpu_seconds.get(kind, 0.0)
    return tally.done.get(kind, 0) / seconds if seconds > 0 else None


def judge(canary: Tally, baseline: Tally, criteria: Criteria, *, baseline_kind: Baseline,
          check: str | None = None, unread: Sequence[str] = ()) -> CanaryReport:
    """The report on the canary's window against the baseline's (see the module docstring).
    ``unread``: canaries without a window (restarted, or no status during it): no pass."""
    failures: list[str] = []
    if unread:
        failures.append(f"canary {', '.join(unread)}: restarted or no status during the "
                        "analysis")
    if canary.failed_jobs > criteria.max_failed_jobs:
        failures.append(f"{canary.failed_jobs} failed job(s) on the canary (at most "
                        f"{criteria.max_failed_jobs} allowed)")
    if check is not None and check != "exit_0":
        failures.append(f"the check ended with {check}")
    kinds: list[KindComparison] = []
    for kind in sorted(set(canary.done) | set(baseline.done)):
        ours, theirs = canary.done.get(kind, 0), baseline.done.get(kind, 0)
        ours_rate, theirs_rate = _rate(canary, kind), _rate(baseline, kind)
        enough = min(ours, theirs) >= criteria.min_partitions
        ratio = (ours_rate / theirs_rate if enough and ours_rate is not None
                 and theirs_rate is not None and theirs_rate > 0 else None)
        kinds.append(KindComparison(kind, ours, theirs, ours_rate, theirs_rate, ratio))
        if ratio is not None and ratio < criteria.min_throughput_ratio:
            failures.append(f"{kind}: throughput {ratio:.2f} of the {baseline_kind} baseline "
                            f"(at least {criteria.min_throughput_ratio:g} required)")
    counted = [k for k in kinds if k.ratio is not None]
    if failures:
        result = AnalysisResult.FAIL
        reasons = failures
    elif not counted:
        result = AnalysisResult.INCONCLUSIVE
        reasons = [f"too little work to compare: no proof kind with {criteria.min_partitions} "
                   "partitions done on both sides"]
    else:
        result = AnalysisResult.PASS
        reasons = [f"{len(counted)} proof kind(s) compared, {canary.failed_jobs} failed job(s)"]
    return CanaryReport(result, reasons, kinds, canary.failed_jobs, baseline_kind, criteria, check)
