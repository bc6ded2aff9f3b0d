"""Shared helpers for the ops tests: the metric contract, dashboard queries, PromQL checks.

Kept in one module so that the dashboards, the alert rules and (later) a live Prometheus check
all compare against the same list of metric names and resolve Grafana variables the same way.

Main entry points:

* :data:`CONTRACT` — every series name the exporter promises, with its type and labels.
* :func:`iter_panel_queries` — every (dashboard, panel title, expr, event_only) of the shipped
  dashboards, with Grafana's variables substituted as Grafana would.
* :func:`lint_expr` — the mechanical PromQL rules of ``grafana-dashboards.md`` for one query.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import promql_parser as pp
import yaml

REPO = Path(__file__).resolve().parents[2]
DASHBOARD_DIR = REPO / "grafana" / "dashboards"
#: What every panel and target names as its datasource (rule 1).
DASHBOARD_DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
#: Target key the generator sets on queries that may be empty on a healthy system.
EVENT_ONLY_KEY = "cuzkdEventOnly"

# ---------------------------------------------------------------------------------------------
# The exporter's metric contract (labels without the job/instance Prometheus adds at scrape).


@dataclass(frozen=True)
class Metric:
    kind: str  # "counter", "gauge" or "histogram"
    labels: frozenset[str]
    #: False for series made by recording rules: their labels are exactly ``labels`` (job and
    #: instance only where the rule kept them), not the exporter's plus job and instance.
    scraped: bool = True

    def series_labels(self) -> frozenset[str]:
        """Every label a stored series of this metric carries (``le`` aside)."""
        return self.labels | {"job", "instance"} if self.scraped else self.labels


def _m(kind: str, *labels: str) -> Metric:
    return Metric(kind, frozenset(labels))


_ENGINE_METRICS = {
    "cuzk_gpu_worker_busy": _m("gauge", "engine", "worker", "gpu"),
    "cuzk_gpu_worker_busy_seconds_total": _m("counter", "engine", "worker", "gpu"),
    "cuzk_gpu_worker_current_busy_seconds": _m("gauge", "engine", "worker", "gpu"),
    "cuzk_partition_phase_transitions_total": _m("counter", "engine", "proof_kind", "phase"),
    "cuzk_partitions": _m("gauge", "engine", "proof_kind", "phase"),
    "cuzk_partition_synth_duration_seconds": _m("histogram", "engine", "proof_kind"),
    "cuzk_partition_gpu_duration_seconds": _m("histogram", "engine", "proof_kind"),
    "cuzk_jobs_completed_total": _m("counter", "engine", "proof_kind"),
    "cuzk_job_duration_seconds": _m("histogram", "engine", "proof_kind"),
    "cuzk_jobs_failed_total": _m("counter", "engine", "proof_kind"),
    "cuzk_jobs_in_flight": _m("gauge", "engine"),
    "cuzk_stale_jobs": _m("gauge", "engine", "proof_kind"),
    "cuzk_gpu_worker_phantom_busy_total": _m("counter", "engine", "reason"),
    "cuzk_queue_depth": _m("gauge", "engine"),
    "cuzk_memory_budget_total_bytes": _m("gauge", "engine"),
    "cuzk_memory_budget_used_bytes": _m("gauge", "engine"),
    "cuzk_memory_budget_available_bytes": _m("gauge", "engine"),
    "cuzk_synthesis_active": _m("gauge", "engine"),
    "cuzk_synthesis_max_concurrent": _m("gauge", "engine"),
    "cuzk_synthesis_capacity": _m("gauge", "engine"),
    "cuzk_allocation_bytes": _m("gauge", "engine", "kind", "circuit"),
    "cuzk_buffers_in_flight": _m("gauge", "engine", "buffer"),
    "cuzk_buffers_started_total": _m("counter", "engine", "buffer"),
    "cuzk_pending_handles": _m("gauge", "engine"),
    "cuzk_gpu_memory_used_bytes": _m("gauge", "engine", "gpu"),
    "cuzk_gpu_memory_total_bytes": _m("gauge", "engine", "gpu"),
    "cuzk_gpu_memory_pool_bytes": _m("gauge", "engine", "gpu"),
    "cuzk_gpu_info": _m("gauge", "engine", "gpu", "name", "uuid"),
    "cuzk_engine_uptime_seconds": _m("gauge", "engine"),
    "cuzk_engine_backend_info": _m("gauge", "engine", "backend"),
    "cuzk_grpc_proofs_queued": _m("gauge", "engine", "proof_kind"),
    "cuzk_grpc_proofs_in_progress": _m("gauge", "engine", "proof_kind"),
    "cuzk_grpc_proofs_completed_total": _m("counter", "engine", "proof_kind"),
    "cuzk_grpc_proofs_failed_total": _m("counter", "engine", "proof_kind"),
    "cuzk_grpc_gpu_memory_total_bytes": _m("gauge", "engine", "gpu"),
    "cuzk_grpc_gpu_memory_free_bytes": _m("gauge", "engine", "gpu"),
    "cuzk_grpc_gpu_info": _m("gauge", "engine", "gpu", "name"),
    "cuzk_grpc_gpu_workers_proving": _m("gauge", "engine", "gpu", "proof_kind"),
}

_SUPERVISOR_METRICS = {
    "cuzkd_build_info": _m("gauge", "version"),
    "cuzkd_engine_up": _m("gauge", "engine"),
    "cuzkd_engine_state": _m("gauge", "engine", "state"),
    "cuzkd_engine_restarts_total": _m("counter", "engine"),
    "cuzkd_engine_exits_total": _m("counter", "engine", "cause"),
    "cuzkd_engine_stalls_total": _m("counter", "engine"),
    "cuzkd_engine_stalled": _m("gauge", "engine"),
    "cuzkd_proof_deadline_seconds": _m("gauge", "proof_kind"),
    "cuzkd_gpu_memory_used_bytes": _m("gauge", "gpu"),
    "cuzkd_gpu_memory_total_bytes": _m("gauge", "gpu"),
    "cuzkd_gpu_utilization_ratio": _m("gauge", "gpu"),
    "cuzkd_gpu_info": _m("gauge", "gpu", "name", "uuid"),
    "cuzkd_engine_start_time_seconds": _m("gauge", "engine"),
    "cuzkd_engine_resident_memory_bytes": _m("gauge", "engine"),
    "cuzkd_engine_cpu_seconds_total": _m("counter", "engine"),
    "cuzkd_engine_release_info": _m("gauge", "engine", "release"),
    "cuzkd_engine_descendants_killed_total": _m("counter", "engine"),
    "cuzkd_engine_stop_inflight_partitions_total": _m("counter", "engine", "reason"),
    "cuzkd_engine_jobs_lost_total": _m("counter", "engine", "kind"),
    "cuzkd_engine_drains_total": _m("counter", "engine", "result"),
    "cuzkd_zombies_reaped_total": _m("counter"),
    "cuzkd_binary_swaps_total": _m("counter", "result"),
    "cuzkd_binary_rollbacks_total": _m("counter", "result"),
    "cuzkd_binary_release_info": _m("gauge", "release"),
    "cuzkd_status_fetch_duration_seconds": _m("gauge", "engine"),
    "cuzkd_status_fetch_errors_total": _m("counter", "engine"),
    "cuzkd_engine_first_answer_seconds": _m("gauge", "engine"),
    "cuzkd_config_last_reload_successful": _m("gauge"),
    "cuzkd_config_last_reload_success_timestamp_seconds": _m("gauge"),
    "cuzkd_log_lines_dropped_total": _m("counter", "reason"),
    "cuzkd_metrics_connections_closed_total": _m("counter", "reason"),
    "cuzkd_metrics_web_config_last_reload_successful": _m("gauge"),
    "cuzkd_metrics_auth_refused_total": _m("counter"),
    "cuzkd_metrics_auth_throttled_total": _m("counter"),
    "cuzkd_metrics_tls_handshakes_total": _m("counter", "result"),
    "cuzkd_supervisor_freezes_total": _m("counter"),
    "cuzkd_supervisor_frozen_seconds_total": _m("counter"),
    "cuzkd_engine_health_loop_failures_total": _m("counter", "engine"),
    "cuzkd_engine_output_dropped_lines_total": _m("counter", "engine"),
    "cuzkd_engine_output_dropped_bytes_total": _m("counter", "engine"),
    "cuzkd_status_field_errors_total": _m("counter", "engine", "reason"),
    "cuzkd_label_values_dropped_total": _m("counter", "engine", "label"),
    "cuzkd_engine_grpc_errors_total": _m("counter", "engine", "reason"),
    # the front doors' (cuzkd.metrics.door_metrics): door = the door's first engine
    "cuzkd_door_engine_info": _m("gauge", "door", "engine"),
    "cuzkd_door_proofs_total": _m("counter", "door", "proof_kind", "priority", "result"),
    "cuzkd_door_proof_duration_seconds": _m("histogram", "door", "proof_kind"),
    "cuzkd_door_proof_queue_wait_seconds": _m("histogram", "door", "proof_kind"),
    "cuzkd_door_proof_srs_load_seconds": _m("histogram", "door", "proof_kind"),
    "cuzkd_door_proof_synthesis_seconds": _m("histogram", "door", "proof_kind"),
    "cuzkd_door_proof_gpu_compute_seconds": _m("histogram", "door", "proof_kind"),
    "cuzkd_door_held_calls": _m("gauge", "door"),
    "cuzkd_door_hold_duration_seconds": _m("histogram", "door", "proof_kind", "outcome"),
    "cuzkd_door_retries_total": _m("counter", "door", "reason"),
    "cuzkd_door_refusals_total": _m("counter", "door", "reason", "proof_kind"),
    "cuzkd_door_late_answers_total": _m("counter", "door", "proof_kind"),
    "cuzkd_door_post_wait_seconds": _m("histogram", "door", "proof_kind"),
    "cuzkd_door_drain_abandoned_total": _m("counter", "door", "reason"),
    "cuzkd_door_quarantined_requests": _m("gauge", "door"),
    "cuzkd_door_bounds_hit_total": _m("counter", "door", "bound"),
    "cuzkd_door_connections": _m("gauge", "door"),
    # the door process's own (cuzkd.supervisor.door.doors)
    "cuzkd_door_process_up": _m("gauge"),
    "cuzkd_door_process_restarts_total": _m("counter"),
    "cuzkd_door_process_exits_total": _m("counter", "cause"),
    "cuzkd_door_process_resident_memory_bytes": _m("gauge"),
    # prometheus_client's process collector (Linux)
    "process_cpu_seconds_total": _m("counter"),
    "process_resident_memory_bytes": _m("gauge"),
    "process_virtual_memory_bytes": _m("gauge"),
    "process_start_time_seconds": _m("gauge"),
    "process_open_fds": _m("gauge"),
    "process_max_fds": _m("gauge"),
    # prometheus_client's platform and GC collectors
    "python_info": _m("gauge", "implementation", "major", "minor", "patchlevel", "version"),
    "python_gc_objects_collected_total": _m("counter", "generation"),
    "python_gc_objects_uncollectable_total": _m("counter", "generation"),
    "python_gc_collections_total": _m("counter", "generation"),
}

#: Series only a supervisor that loaded NVML (a GPU host with nvidia-ml-py) exports.
NVML_SERIES: frozenset[str] = frozenset({
    "cuzkd_gpu_memory_used_bytes", "cuzkd_gpu_memory_total_bytes", "cuzkd_gpu_utilization_ratio",
    "cuzkd_gpu_info"})

#: Families (and the _bucket/_sum/_count series of the histograms) only a supervisor with a
#: front door (a cuzk engine behind one) exports: the live stack's engines have none.
DOOR_SERIES: frozenset[str] = frozenset(
    f"{name}{suffix}" for name, metric in _SUPERVISOR_METRICS.items()
    if name.startswith("cuzkd_door_")
    for suffix in ("", *(("_bucket", "_sum", "_count") if metric.kind == "histogram" else ())))

#: Metric families as the exporter declares them (histograms by base name).
CONTRACT: dict[str, Metric] = {**_SUPERVISOR_METRICS, **_ENGINE_METRICS}
#: Series Prometheus itself creates for every target (not in the exporter's output).
PROMETHEUS_SERIES: dict[str, Metric] = {"up": _m("gauge")}
#: The fleet recording rules: their series are what the Fleet dashboard queries.
RECORDING_RULES = REPO / "prometheus" / "cuzkd-recording.yml"


def series_contract() -> dict[str, Metric]:
    """Every series name a query may select: histograms expanded to _bucket/_sum/_count."""
    out: dict[str, Metric] = {}
    for name, metric in CONTRACT.items():
        if metric.kind == "histogram":
            out[f"{name}_bucket"] = Metric("counter", metric.labels | {"le"})
            out[f"{name}_sum"] = Metric("counter", metric.labels)
            out[f"{name}_count"] = Metric("counter", metric.labels)
        else:
            out[name] = metric
    return out


def recorded_series() -> dict[str, Metric]:
    """Every series the recording rules create, with the labels its rule keeps.

    Computed from the rules themselves (in order, so a rule reading an earlier record gets
    that record's labels), so the dashboards' lint cannot drift from the rule file.
    """
    doc = yaml.safe_load(RECORDING_RULES.read_text(encoding="utf-8"))
    out: dict[str, Metric] = {}
    for group in doc["groups"]:
        for rule in group["rules"]:
            labels = output_labels(parse(rule["expr"]), out)
            out[rule["record"]] = Metric("gauge", labels, scraped=False)
    return out


def recording_rule_exprs() -> dict[str, str]:
    """Record name → its expression on one line, in rule-file order."""
    doc = yaml.safe_load(RECORDING_RULES.read_text(encoding="utf-8"))
    return {rule["record"]: " ".join(rule["expr"].split())
            for group in doc["groups"] for rule in group["rules"]}


def inline_records(expr: str, records: dict[str, str] | None = None) -> str:
    """``expr`` with every recorded series replaced by the expression that records it.

    What a query costs without the recording rules (bench/fleet_scale.py), and what it must
    equal (the live tests compare both). Matchers on a recorded series are dropped: with
    "All" selected they are ``=~".+"``, which every raw series matches too.
    """
    records = recording_rule_exprs() if records is None else records
    pattern = re.compile(r"(?<![\w:])(" + "|".join(map(re.escape, records))
                         + r")(\{[^}]*\})?(?![\w:])")
    while True:
        replaced = pattern.sub(lambda m: f"({records[m.group(1)]})", expr)
        if replaced == expr:
            return expr
        expr = replaced


# ---------------------------------------------------------------------------------------------
# Grafana variable substitution and the shipped dashboards' queries.

_VARIABLE_RE = re.compile(r"\$(?:\{(\w+)(?::\w+)?\}|(\w+))")
LABEL_VARIABLES = ("job", "instance", "engine")


def substitute(expr: str, *, rate_interval: str = "1m", interval: str = "15s",
               range_: str = "1h", label_value: str | None = ".+") -> str:
    """Replace Grafana's variables as Grafana would with "All" selected.

    ``$__rate_interval`` is max(4 × scrape interval, $__interval + scrape interval) in Grafana;
    pass the value that fits the Prometheus being queried (e.g. ``"4s"`` for a 1 s scrape).
    ``label_value=None`` leaves ``$job``/``$instance``/``$engine`` in place (the lint checks
    them as written). An unknown variable raises KeyError, so a typo fails loudly.
    """
    values = {"__rate_interval": rate_interval, "__interval": interval, "__range": range_,
              "datasource": "cuzkd-prometheus"}

    def repl(match: re.Match[str]) -> str:
        name = match.group(1) or match.group(2)
        if name in LABEL_VARIABLES:
            return match.group(0) if label_value is None else label_value
        return values[name]

    return _VARIABLE_RE.sub(repl, expr)


class PanelQuery(NamedTuple):
    dashboard: str
    panel: str
    expr: str
    event_only: bool


def load_dashboards() -> dict[str, dict[str, Any]]:
    """File name → parsed JSON of every committed dashboard."""
    return {p.name: json.loads(p.read_text(encoding="utf-8"))
            for p in sorted(DASHBOARD_DIR.glob("*.json"))}


def iter_panel_targets() -> Iterator[tuple[dict[str, Any], dict[str, Any], dict[str, Any]]]:
    """(dashboard, panel, target) for every target of every shipped dashboard."""
    for dash in load_dashboards().values():
        for panel in dash["panels"]:
            for target in panel.get("targets", []):
                yield dash, panel, target


def iter_panel_queries(**substitutions: str) -> Iterator[PanelQuery]:
    """(dashboard title, panel title, expr, event_only) with variables substituted.

    ``event_only`` panels show series that exist only after an event (exits, failures,
    rollbacks) or on optional hardware (GPU memory): "returns no data" is fine for them.
    Keyword arguments go to :func:`substitute`.
    """
    for dash, panel, target in iter_panel_targets():
        yield PanelQuery(dash["title"], panel["title"], substitute(target["expr"], **substitutions),
                         bool(target.get(EVENT_ONLY_KEY, False)))


# ---------------------------------------------------------------------------------------------
# PromQL checks (rules 3-7 and 9 of grafana-dashboards.md), on the promql_parser AST.

#: Durations unlikely to be written by hand: a range equal to one of these came from a variable.
RATE_SENTINEL, RANGE_SENTINEL = "1237s", "86413s"
RATE_FUNCTIONS = frozenset({"rate", "irate", "increase"})
#: A gauge's range is read through these (a host last seen in a window: max_over_time of up).
GAUGE_RANGE_FUNCTIONS = frozenset({"max_over_time", "min_over_time", "avg_over_time",
                                   "last_over_time", "present_over_time"})
_LEGEND_RE = re.compile(r"\{\{\s*(\w+)\s*\}\}")


def parse(expr: str) -> pp.Expr:
    return pp.parse(expr)


def _norm(duration: str) -> str:
    """A duration as the parser prints it (``1237s`` → ``20m37s``)."""
    return str(pp.display_duration(pp.parse_duration(duration)))


def children(node: Any) -> list[Any]:
    """Direct sub-expressions of a node (the parser's own walk skips some)."""
    if isinstance(node, pp.AggregateExpr):
        return [node.expr] + ([node.param] if isinstance(node.param, pp.Expr) else [])
    if isinstance(node, pp.BinaryExpr):
        return [node.lhs, node.rhs]
    if isinstance(node, pp.ParenExpr | pp.UnaryExpr | pp.SubqueryExpr):
        return [node.expr]
    if isinstance(node, pp.Call):
        return [a for a in node.args if isinstance(a, pp.Expr)]
    if isinstance(node, pp.MatrixSelector):
        return [node.vector_selector]
    return []


def selectors(node: Any) -> Iterator[Any]:
    """Every VectorSelector in the tree (including those inside range selectors)."""
    if isinstance(node, pp.VectorSelector):
        yield node
    for child in children(node):
        yield from selectors(child)


def matchers(selector: Any) -> dict[str, tuple[str, str]]:
    """label → (operator, value) of a selector (operator as written: =, !=, =~, !~)."""
    ops = {"MatchOp.Equal": "=", "MatchOp.NotEqual": "!=", "MatchOp.Re": "=~",
           "MatchOp.NotRe": "!~"}
    return {m.name: (ops[str(m.op)], m.value) for m in selector.matchers.matchers}


def counter_misuse(node: Any, series: dict[str, Metric], ranges: frozenset[str] | None,
                   in_rate: bool = False) -> list[str]:
    """Rule 4/5 problems: counters outside rate/irate/increase, gauges inside (and counters
    inside the gauge range functions), odd ranges.

    ``ranges`` is the set of allowed range durations as the parser prints them (None: any, as
    in alert rules).
    """
    problems: list[str] = []
    if isinstance(node, pp.SubqueryExpr):
        problems.append("subquery")
    if isinstance(node, pp.Call) and node.func.name in RATE_FUNCTIONS | GAUGE_RANGE_FUNCTIONS:
        wanted = "counter" if node.func.name in RATE_FUNCTIONS else "gauge"
        for arg in node.args:
            if isinstance(arg, pp.MatrixSelector):
                name = arg.vector_selector.name
                if name in series and series[name].kind != wanted:
                    problems.append(f"{series[name].kind} {name} inside {node.func.name}()")
                duration = pp.display_duration(arg.range)
                if ranges is not None and duration not in ranges:
                    problems.append(f"fixed range [{duration}] on {name}")
            else:
                problems += counter_misuse(arg, series, ranges, in_rate=True)
        return problems
    if isinstance(node, pp.MatrixSelector):
        problems.append(f"range selector {node.vector_selector.name} outside rate/irate/increase")
        return problems
    if isinstance(node, pp.VectorSelector):
        metric = series.get(node.name or "")
        if metric is not None and metric.kind == "counter":
            problems.append(f"counter {node.name} outside rate/irate/increase")
        return problems
    for child in children(node):
        problems += counter_misuse(child, series, ranges, in_rate)
    return problems


def _is_scalar(node: Any) -> bool:
    if isinstance(node, pp.NumberLiteral):
        return True
    if isinstance(node, pp.ParenExpr | pp.UnaryExpr):
        return _is_scalar(node.expr)
    if isinstance(node, pp.Call):
        return bool(node.func.return_type == pp.ValueType.Scalar)
    if isinstance(node, pp.BinaryExpr):
        return _is_scalar(node.lhs) and _is_scalar(node.rhs)
    return False


class NotAggregated(Exception):
    """The query returns raw series: its labels are whatever the exporter adds."""


def output_labels(node: Any,
                  known: dict[str, Metric] | None = None) -> frozenset[str]:
    """Labels of the query's result, following PromQL's rules for aggregations and binops.

    Raises :class:`NotAggregated` where a raw selector's labels reach the result, or for
    ``without`` (not explicit). Selectors of series named in ``known`` (recorded series,
    whose labels are fixed by their rule) count as aggregated, with those labels.
    """
    if isinstance(node, pp.AggregateExpr):
        op = str(node.op)
        if op in ("topk", "bottomk"):
            return output_labels(node.expr, known)
        if node.modifier is None:
            return frozenset()
        if node.modifier.type != pp.AggModifierType.By:
            raise NotAggregated(f"{op} without (...) is not an explicit aggregation")
        return frozenset(node.modifier.labels)
    if isinstance(node, pp.ParenExpr | pp.UnaryExpr):
        return output_labels(node.expr, known)
    if isinstance(node, pp.Call):
        vectors = [a for a in node.args if isinstance(a, pp.Expr) and not _is_scalar(a)]
        if node.func.name == "histogram_quantile":
            return output_labels(node.args[1], known) - {"le"}
        if not vectors:
            return frozenset()
        if any(isinstance(v, pp.MatrixSelector) for v in vectors):
            raise NotAggregated(f"{node.func.name}() over raw series")
        return output_labels(vectors[0], known)
    if isinstance(node, pp.BinaryExpr):
        if _is_scalar(node.lhs):
            return output_labels(node.rhs, known)
        if _is_scalar(node.rhs):
            return output_labels(node.lhs, known)
        lhs, rhs = output_labels(node.lhs, known), output_labels(node.rhs, known)
        op, mod = str(node.op), node.modifier
        if op == "or":
            return lhs | rhs
        if op in ("and", "unless") or mod is None:
            return lhs
        if mod.card == pp.VectorMatchCardinality.OneToMany:
            return rhs | frozenset(mod.group_labels or ())
        if mod.card == pp.VectorMatchCardinality.ManyToOne:
            return lhs | frozenset(mod.group_labels or ())
        if mod.matching is None:
            return lhs
        labels = frozenset(mod.matching.labels)
        return labels if mod.matching.type == pp.LabelModifierType.Include else lhs - labels
    if isinstance(node, pp.VectorSelector) and known and node.name in known:
        return known[node.name].labels
    raise NotAggregated(f"raw series {node}")


def legend_labels(legend: str) -> frozenset[str]:
    return frozenset(_LEGEND_RE.findall(legend))


def lint_expr(raw: str, legend: str, series: dict[str, Metric]) -> list[str]:
    """Every rule a dashboard query must follow; returns the problems (empty when clean).

    ``raw`` is the expression as stored in the dashboard, with Grafana variables.
    """
    problems: list[str] = []
    try:
        tree = parse(substitute(raw, rate_interval=RATE_SENTINEL, range_=RANGE_SENTINEL))
        parse(substitute(raw))  # rule 6: parses with plausible values too
    except (ValueError, KeyError) as exc:
        return [f"does not parse: {exc}"]
    # Rule 3 is checked with the variables left in place (their regex text is kept as written).
    with_vars = parse(substitute(raw, rate_interval=RATE_SENTINEL, range_=RANGE_SENTINEL,
                                 label_value=None))
    for sel in selectors(with_vars):
        name = sel.name or ""
        if name not in series:
            problems.append(f"metric {name!r} is not in the exporter contract")
            continue
        have = matchers(sel)
        wanted = [label for label in LABEL_VARIABLES if label in series[name].series_labels()]
        for label in wanted:
            if have.get(label) != ("=~", f"${label}"):
                problems.append(f'{name}: missing {label}=~"${label}"')
        for label in LABEL_VARIABLES:
            if label in have and label not in series[name].series_labels():
                problems.append(f"{name} has no {label} label")
    problems += counter_misuse(tree, series, frozenset({_norm(RATE_SENTINEL),
                                                        _norm(RANGE_SENTINEL)}))
    try:
        labels = output_labels(tree, {n: m for n, m in series.items() if not m.scraped})
        if labels != legend_labels(legend):
            problems.append(f"aggregates by {sorted(labels)} but legend {legend!r} shows "
                            f"{sorted(legend_labels(legend))}")
    except NotAggregated as exc:
        problems.append(f"not explicitly aggregated: {exc}")
    for node in _walk(tree):
        if isinstance(node, pp.Call) and node.func.name == "histogram_quantile":
            problems += _quantile_problems(node)
    return problems


def _walk(node: Any) -> Iterator[Any]:
    yield node
    for child in children(node):
        yield from _walk(child)


def _quantile_problems(node: Any) -> list[str]:
    """Rule 9: histogram_quantile(φ, sum by (le, …) (rate(x_bucket[$__rate_interval])))."""
    inner = node.args[1]
    if not (isinstance(node.args[0], pp.NumberLiteral) and isinstance(inner, pp.AggregateExpr)
            and str(inner.op) == "sum" and inner.modifier is not None
            and "le" in inner.modifier.labels and isinstance(inner.expr, pp.Call)
            and inner.expr.func.name == "rate"):
        return ["histogram_quantile must wrap sum by (le, ...) (rate(x_bucket[...]))"]
    return []


def heatmap_problems(raw: str) -> list[str]:
    """Rule 9: sum by (le) (increase(x_bucket[$__rate_interval]))."""
    tree = parse(substitute(raw, rate_interval=RATE_SENTINEL))
    ok = (isinstance(tree, pp.AggregateExpr) and str(tree.op) == "sum"
          and tree.modifier is not None and list(tree.modifier.labels) == ["le"]
          and isinstance(tree.expr, pp.Call) and tree.expr.func.name == "increase"
          and isinstance(tree.expr.args[0], pp.MatrixSelector)
          and (tree.expr.args[0].vector_selector.name or "").endswith("_bucket")
          and pp.display_duration(tree.expr.args[0].range) == _norm(RATE_SENTINEL))
    shape = "sum by (le) (increase(x_bucket[$__rate_interval]))"
    return [] if ok else [f"heatmap query is not {shape}: {raw}"]
