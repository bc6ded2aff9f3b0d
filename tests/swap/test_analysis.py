"""The canary analysis rules (pure): counters in, verdict out."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import msgspec
import pytest

from cuzkd.status.document import Counters, Extensions, Histogram
from cuzkd.status.tracker import StatusTracker
from cuzkd.swap.analysis import Criteria, Tally, combine, growth, judge, tally_of
from cuzkd.swap.control import SwapRequest, analysis_plan
from cuzkd.swap.rolling import AnalysisPlan

CRITERIA = Criteria(min_throughput_ratio=0.8, min_partitions=20, max_failed_jobs=0)


def side(done: int, seconds: float, failed: int = 0, kind: str = "porep-c2") -> Tally:
    return Tally(done={kind: done}, gpu_seconds={kind: seconds}, failed_jobs=failed)


def test_a_canary_as_fast_as_the_old_engines_passes() -> None:
    verdict = judge(side(40, 20.0), side(80, 41.0), CRITERIA, baseline_kind="peers")
    assert verdict.result == "pass"
    [kind] = verdict.kinds
    assert kind.canary_rate == 2.0 and kind.ratio == pytest.approx(2.0 / (80 / 41.0))


def test_half_the_throughput_fails_naming_the_kind_and_the_ratio() -> None:
    verdict = judge(side(40, 40.0), side(80, 40.0), CRITERIA, baseline_kind="peers")
    assert verdict.result == "fail"
    assert verdict.reasons == ["porep-c2: throughput 0.50 of the peers baseline (at least 0.8 "
                               "required)"]
    assert "porep-c2 0.50x" in verdict.summary()


def test_throughput_is_per_busy_gpu_second_not_per_wall_second() -> None:
    # The canary finished fewer partitions (it got fewer jobs) but each as fast: it passes.
    assert judge(side(25, 10.0), side(100, 40.0), CRITERIA, baseline_kind="peers").result \
        == "pass"


def test_any_failed_job_on_the_canary_fails_it_whatever_its_speed() -> None:
    verdict = judge(side(40, 10.0, failed=1), side(40, 40.0), CRITERIA, baseline_kind="peers")
    assert verdict.result == "fail" and "1 failed job(s) on the canary" in verdict.reasons[0]
    lenient = Criteria(max_failed_jobs=1)
    assert judge(side(40, 10.0, failed=1), side(40, 40.0), lenient,
                 baseline_kind="peers").result == "pass"


def test_the_operators_check_decides_too() -> None:
    assert judge(side(40, 10.0), side(40, 10.0), CRITERIA, baseline_kind="self",
                 check="exit_0").result == "pass"
    verdict = judge(side(40, 10.0), side(40, 10.0), CRITERIA, baseline_kind="self",
                    check="timeout")
    assert verdict.result == "fail" and verdict.reasons == ["the check ended with timeout"]


@pytest.mark.parametrize(("canary", "baseline"), [
    (side(19, 10.0), side(100, 10.0)),   # the canary did too little
    (side(100, 10.0), side(19, 10.0)),   # the old engines did too little
    (Tally(), Tally()),                  # nothing at all
    (side(40, 10.0, kind="snap-update"), side(40, 10.0, kind="porep-c2")),  # no kind on both sides
])
def test_too_little_work_is_inconclusive(canary: Tally, baseline: Tally) -> None:
    verdict = judge(canary, baseline, CRITERIA, baseline_kind="peers")
    assert verdict.result == "inconclusive" and "too little work" in verdict.reasons[0]


def test_a_canary_without_a_window_is_no_pass() -> None:
    verdict = judge(side(40, 10.0), side(40, 10.0), CRITERIA, baseline_kind="peers",
                    unread=["gpu0"])
    assert verdict.result == "fail"
    assert verdict.reasons == ["canary gpu0: restarted or no status during the analysis"]


def test_too_little_work_with_a_failure_is_still_a_failure() -> None:
    assert judge(side(1, 1.0, failed=2), Tally(), CRITERIA, baseline_kind="peers").result \
        == "fail"


def test_every_kind_that_counts_must_pass() -> None:
    canary = Tally(done={"porep-c2": 40, "snap-update": 40},
                   gpu_seconds={"porep-c2": 10.0, "snap-update": 20.0})
    old = Tally(done={"porep-c2": 40, "snap-update": 40},
                gpu_seconds={"porep-c2": 10.0, "snap-update": 10.0})
    verdict = judge(canary, old, CRITERIA, baseline_kind="peers")
    assert verdict.result == "fail" and verdict.reasons[0].startswith("snap-update:")
    assert [k.proof_kind for k in verdict.kinds] == ["porep-c2", "snap-update"]


def test_growth_is_the_window_and_a_restart_voids_it() -> None:
    before = Tally(done={"porep-c2": 10}, gpu_seconds={"porep-c2": 5.0}, failed_jobs=1)
    after = Tally(done={"porep-c2": 30, "snap-update": 4},
                  gpu_seconds={"porep-c2": 15.0, "snap-update": 2.0}, failed_jobs=3)
    assert growth(before, after) == Tally(done={"porep-c2": 20, "snap-update": 4},
                                          gpu_seconds={"porep-c2": 10.0, "snap-update": 2.0},
                                          failed_jobs=2)
    restarted = Tally(done={"porep-c2": 2}, gpu_seconds={"porep-c2": 1.0})
    assert growth(before, restarted) is None
    assert growth(before, Tally()) is None


def test_combine_adds_the_engines_of_one_side() -> None:
    assert combine([side(10, 2.0, 1), side(5, 1.0, 0, "snap-update"), side(1, 0.5)]) == Tally(
        done={"porep-c2": 11, "snap-update": 5}, gpu_seconds={"porep-c2": 2.5, "snap-update": 1.0},
        failed_jobs=1)


def test_a_status_document_gives_done_partitions_gpu_seconds_and_failed_jobs() -> None:
    hist = Histogram(bounds=[1.0], bucket_counts=[3], count=3, sum=1.5)
    ext = Extensions(phase_transitions={"porep-c2": {"gpu": 4, "done": 3}}, worker_busy=[],
                     synth_duration_seconds={}, gpu_duration_seconds={"porep-c2": hist},
                     jobs_in_flight=0)
    doc = msgspec.structs.replace(StatusTracker().snapshot(), counters=Counters(
        total_completed=1, total_failed=2, completed_by_kind={}, failed_by_kind={},
        queue_depth=0))
    assert tally_of(doc, ext) == Tally(done={"porep-c2": 3}, gpu_seconds={"porep-c2": 1.5},
                                       failed_jobs=2)
    # a count that did not decode (None): the document is no reading, so no window passes
    unknown_done = msgspec.structs.replace(ext, phase_transitions={"porep-c2": {"done": None}})
    assert tally_of(doc, unknown_done) is None
    unknown_failed = msgspec.structs.replace(doc, counters=msgspec.structs.replace(
        doc.counters, total_failed=None))
    assert tally_of(unknown_failed, ext) is None


def test_the_verdict_serialises_for_the_history() -> None:
    data = judge(side(40, 20.0), side(40, 20.0), CRITERIA, baseline_kind="self").as_json()
    assert data["result"] == "pass" and data["baseline"] == "self"
    assert data["criteria"] == {"min_throughput_ratio": 0.8, "min_partitions": 20,
                                "max_failed_jobs": 0}
    assert data["kinds"][0]["proof_kind"] == "porep-c2"


def test_a_swap_request_becomes_an_analysis_plan() -> None:
    assert analysis_plan(SwapRequest(path="/x")) is None
    plan = analysis_plan(SwapRequest(path="/x", analysis="2m", canary=2, check="verify --fast "
                                     "'a b'", on_inconclusive="proceed"))
    assert plan == AnalysisPlan(120.0, 2, CRITERIA, ["verify", "--fast", "a b"], "proceed")


@pytest.mark.parametrize(("fields", "words"), [
    ({"analysis": "0s"}, "analysis"),
    ({"analysis": "soon"}, "duration"),
    ({"analysis": "1m", "canary": 0}, "canary"),
    ({"analysis": "1m", "min_throughput_ratio": 0}, "min_throughput_ratio"),
    ({"analysis": "1m", "min_partitions": 0}, "min_partitions"),
    ({"analysis": "1m", "max_failed_jobs": -1}, "max_failed_jobs"),
    ({"analysis": "1m", "check": "  "}, "check"),
    ({"analysis": "1m", "check": "'unclosed"}, "quotation"),
])
def test_a_bad_analysis_request_names_the_field(fields: dict[str, Any], words: str) -> None:
    with pytest.raises(ValueError, match=words):
        analysis_plan(SwapRequest(path="/x", **fields))


@pytest.mark.parametrize("argv", [
    ["--canary", "2", "/bin/true"],                 # analysis options need --analysis
    ["--check", "true", "/bin/true"],
    ["--rollback", "--analysis", "1m"],             # and a swap to PATH
])
def test_analysis_options_without_a_swap_analysis_are_usage_errors(argv: list[str]) -> None:
    done = subprocess.run([sys.executable, "-m", "cuzkd", "swap", *argv], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 2 and "--analysis" in done.stderr, done.stderr
