"""Issue 16 on the live stack: the demo load makes every load panel move, and
``cuzkd status NAME`` reads a plain cuzk document.

A steady demo load once left the GPU-worker, pipeline and memory dashboards flat (both busy
gauges 1 in every sample, synthesis always 0, the budget at 0.1 %). Here every panel of those
three dashboards must show a series that changes value, through the live Prometheus, within
two minutes of the demo's start; the test ends as soon as they all do.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
import time

from support import ops
from support.live_stack import DEMO_DOOR_PANELS, LiveStack

#: The dashboards whose panels show the load (the fleet dashboard shows engine lifecycles).
LOAD_DASHBOARDS = ("cuzkd / GPU workers", "cuzkd / Pipeline", "cuzkd / Memory")
#: Panels constant by nature under a healthy load: tables built once per circuit and kept,
#: and the stall watchdog's (0 unless an engine hangs).
STEADY_PANELS = {("cuzkd / Memory", "SRS and PCE allocations"),
                 ("cuzkd / GPU workers", "Stalled engines"), ("cuzkd / GPU workers", "Stalls"),
                 # 0 while the engines are healthy: the demo leaves no failed work behind
                 ("cuzkd / Pipeline", "Stale jobs (failed-work leftovers)"),
                 # 0 while the doors' engines take every call at once
                 ("cuzkd / Pipeline", "Front door: held calls")}
#: The Grafana variables of tests/live/test_panels.py.
VARIABLES = {"rate_interval": "4s", "interval": "1s", "range_": "30s"}
WITHIN = 120.0


def _moves(live: LiveStack, expr: str, start: float, end: float) -> bool:
    """True when some series of ``expr`` takes two different values in [start, end]."""
    answer = live.prometheus.data("query_range", query=expr, start=start, end=end, step=1)
    for series in answer["result"]:
        values = {float(v) for _, v in series["values"]}
        if len({v for v in values if not math.isnan(v)}) >= 2:
            return True
    return False


def test_every_load_panel_moves_within_two_minutes_of_the_demo(live: LiveStack) -> None:
    started = float(live.supervisor.about()["started_at"])
    panels: dict[tuple[str, str], list[str]] = {}
    for q in ops.iter_panel_queries(**VARIABLES):
        key = (q.dashboard, q.panel)
        expected = not q.event_only or q.panel in DEMO_DOOR_PANELS  # the demo's doors move
        if q.dashboard in LOAD_DASHBOARDS and expected and key not in STEADY_PANELS:
            panels.setdefault(key, []).append(q.expr)
    assert len(panels) >= 15, sorted(panels)  # the three dashboards still have their panels
    flat = dict(panels)
    while flat:
        end = min(time.time(), started + WITHIN)
        for key, exprs in list(flat.items()):
            if any(_moves(live, expr, started, end) for expr in exprs):
                del flat[key]
        if end >= started + WITHIN:
            break
        time.sleep(1.0)  # the scrape interval: new samples arrive once a second
    assert not flat, "flat after 2 minutes of demo:\n" + "\n".join(
        f"{d} / {p}" for d, p in sorted(flat))


def test_status_name_shows_a_plain_cuzk_document_whole(live: LiveStack) -> None:
    """The `example` engine serves cuzk's reference document: its workers' and jobs' full
    ids, each job's phases and the budget, as `cuzkd status example` prints them."""
    doc = json.loads(live.example_document.read_text())
    out = subprocess.run([sys.executable, "-m", "cuzkd", "status", "example", "--config",
                          str(live.supervisor.config)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].startswith("example  running  pid ")
    assert f"synthesis {doc['synthesis']['active']} / {doc['synthesis']['max_concurrent']}" \
        in out.stdout and "jobs in flight" not in out.stdout  # a plain document has no count
    for pipeline in doc["pipelines"]:
        (row,) = [ln.split() for ln in lines if ln.startswith(pipeline["job_id"] + " ")]
        assert row[1] == pipeline["proof_kind"]
        assert row[3] == f"{pipeline['partitions_done']}/{pipeline['total_partitions']}"
    for worker in doc["gpu_workers"]:
        (row,) = [ln.split() for ln in lines
                  if ln.split()[:2] == [str(worker["worker_id"]), str(worker["gpu_ordinal"])]]
        assert row[2] == worker["state"] and row[-1] == (worker["current_job"] or "-")
