"""The Fleet summary dashboard on the live stack: reading recorded series gives what the raw
series give. Each query, as shipped (reading the recording rules' output) and with every
recorded series replaced by the expression that records it (what bench/fleet_scale.py times
as "without recording rules"), must return the same series, and the host and engine counts
the same values. That the rules compute what their names claim is promtool's part
(prometheus/tests/cuzkd-recording.test.yml); this checks, on live series, that the chain of
rules reading earlier rules and the inlining agree, so the benchmark compares like with like.
"""

from __future__ import annotations

import json

from support import ops
from support.live_stack import LiveStack
from support.waiting import wait_until

SUMMARY = ops.DASHBOARD_DIR / "cuzkd-fleet-summary.json"
#: Stat panels whose values are counts: recorded and raw must agree exactly, not just in labels.
COUNTS = {"Hosts up", "Hosts", "Engines up", "Engines"}


def _queries() -> list[tuple[str, str]]:
    dash = json.loads(SUMMARY.read_text(encoding="utf-8"))
    return [(panel["title"], ops.substitute(target["expr"]))
            for panel in dash["panels"] for target in panel["targets"]]


def test_recorded_and_raw_fleet_queries_agree(live: LiveStack) -> None:
    live.prometheus.wait_for("count(instance_engine_gpu:cuzk_gpu_worker_busy:ratio_rate1m)",
                             bool, 60, "the recording rules' first results")
    queries = _queries()
    assert len(queries) >= 15

    def disagreements() -> list[str]:
        out = []
        for panel, expr in queries:
            recorded = live.prometheus.values(expr)
            raw = live.prometheus.values(ops.inline_records(expr))
            if set(recorded) != set(raw):
                out.append(f"{panel}: {sorted(recorded)} != {sorted(raw)}")
            elif panel in COUNTS and recorded != raw:
                out.append(f"{panel}: {recorded} != {raw}")
        return out

    # Rules run every second; a query between a scrape and the next evaluation may see one
    # side a step behind, so agreement is awaited, and the last disagreement reported.
    last: list[list[str]] = [[]]

    def agree() -> bool:
        last[0] = disagreements()
        return not last[0]

    try:
        wait_until(agree, 20, "recorded and raw fleet queries to agree", interval=0.5)
    except AssertionError:
        raise AssertionError("\n".join(last[0])) from None
