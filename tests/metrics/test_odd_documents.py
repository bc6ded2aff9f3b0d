"""An engine's odd values cost their own series; a document the conversion fails on costs that
engine's ``cuzk_*`` series, never the other engines' nor the scrape."""

from __future__ import annotations

import json

import msgspec
import structlog

from cuzkd.metrics.sample import SupervisorSample
from cuzkd.status.document import StatusDecoder
from cuzkd.status.salvage import FieldErrorReason


def one(engines):
    return SupervisorSample(engines=engines, zombies_reaped_total=0)


def test_a_wrapped_counter_leaves_out_its_series_and_exports_the_others(
        reference_dir, make_engine, scrape):
    raw = json.loads((reference_dir / "cuzk-status.example.json").read_bytes())
    raw["buffers"]["synth_in_flight"] = 2**64 - 1
    raw["counters"]["completed_by_kind"]["porep-c2"] = -1
    doc, errors, _ = StatusDecoder().decode(json.dumps(raw).encode())
    counted = {e.reason: 2 for e in errors}  # as if two such documents had been decoded
    s = scrape(one([make_engine("e0", status=doc, status_field_errors_total=counted)]))
    buffers = {dict(labels)["buffer"]: v for labels, v in s.named("cuzk_buffers_in_flight").items()}
    assert buffers == {"provers": 2}  # no "synth"; aux and shells: cuzk_buffers_started_total
    completed = {dict(labels)["proof_kind"]: v
                 for labels, v in s.named("cuzk_jobs_completed_total").items()}
    assert completed == {"snap-update": 16}  # porep-c2's count did not decode: absent, not 0
    assert s.get_value("cuzk_jobs_failed_total", engine="e0", proof_kind="porep-c2") == 1
    assert s.get_value("cuzk_memory_budget_total_bytes", engine="e0") == 270582939648
    assert s.get_value("cuzkd_engine_up", engine="e0") == 1
    assert {dict(labels)["reason"]: v
            for labels, v in s.named("cuzkd_status_field_errors_total").items()} == {
        "out_of_range": 2, "wrong_type": 0, "unknown_value": 0, "invalid_utf8": 0, "missing": 0}


def test_every_field_error_reason_is_exported_at_zero(make_engine, scrape):
    s = scrape(one([make_engine("e0")]))
    for reason in FieldErrorReason:
        assert s.get_value("cuzkd_status_field_errors_total", engine="e0", reason=reason) == 0


def test_a_document_the_conversion_fails_on_costs_only_that_engines_series(
        example_status, example_extensions, make_engine, scrape):
    """A value no decoder would give (a partition phase unknown to the tally) makes the
    conversion raise halfway through the engine: that engine is exported down without any
    cuzk_* series, a traceback is logged, and the engines before and after it are exported
    in full -- at this scrape and the next."""
    job = example_status.pipelines[0]
    exploded = msgspec.structs.replace(job.partitions[0], state="exploded")
    odd = msgspec.structs.replace(example_status, pipelines=[
        msgspec.structs.replace(job, partitions=[exploded, *job.partitions[1:]]),
        *example_status.pipelines[1:]])
    engines = [make_engine(name, status=odd if name == "bad" else example_status,
                           extensions=example_extensions) for name in ("a", "bad", "z")]
    alone = scrape(one([make_engine("a", status=example_status,
                                    extensions=example_extensions)]))
    with structlog.testing.capture_logs() as logs:
        s = scrape(one(engines))
        assert scrape(one(engines)) == s
    assert [(e["event"], e["engine"]) for e in logs] == [("metrics_engine_failed", "bad")]
    assert s.get_value("cuzkd_engine_up", engine="bad") == 0
    assert {n for n in s.of_engine("bad") if n.startswith("cuzk_")} == set()
    assert s.get_value("cuzkd_engine_up", engine="a") == s.get_value("cuzkd_engine_up",
                                                                     engine="z") == 1
    assert s.of_engine("a") == alone.of_engine("a")
    assert {k: v for k, v in s.items() if ("engine", "a") in k[1]} == {
        k: v for k, v in alone.items() if ("engine", "a") in k[1]}
    assert {n.replace("z", "a") for n in s.of_engine("z")} == {
        n.replace("z", "a") for n in s.of_engine("a")}
