"""Issue 7 on a live stack: every dashboard query and alert rule against real series.

The static ops tests (tests/ops) check the dashboards and rules against the metric contract;
these check the contract, the dashboards and the rules against what a running supervisor with
busy engines really exports, through a real Prometheus, so none of the three can drift from
the exporter.
"""

from __future__ import annotations

import contextlib
from typing import Any

import yaml
from support import ops
from support.live import Exposition
from support.live_stack import DEMO_DOOR_PANELS, RULE_FILES, LiveStack
from support.waiting import wait_until

#: Grafana's $__rate_interval is max(4 x scrape interval, $__interval + scrape interval): 4s
#: for the 1 s scrape interval of the live Prometheus; $__interval is at least the scrape
#: interval; $__range is a dashboard range the ~30 s of history covers.
GRAFANA_VARIABLES = {"rate_interval": "4s", "interval": "1s", "range_": "30s"}
HISTORY_SCRAPES = 30

def _wait_for_history(live: LiveStack) -> None:
    live.prometheus.wait_for(f'count_over_time(up{{job="cuzkd"}}[{HISTORY_SCRAPES + 10}s])',
                             lambda v: v and min(v.values()) >= HISTORY_SCRAPES,
                             HISTORY_SCRAPES + 60, f"{HISTORY_SCRAPES} s of scrapes")


def test_every_panel_query_is_accepted_and_has_data(live: LiveStack) -> None:
    """After ~30 s of load, each panel target evaluates, and each non-event panel has data
    (and each of :data:`DEMO_DOOR_PANELS`: the demo's doors are busy).

    A ``rate(x[4s])`` may briefly be empty if a scrape was slow on a loaded machine, so panels
    without data are re-queried until a deadline; a rejected query is final.
    """
    _wait_for_history(live)
    queries = list(ops.iter_panel_queries(**GRAFANA_VARIABLES))
    assert len(queries) > 30, "the dashboards have lost their panels"
    assert {q.panel for q in queries} >= DEMO_DOOR_PANELS, "a front-door panel was renamed"
    rejected = []
    pending = {}
    for q in queries:
        answer = live.prometheus.api("query", query=q.expr)
        if answer.get("status") != "success":
            rejected.append(f"{q.dashboard} / {q.panel}: {answer.get('error')}\n  {q.expr}")
        elif (not q.event_only or q.panel in DEMO_DOOR_PANELS) \
                and not answer["data"]["result"]:
            pending[q.expr] = f"{q.dashboard} / {q.panel}"
    assert not rejected, "\n".join(rejected)

    def all_have_data() -> bool:
        for expr in list(pending):
            if live.prometheus.query(expr):
                del pending[expr]
        return not pending

    with contextlib.suppress(AssertionError):  # reported below, naming the panels
        wait_until(all_have_data, 15, "data in every panel", interval=0.25)
    assert not pending, "no data:\n" + "\n".join(f"{w}\n  {e}" for e, w in pending.items())


def _rule_exprs() -> list[str]:
    docs = [yaml.safe_load(path.read_text(encoding="utf-8")) for path in RULE_FILES]
    return [rule["expr"] for doc in docs for group in doc["groups"] for rule in group["rules"]]


def _metric_names(exprs: list[str]) -> set[str]:
    return {sel.name for expr in exprs for sel in ops.selectors(ops.parse(expr)) if sel.name}


def test_every_metric_in_dashboards_and_rules_is_exported(live: LiveStack) -> None:
    dashboard_exprs = [q.expr for q in ops.iter_panel_queries(**GRAFANA_VARIABLES)]
    used = _metric_names(dashboard_exprs + _rule_exprs())
    assert "cuzk_partition_gpu_duration_seconds_bucket" in used  # the extraction works
    exported = live.scrape().sample_names() | set(ops.PROMETHEUS_SERIES)
    # without NVML (no GPU, or no nvidia-ml-py) the supervisor has no GPU view of its own
    hardware = set() if exported & ops.NVML_SERIES else ops.NVML_SERIES
    assert used - exported - set(ops.recorded_series()) - hardware - ops.DOOR_SERIES == set()


def test_alert_rules_evaluate_cleanly_on_live_series(live: LiveStack) -> None:
    """Prometheus evaluates every shipped rule against the live series without an error."""
    def evaluated() -> list[dict[str, Any]] | None:
        groups = live.prometheus.data("rules")["groups"]
        rules = [r for g in groups for r in g["rules"]]
        return rules if all(r["health"] != "unknown" for r in rules) else None  # unknown: not yet

    found = wait_until(evaluated, 20, "every rule evaluated", interval=0.25)
    assert len(found) == len(_rule_exprs())
    assert {r["name"]: (r["health"], r.get("lastError", "")) for r in found} == {
        r["name"]: ("ok", "") for r in found}


def _labels_mismatch(s: Exposition) -> dict[str, tuple[list[str], list[str]]]:
    return {name: (sorted(labels), sorted(ops.CONTRACT[name].labels))
            for name, labels in s.family_labels.items()
            if name in ops.CONTRACT and labels != ops.CONTRACT[name].labels}


def test_contract_is_exactly_the_live_families(live: LiveStack) -> None:
    """tests/ops' metric contract lists every live family with its type and labels, and only
    those, so the static dashboard/rule lints cannot drift from the exporter."""
    s = live.scrape()
    contract = ops.CONTRACT
    assert set(s.families) - set(contract) == set(), "live families missing from the contract"
    hardware = set() if set(s.families) & ops.NVML_SERIES else ops.NVML_SERIES
    absent = set(contract) - set(s.families) - hardware - ops.DOOR_SERIES
    assert absent == set(), "contract families not exported"
    assert {n: t for n, t in s.families.items() if contract[n].kind != t} == {}
    assert _labels_mismatch(s) == {}
