"""A shared door's merged answers, from the engines' reply bytes: one GetStatus as if one cuzk
served every GPU, one valid Prometheus exposition with an ``engine`` label, one PreloadSRS."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from cuzkd.cuzk import proving_pb2 as pb
from cuzkd.supervisor.door.merge import merge_metrics, merge_preload, merge_status


def status(ordinals: list[int], *, done: int = 0, uptime: int = 0,
           queues: tuple[tuple[str, int, int], ...] = (),
           srs: tuple[tuple[str, int, int], ...] = ()) -> bytes:
    reply = pb.GetStatusResponse(total_proofs_completed=done, total_proofs_failed=1,
                                 uptime_seconds=uptime, pinned_memory_bytes=5,
                                 pinned_memory_limit_bytes=50)
    for ordinal in ordinals:
        reply.gpus.add(ordinal=ordinal, current_job_id=f"job-on-{ordinal}")
    for kind, pending, running in queues:
        reply.queues.add(proof_kind=kind, pending=pending, in_progress=running)
    for circuit, tier, refs in srs:
        reply.loaded_srs.add(circuit_id=circuit, tier=tier, size_bytes=10, ref_count=refs)
    return reply.SerializeToString()


def metrics(text: str) -> bytes:
    return pb.GetMetricsResponse(prometheus_text=text).SerializeToString()


def test_one_reply_is_passed_on_byte_for_byte() -> None:
    one = status([0, 0], done=3)
    assert merge_status([one]) == one
    assert merge_metrics([("a", metrics("garbage {"))]) == metrics("garbage {")
    assert merge_preload([b"\x08\x01"]) == b"\x08\x01"


def test_status_lists_each_gpu_once_and_sums_queues_by_kind() -> None:
    merged = pb.GetStatusResponse.FromString(merge_status([
        status([0, 0], done=5, uptime=300, queues=(("WINNING_POST", 1, 0), ("POREP", 2, 1)),
               srs=(("porep-32g", pb.SRSStatus.WARM, 1),)),
        status([1, 1, 0], done=7, uptime=60, queues=(("POREP", 3, 2), ("SNAP", 0, 1)),
               srs=(("porep-32g", pb.SRSStatus.HOT, 2), ("snap-32g", pb.SRSStatus.COLD, 1))),
    ]))
    # GPU 0 is the first engine's: the second's entry for it would show it twice
    assert [(g.ordinal, g.current_job_id) for g in merged.gpus] == [
        (0, "job-on-0"), (0, "job-on-0"), (1, "job-on-1"), (1, "job-on-1")]
    assert [(q.proof_kind, q.pending, q.in_progress) for q in merged.queues] == [
        ("WINNING_POST", 1, 0), ("POREP", 5, 3), ("SNAP", 0, 1)]
    assert [(s.circuit_id, s.tier, s.ref_count) for s in merged.loaded_srs] == [
        ("porep-32g", pb.SRSStatus.HOT, 3), ("snap-32g", pb.SRSStatus.COLD, 1)]
    assert (merged.total_proofs_completed, merged.total_proofs_failed) == (12, 2)
    assert merged.uptime_seconds == 60  # the youngest engine's
    assert (merged.pinned_memory_bytes, merged.pinned_memory_limit_bytes) == (10, 100)


def test_a_status_reply_that_does_not_decode_is_left_out() -> None:
    merged = pb.GetStatusResponse.FromString(merge_status([b"\xff\xff", status([1], done=2)]))
    assert ([g.ordinal for g in merged.gpus], merged.total_proofs_completed) == ([1], 2)
    assert merge_status([b"\xff", b"\xff"]) == b""  # an empty GetStatusResponse


CUZK = """# HELP cuzk_proofs_completed_total Proofs completed.
# TYPE cuzk_proofs_completed_total counter
cuzk_proofs_completed_total {n}
# TYPE cuzk_proofs_completed counter
cuzk_proofs_completed{{proof_kind="porep"}} {n}
# TYPE cuzk_proof_duration_seconds summary
cuzk_proof_duration_seconds{{quantile="0.5"}} 1.5
cuzk_proof_duration_seconds_sum 3
cuzk_proof_duration_seconds_count {n}
"""


def test_metrics_are_one_valid_exposition_with_each_sample_labelled_by_engine() -> None:
    # gpu2's sample of cuzk_proofs_completed_total follows the TYPE of cuzk_proofs_completed
    late = "# TYPE cuzk_proofs_completed counter\ncuzk_proofs_completed_total 4\n"
    text = pb.GetMetricsResponse.FromString(merge_metrics(
        [("gpu0", metrics(CUZK.format(n=2))), ("gpu1", metrics(CUZK.format(n=3))),
         ("gpu2", metrics(late))])
    ).prometheus_text
    assert text.count("# TYPE cuzk_proof_duration_seconds summary") == 1
    assert text.count("# HELP ") == 1
    families = {f.name: f for f in text_string_to_metric_families(text)}
    summary = families["cuzk_proof_duration_seconds"]
    assert summary.type == "summary"
    assert [(s.name, s.labels, s.value) for s in summary.samples] == [
        ("cuzk_proof_duration_seconds", {"engine": "gpu0", "quantile": "0.5"}, 1.5),
        ("cuzk_proof_duration_seconds_sum", {"engine": "gpu0"}, 3.0),
        ("cuzk_proof_duration_seconds_count", {"engine": "gpu0"}, 2.0),
        ("cuzk_proof_duration_seconds", {"engine": "gpu1", "quantile": "0.5"}, 1.5),
        ("cuzk_proof_duration_seconds_sum", {"engine": "gpu1"}, 3.0),
        ("cuzk_proof_duration_seconds_count", {"engine": "gpu1"}, 3.0)]
    assert ('cuzk_proofs_completed_total{engine="gpu1"} 3\n'
            'cuzk_proofs_completed_total{engine="gpu2"} 4\n'
            "# TYPE cuzk_proofs_completed counter\n") in text


def test_hostile_metric_texts_still_merge_into_valid_exposition() -> None:
    """Odd label values are kept as written; an ``engine`` label of the engine's own is
    replaced; lines that are no samples, and label sets that do not parse, are left out."""
    odd = ('weird{path="a,b}\\"c\\\\",engine="spoof",} 1 1700000000000\n'
           "# a plain comment\n\n"
           "no_value\n"
           'broken{a="x" b="y"} 2\n'
           'unclosed{a="x} 3\n'
           "# TYPE g gauge\n"
           "g NaN\n"
           "g_total +Inf\n")
    text = pb.GetMetricsResponse.FromString(merge_metrics(
        [('e"0', metrics(odd)), ("e1", b"\xff\xff"), ("e2", metrics("g 1\n"))])
    ).prometheus_text
    assert 'weird{engine="e\\"0",path="a,b}\\"c\\\\"} 1 1700000000000\n' in text
    assert "broken" not in text and "unclosed" not in text and "no_value" not in text
    samples = [(s.name, s.labels) for f in text_string_to_metric_families(text)
               for s in f.samples]
    assert ("g", {"engine": "e2"}) in samples and ("g", {"engine": 'e"0'}) in samples
    assert text.count("# TYPE g gauge") == 1


def test_preload_is_already_loaded_only_where_every_engine_had_it() -> None:
    def preload(loaded: bool, ms: int) -> bytes:
        return pb.PreloadSrsResponse(already_loaded=loaded, load_time_ms=ms).SerializeToString()

    both = pb.PreloadSrsResponse.FromString(merge_preload([preload(True, 0), preload(True, 0)]))
    assert both.already_loaded
    one = pb.PreloadSrsResponse.FromString(merge_preload([preload(True, 0), preload(False, 900),
                                                          preload(False, 400)]))
    assert (one.already_loaded, one.load_time_ms) == (False, 900)
