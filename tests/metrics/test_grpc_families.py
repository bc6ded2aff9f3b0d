"""The ``cuzk_grpc_*`` families and ``cuzkd_engine_grpc_errors_total`` from samples."""

from __future__ import annotations

from cuzkd.cuzk.reading import KindQueue
from cuzkd.cuzk.telemetry import FAILURE_REASONS, GpuReading, Outcomes, Telemetry
from cuzkd.labelbudget import LabelBudgets
from cuzkd.metrics.sample import SupervisorSample

KINDS = ("porep-c2", "snap-update", "window-post", "winning-post")

TELEMETRY = Telemetry(
    queues={"window-post": KindQueue(1, 1), "porep-c2": KindQueue(3, 0)},
    gpus=(GpuReading(0, "NVIDIA H100", 80 << 30, 30 << 30, {"window-post": 1}),
          GpuReading(1, "NVIDIA L4", 24 << 30, 4 << 30, {})),
    outcomes=Outcomes(completed={"porep-c2": 7, "other": 1}, failed={"winning-post": 3}))


def one(*engines):
    return SupervisorSample(engines=list(engines), zombies_reaped_total=0)


def test_every_kind_has_its_series_and_a_gpu_proving_post_shows_busy(make_engine, scrape):
    s = scrape(one(make_engine("c0", grpc_polled=True, grpc=TELEMETRY,
                               grpc_errors_total={"timeout": 2})))
    for kind in KINDS:
        queue = TELEMETRY.queues.get(kind, KindQueue(0, 0))  # type: ignore[union-attr]
        assert s.get_value("cuzk_grpc_proofs_queued", engine="c0", proof_kind=kind) == \
            queue.pending
        assert s.get_value("cuzk_grpc_proofs_in_progress", engine="c0", proof_kind=kind) == \
            queue.in_progress
        for gpu in ("0", "1"):
            busy = 1 if (gpu, kind) == ("0", "window-post") else 0
            assert s.get_value("cuzk_grpc_gpu_workers_proving", engine="c0", gpu=gpu,
                               proof_kind=kind) == busy
    assert s.get_value("cuzk_grpc_proofs_completed_total", engine="c0", proof_kind="porep-c2") == 7
    assert s.get_value("cuzk_grpc_proofs_completed_total", engine="c0", proof_kind="other") == 1
    assert s.get_value("cuzk_grpc_proofs_failed_total", engine="c0",
                       proof_kind="winning-post") == 3
    assert s.get_value("cuzk_grpc_proofs_failed_total", engine="c0", proof_kind="snap-update") == 0
    assert s.get_value("cuzk_grpc_gpu_memory_total_bytes", engine="c0", gpu="1") == 24 << 30
    assert s.get_value("cuzk_grpc_gpu_memory_free_bytes", engine="c0", gpu="0") == 30 << 30
    assert s.get_value("cuzk_grpc_gpu_info", engine="c0", gpu="0", name="NVIDIA H100") == 1
    for reason in FAILURE_REASONS:
        assert s.get_value("cuzkd_engine_grpc_errors_total", engine="c0", reason=reason) == (
            2 if reason == "timeout" else 0)
    # the /status-derived families are not fed from gRPC: this engine served no document
    assert not any(name.startswith("cuzk_") and not name.startswith("cuzk_grpc_")
                   for name in s.of_engine("c0"))


def test_a_cuzk_engine_whose_grpc_told_nothing_has_only_its_error_counts(make_engine, scrape):
    s = scrape(one(make_engine("c0", grpc_polled=True, grpc=None,
                               grpc_errors_total={"unavailable": 5}),
                   make_engine("plain")))
    assert {n for n in s.of_engine("c0") if "grpc" in n} == {"cuzkd_engine_grpc_errors_total"}
    assert s.get_value("cuzkd_engine_grpc_errors_total", engine="c0", reason="unavailable") == 5
    assert not {n for n in s.of_engine("plain") if "grpc" in n}  # not a cuzk engine


def test_outcomes_lost_leave_the_queues_and_gpus(make_engine, scrape):
    telemetry = Telemetry(TELEMETRY.queues, TELEMETRY.gpus, None)
    s = scrape(one(make_engine("c0", grpc_polled=True, grpc=telemetry)))
    names = s.of_engine("c0")
    assert "cuzk_grpc_proofs_queued" in names and "cuzk_grpc_gpu_memory_free_bytes" in names
    assert "cuzk_grpc_proofs_completed_total" not in names


def test_gpu_ordinals_pass_the_engines_label_budget(make_engine, scrape):
    gpus = tuple(GpuReading(n, "g", 1, 1, {}) for n in range(100))
    labels = LabelBudgets("c0", {"gpu": 4})
    s = scrape(one(make_engine("c0", grpc_polled=True, labels=labels,
                               grpc=Telemetry(queues={}, gpus=gpus))))
    assert {dict(k)["gpu"] for k in s.named("cuzk_grpc_gpu_memory_total_bytes")} == {
        "0", "1", "2", "3"}
    assert labels.dropped_total["gpu"] == 96
