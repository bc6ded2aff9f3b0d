"""docs/metrics.md's reference tables and the exported families say the same, both ways.

Dashboards and alerts are written from the reference, so a family the code exports without a
row is invisible to operators, and a row without a family is a query that returns nothing.
The families are collected from the real collectors, built in-process over a sample that
reaches every family; the door process's own families, which need a running door process, are
read from their constructor calls instead.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Callable, Iterator
from pathlib import Path

import msgspec
import pytest
from prometheus_client.parser import text_string_to_metric_families

from cuzkd.cuzk import proving_pb2 as pb
from cuzkd.cuzk.telemetry import GpuReading, Outcomes, Telemetry
from cuzkd.gpus import NvmlDevice
from cuzkd.metrics.door_metrics import DoorMetrics
from cuzkd.metrics.exposition import encode_text
from cuzkd.metrics.sample import SupervisorSample
from cuzkd.states import DoorAbandon, DoorRefusal, DoorRetry, HoldEnd

ROOT = Path(__file__).resolve().parents[2]
REFERENCE = ROOT / "docs" / "metrics.md"
BUNDLED = ROOT / "cuzkd" / "bundled"
REFERENCE_HEADING = "## Reference"
#: rows that name prometheus_client's own collectors of the supervisor process, not cuzkd's
STANDARD_ROWS = frozenset({"process_*", "python_*"})
FAMILY = re.compile(r"^cuzkd?_[a-z0-9_]+$")
#: what a constructor adds to the name it is given, in the exposition
SUFFIX = {"CounterMetricFamily": "_total", "InfoMetricFamily": "_info"}


def _documented() -> set[str]:
    """The first cell of every table row in the reference section."""
    text = REFERENCE.read_text(encoding="utf-8")
    section = text.split(REFERENCE_HEADING + "\n", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| `([^`]+)`", section, re.MULTILINE)
    names = set()
    for row in rows:
        names.update(re.findall(r"`([^`]+)`", row) or [row])
    return names - STANDARD_ROWS


def _family_names(text: str) -> set[str]:
    """Exposed family names: a counter's with ``_total``, an info's with ``_info``."""
    names = set()
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if family.type == "histogram":
                names.add(family.name)
            elif not s.name.endswith("_created"):
                names.add(s.name)
    return names


def _sample(example_status, example_extensions, make_engine) -> SupervisorSample:
    telemetry = Telemetry(
        queues={}, gpus=(GpuReading(0, "NVIDIA H100", 80 << 30, 30 << 30, {"window-post": 1}),),
        outcomes=Outcomes(completed={"porep-c2": 1}, failed={"winning-post": 1}))
    extensions = msgspec.structs.replace(
        example_extensions, phantom_busy_total={"job_stale": 1},
        job_duration_seconds=dict(example_extensions.gpu_duration_seconds))
    engine = make_engine("e0", status=example_status, extensions=extensions,
                         exits_total={"exit_1": 1}, release="r1", stalls_total=1, stalled=True,
                         grpc_polled=True, grpc=telemetry, first_answer_seconds=2.0)
    gpu = NvmlDevice(index=0, uuid="GPU-a", name="NVIDIA H100", memory_used_bytes=1,
                     memory_total_bytes=2, utilization_ratio=0.5, processes={})
    return SupervisorSample(engines=[engine], zombies_reaped_total=1, active_release="r1",
                            config_reload_success_time=1.0, gpus=[gpu],
                            proof_deadlines={"winning-post": 20.0})


def _door() -> DoorMetrics:
    """A door that relayed, held, retried, refused and abandoned: every door family."""
    metrics = DoorMetrics()
    metrics.opened("d", ["d"])
    request = pb.ProveRequest(submit=pb.SubmitProofRequest(
        request_id="r", proof_kind=pb.WINNING_POST, priority=pb.HIGH)).SerializeToString()
    reply = pb.ProveResponse(result=pb.AwaitProofResponse(
        job_id="r", status=pb.AwaitProofResponse.COMPLETED, total_ms=5)).SerializeToString()
    metrics.proved("d", request, reply, "OK")
    metrics.held("d", 1)
    metrics.hold_ended("d", 1.0, HoldEnd.PLACED, "winning-post")
    metrics.retried("d", DoorRetry.CRASH)
    metrics.refused("d", DoorRefusal.DEADLINE, "winning-post")
    metrics.answered_late("d", "winning-post")
    metrics.post_serialized("d", "winning-post", 1.0)
    metrics.abandoned("d", DoorAbandon.NOT_LISTED)
    metrics.quarantined("d", 1)
    metrics.bound_hit("d", "streams")
    metrics.connections("d", 1)
    return metrics


def _constructed() -> Iterator[tuple[str, str]]:
    """(constructor, literal name) of each ``*MetricFamily("name", ...)`` call in cuzkd/ but
    the bundled engine, whose gRPC ``GetMetrics`` text is cuzk's, not cuzkd's ``/metrics``."""
    for path in sorted((ROOT / "cuzkd").rglob("*.py")):
        if BUNDLED in path.parents:
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not (isinstance(node, ast.Call) and node.args
                    and isinstance(node.args[0], ast.Constant)):
                continue
            callee = node.func.id if isinstance(node.func, ast.Name) else getattr(
                node.func, "attr", "")
            name = node.args[0].value
            if callee.endswith("MetricFamily") and isinstance(name, str) and FAMILY.match(name):
                yield callee, name


def _metrics_literals() -> set[str]:
    """Every family-shaped string in cuzkd/metrics/: each names a family there."""
    found = set()
    for path in sorted((ROOT / "cuzkd" / "metrics").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) \
                    and FAMILY.match(node.value):
                found.add(node.value)
    return found


def _bare(name: str) -> str:
    return re.sub(r"_(total|info)$", "", name)


@pytest.fixture
def exported(example_status, example_extensions, make_engine,
             render_text: Callable[[SupervisorSample], str]) -> set[str]:
    """Every family cuzkd exports, by its exposed name."""
    rendered = _family_names(render_text(_sample(example_status, example_extensions,
                                                 make_engine)))
    rendered |= _family_names(encode_text(_door().collect()).decode())
    constructed = {name if name.endswith(SUFFIX.get(callee, "")) else name + SUFFIX[callee]
                   for callee, name in _constructed()}
    return rendered | constructed


def test_the_sample_reaches_every_family_of_the_exporter(exported: set[str]) -> None:
    assert {_bare(n) for n in _metrics_literals()} <= {_bare(n) for n in exported}


def test_every_exported_family_is_documented(exported: set[str]) -> None:
    missing = exported - _documented()
    assert not missing, f"exported without a row in docs/metrics.md: {sorted(missing)}"


def test_every_documented_family_is_exported(exported: set[str]) -> None:
    extra = _documented() - exported
    assert not extra, f"rows in docs/metrics.md no code exports: {sorted(extra)}"
