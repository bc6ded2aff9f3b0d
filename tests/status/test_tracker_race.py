"""Random interleavings of workers, split proving and out-of-order finalizers.

After every step each worker must be busy exactly when its most recent ``gpu_start`` has not
been ended (by its own ``gpu_end`` or by the partition failing), with that start's job,
partition and start time; cumulative busy seconds must equal the model's exact span sum.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from cuzkd.status.tracker import StatusTracker

WORKERS = {0: 0, 1: 0, 2: 1}  # worker_id -> gpu_ordinal: two workers share GPU 0
PICK = st.integers(min_value=0, max_value=1 << 16)


@dataclass
class Span:
    job: str
    partition: int
    started: float
    ended: bool = False


class SplitProvingMachine(RuleBasedStateMachine):
    @initialize()
    def setup(self) -> None:
        self.now = 0.0
        self.tracker = StatusTracker(clock=lambda: self.now, retain_finished_secs=1e9)
        self.tracker.register_workers(WORKERS.items())
        self.states: dict[tuple[str, int], str] = {}
        self.last: dict[int, Span] = {}
        self.busy_total = dict.fromkeys(WORKERS, 0.0)
        #: finalizers not yet run: (job, partition, worker)
        self.finalizers: list[tuple[str, int, int]] = []
        self.jobs = 0

    def _in(self, state: str) -> list[tuple[str, int]]:
        return sorted(k for k, s in self.states.items() if s == state)

    def _end_span(self, worker: int) -> None:
        span = self.last.get(worker)
        if span is not None and not span.ended:
            span.ended = True
            self.busy_total[worker] += self.now - span.started

    @rule(partitions=st.integers(min_value=1, max_value=3))
    def register_job(self, partitions: int) -> None:
        job = f"ps-porep-{self.jobs}"
        self.jobs += 1
        self.tracker.register_job(job, "porep-c2", partitions)
        self.states.update({(job, p): "pending" for p in range(partitions)})

    @rule(dt=st.sampled_from([0.25, 0.5, 1.0, 3.0]))
    def advance(self, dt: float) -> None:
        self.now += dt

    @precondition(lambda self: self._in("pending"))
    @rule(pick=PICK)
    def synthesize(self, pick: int) -> None:
        candidates = self._in("pending")
        job, p = candidates[pick % len(candidates)]
        self.tracker.partition_synth_start(job, p)
        self.tracker.partition_synth_end(job, p)
        self.states[job, p] = "synth_done"

    @precondition(lambda self: self._in("synth_done"))
    @rule(pick=PICK, worker=st.sampled_from(sorted(WORKERS)))
    def gpu_start(self, pick: int, worker: int) -> None:
        candidates = self._in("synth_done")
        job, p = candidates[pick % len(candidates)]
        self.tracker.partition_gpu_start(job, p, worker)
        self.states[job, p] = "gpu"
        self._end_span(worker)  # a span still current is replaced at this start
        self.last[worker] = Span(job, p, self.now)
        self.finalizers.append((job, p, worker))

    @precondition(lambda self: self.finalizers)
    @rule(pick=PICK)
    def finalize(self, pick: int) -> None:
        job, p, worker = self.finalizers.pop(pick % len(self.finalizers))
        self.tracker.partition_gpu_end(job, p, worker)
        if self.states[job, p] == "gpu":
            self.states[job, p] = "done"
        span = self.last[worker]
        if (span.job, span.partition) == (job, p):
            self._end_span(worker)

    @precondition(lambda self: self._in("gpu") or self._in("synth_done"))
    @rule(pick=PICK)
    def fail(self, pick: int) -> None:
        candidates = self._in("gpu") + self._in("synth_done")
        job, p = candidates[pick % len(candidates)]
        self.tracker.partition_failed(job, p)  # its finalizer, if any, still runs later
        self.states[job, p] = "failed"
        for worker, span in self.last.items():
            if (span.job, span.partition) == (job, p):
                self._end_span(worker)

    @rule(worker=st.sampled_from(sorted(WORKERS)))
    def stray_calls(self, worker: int) -> None:
        """Calls for ids the tracker never knew change nothing."""
        self.tracker.partition_gpu_start("unknown-job", 0, worker)
        self.tracker.partition_gpu_end("unknown-job", 0, worker)
        self.tracker.partition_gpu_end("ps-porep-0", 99, worker)
        self.tracker.partition_gpu_start("ps-porep-0", 0, 42)

    @invariant()
    def workers_match_their_latest_start(self) -> None:
        doc = self.tracker.snapshot()
        ext = doc.cuzkd_extensions
        assert ext is not None
        totals = {w.worker_id: w.busy_seconds_total for w in ext.worker_busy}
        for w in doc.gpu_workers:
            assert w.gpu_ordinal == WORKERS[w.worker_id]
            span = self.last.get(w.worker_id)
            if span is None or span.ended:
                assert (w.state, w.current_job, w.current_partition, w.busy_secs) == (
                    "idle", None, None, None)
                running = 0.0
            else:
                running = self.now - span.started
                assert (w.state, w.current_job, w.current_partition) == (
                    "proving", span.job, span.partition)
                assert w.busy_secs == pytest.approx(running)
            assert totals[w.worker_id] == pytest.approx(self.busy_total[w.worker_id] + running)

    @invariant()
    def phase_counts_match(self) -> None:
        ext = self.tracker.snapshot().cuzkd_extensions
        assert ext is not None
        done = sum(1 for s in self.states.values() if s == "done")
        failed = sum(1 for s in self.states.values() if s == "failed")
        counts = ext.phase_transitions.get("porep-c2", {"done": 0, "failed": 0})
        assert (counts["done"], counts["failed"]) == (done, failed)


SplitProvingMachine.TestCase.settings = settings(
    max_examples=100, stateful_step_count=30, deadline=None
)
test_split_proving_interleavings = SplitProvingMachine.TestCase
