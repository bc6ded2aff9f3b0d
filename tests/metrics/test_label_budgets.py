"""One engine naming thousands of proof kinds, workers, GPUs and circuits costs only its excess.

Documents go through the supervisor's real path: JSON bytes, :class:`StatusDecoder`, the
deriver for a plain cuzk document, the collector, the text exposition, parsed back.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import msgspec
import pytest

from cuzkd.labelbudget import DEFAULT_LIMITS, LabelBudgets
from cuzkd.metrics.sample import SupervisorSample
from cuzkd.metrics.tally import PhaseTally
from cuzkd.status.derive import ExtensionDeriver
from cuzkd.status.document import Extensions, StatusDecoder

FLOOD = 1000


@pytest.fixture
def example(reference_dir: Path) -> dict[str, Any]:
    document: dict[str, Any] = json.loads((reference_dir / "cuzk-status.example.json").read_bytes())
    return document


def flooded(example: dict[str, Any], extensions: Extensions, n: int = FLOOD) -> bytes:
    """The example document and extensions, plus ``n`` more kinds, workers, GPUs, circuits."""
    doc = json.loads(json.dumps(example))
    ext = msgspec.to_builtins(extensions)
    kinds = [f"flood-{i:04d}" for i in range(n)]
    doc["counters"]["completed_by_kind"].update(dict.fromkeys(kinds, 1))
    histogram = ext["gpu_duration_seconds"]["porep-c2"]
    ext["phase_transitions"].update({kind: {"synthesizing": 1, "done": 1} for kind in kinds})
    ext["gpu_duration_seconds"].update({kind: histogram for kind in kinds})
    for w in range(100, 100 + n):
        doc["gpu_workers"].append({"worker_id": w, "gpu_ordinal": 0, "state": "idle",
                                   "current_job": None, "current_partition": None,
                                   "busy_secs": None})
        ext["worker_busy"].append({"worker_id": w, "gpu_ordinal": 0, "busy_seconds_total": 1.0})
    device = ext["gpu_devices"][0]
    ext["gpu_devices"] += [{**device, "gpu_ordinal": g} for g in range(100, 100 + n)]
    srs = doc["allocations"]["srs"][0]
    doc["allocations"]["srs"] += [{**srs, "circuit_id": f"c-{i}"} for i in range(n)]
    doc["cuzkd_extensions"] = ext
    return json.dumps(doc).encode()


def decoded(body: bytes) -> Any:
    return StatusDecoder().decode(body).document


def label_values(series: Any, engine: str, label: str) -> set[str]:
    return {dict(labels)[label] for (_, labels) in series
            if ("engine", engine) in labels and label in dict(labels)}


def test_an_engine_flooding_labels_exports_within_its_budgets(
        example, example_extensions, make_engine, scrape):
    labels = LabelBudgets("bad")
    plain = decoded(json.dumps(example).encode())
    sample = SupervisorSample(engines=[
        make_engine("bad", status=decoded(flooded(example, example_extensions)), labels=labels),
        make_engine("good", status=plain, extensions=example_extensions),
    ], zombies_reaped_total=0)
    series = scrape(sample)

    for label in ("proof_kind", "worker", "gpu", "circuit"):
        assert len(label_values(series, "bad", label)) == DEFAULT_LIMITS[label], label
    assert len([key for key in series if ("engine", "bad") in key[1]]) < 4000
    dropped = series.named("cuzkd_label_values_dropped_total")
    assert dropped == {
        (("engine", "bad"), ("label", "circuit")): FLOOD + 1 - 64,
        (("engine", "bad"), ("label", "gpu")): FLOOD + 1 - 64,
        (("engine", "bad"), ("label", "proof_kind")): FLOOD + 2 - 32,
        (("engine", "bad"), ("label", "worker")): FLOOD + 2 - 256,
        (("engine", "good"), ("label", "circuit")): 0,
        (("engine", "good"), ("label", "gpu")): 0,
        (("engine", "good"), ("label", "proof_kind")): 0,
        (("engine", "good"), ("label", "worker")): 0,
    }
    alone = scrape(SupervisorSample(engines=[
        make_engine("good", status=plain, extensions=example_extensions)],
        zombies_reaped_total=0))
    assert {k: v for k, v in series.items() if ("engine", "good") in k[1]} == {
        k: v for k, v in alone.items() if ("engine", "good") in k[1]}


def test_values_seen_first_keep_their_series_through_a_flood(
        example, example_extensions, make_engine, scrape):
    labels = LabelBudgets("e0")

    def scrape_of(body: bytes) -> Any:
        return scrape(SupervisorSample(engines=[make_engine("e0", status=decoded(body),
                                                            labels=labels)],
                                       zombies_reaped_total=0))

    calm = msgspec.to_builtins(example_extensions)
    before = scrape_of(json.dumps({**example, "cuzkd_extensions": calm}).encode())
    first = scrape_of(flooded(example, example_extensions))
    again = scrape_of(flooded(example, example_extensions))

    assert set(before) - set(first) == set()  # nothing the calm document had is gone
    for key, value in before.items():
        if key[0] != "cuzkd_label_values_dropped_total":
            assert first[key] == value, key
    assert set(first) == set(again)  # the flood fills the free slots once, then nothing moves
    assert label_values(first, "e0", "worker") >= {"0", "1"}
    drops = first.named("cuzkd_label_values_dropped_total")
    assert again.named("cuzkd_label_values_dropped_total") == {k: 2 * v for k, v in drops.items()}


def plain_document(example: dict[str, Any], kinds: int, workers: int) -> bytes:
    doc = json.loads(json.dumps(example))
    doc["uptime_secs"] += kinds  # a later document (the deriver skips one seen already)
    job = doc["pipelines"][0]
    doc["pipelines"] = [{**job, "job_id": f"job-{i}", "proof_kind": f"kind-{i:04d}"}
                        for i in range(kinds)]
    doc["gpu_workers"] = [{**doc["gpu_workers"][1], "worker_id": w} for w in range(workers)]
    return json.dumps(doc).encode()


def test_the_deriver_keeps_state_only_for_what_the_budgets_admit(example, make_engine, scrape):
    labels = LabelBudgets("cuzk")
    deriver = ExtensionDeriver(clock=lambda: 100.0, kinds=labels.budget("proof_kind"),
                               workers=labels.budget("worker"))
    for kinds in (200, 400):  # a second document naming more kinds and workers still
        document = decoded(plain_document(example, kinds, 2 * kinds))
        deriver.observe(document)
    extensions = deriver.extensions()
    assert len(extensions.phase_transitions) == 32
    assert len(extensions.gpu_duration_seconds) == 32
    assert len(extensions.worker_busy) == 256

    series = scrape(SupervisorSample(engines=[make_engine("cuzk", status=document,
                                                          extensions=extensions,
                                                          labels=labels)],
                                     zombies_reaped_total=0))
    # the kinds exported are the very ones counted: none with counters missing
    exported = label_values(series, "cuzk", "proof_kind")
    assert exported == set(extensions.phase_transitions)
    assert series.get_value("cuzkd_label_values_dropped_total", engine="cuzk",
                            label="proof_kind") == 400 + 2 - 32  # and the counters' two


def test_the_phase_tally_forgets_kinds_no_job_lists(example):
    tally = PhaseTally()
    for kinds in (500, 0):
        tally.count(decoded(plain_document(example, kinds, 0)).pipelines)
    assert tally._totals == {}  # the memory it keeps follows the document


def test_an_info_value_of_a_megabyte_costs_a_short_line(example, example_extensions, scrape,
                                                       make_engine, render_text):
    ext = msgspec.to_builtins(example_extensions)
    ext["backend"] = "b" * 2**20
    ext["gpu_devices"][0]["name"] = "\x1b[2J" + "n" * 2**20
    body = json.dumps({**example, "cuzkd_extensions": ext}).encode()
    sample = SupervisorSample(engines=[make_engine("e0", status=decoded(body))],
                              zombies_reaped_total=0)
    text = render_text(sample)
    assert len(text) < 100_000
    series = scrape(sample)
    (info,) = series.named("cuzk_gpu_info")
    assert dict(info)["name"] == ("\x1b[2J" + "n" * 2**20)[:128]
