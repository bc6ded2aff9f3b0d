#!/usr/bin/env python3
"""Generate cuzkd's Grafana dashboards into ``grafana/dashboards/*.json``.

Why generate: the dashboards share one set of template variables, one label-selector shape and
a handful of panel kinds. Writing each JSON by hand lets them drift (a query without
``instance=~"$instance"``, a panel without a unit); here every selector comes from :func:`sel`
and every panel from one builder per panel type, so the rules in
``shared/reference/grafana-dashboards.md`` hold by construction. The generated JSON is
committed (Grafana provisions files, not Python) and ``tests/ops/test_dashboards.py``
regenerates it and compares byte for byte, then lints the JSON itself.

Run ``.venv/bin/python grafana/generate.py`` after an edit (``--check`` only compares). Standard
library only, plus the dependency-free :mod:`cuzkd.states` (the engine states it draws are the
exporter's own), so any Python that can import the checkout's ``cuzkd`` runs it.

Panels whose series exist only after an event (an engine exit, a failed job) or on optional
hardware carry ``"cuzkdEventOnly": true`` on the target: a live check may find them empty on a
healthy system. Grafana ignores the key.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cuzkd.kinds import ProofKind
from cuzkd.states import State

OUT_DIR = Path(__file__).resolve().parent / "dashboards"

#: Grafana 10.4/11 dashboard schema version.
SCHEMA_VERSION = 39
#: The fixed uid of the provisioned datasource (grafana/provisioning/datasources/cuzkd.yaml).
DATASOURCE_UID = "cuzkd-prometheus"
DATASOURCE_NAME = "cuzkd Prometheus"
DS = {"type": "prometheus", "uid": "${datasource}"}
EVENT_ONLY_KEY = "cuzkdEventOnly"
RATE = "$__rate_interval"
#: Label names grouped on in every per-engine panel (a fleet has one cuzkd per GPU host).
BY_ENGINE = "instance, engine"
LEGEND_ENGINE = "{{instance}} {{engine}}"
#: The proof kinds with chain deadlines, which cuzk's /status never shows (its gRPC does).
POST_KINDS = f"{ProofKind.WINDOW_POST}|{ProofKind.WINNING_POST}"

Json = dict[str, Any]


# ---------------------------------------------------------------------------------------------
# Queries


def sel(metric: str, engine: bool = True, kinds: str | None = None, **matchers: str) -> str:
    """``metric{job=~"$job", instance=~"$instance"[, engine=~"$engine"], k="v"...}``.

    ``engine=False`` for the supervisor's own series, which carry no ``engine`` label;
    ``kinds``: a regex the ``proof_kind`` must match (:data:`POST_KINDS`).
    """
    parts = ['job=~"$job"', 'instance=~"$instance"']
    if engine:
        parts.append('engine=~"$engine"')
    if kinds is not None:
        parts.append(f'proof_kind=~"{kinds}"')
    parts += [f'{k}="{v}"' for k, v in matchers.items()]
    return f"{metric}{{{', '.join(parts)}}}"


def fleet_sel(metric: str) -> str:
    """``metric{job=~"$job"}``: a fleet-level recorded series, which has no ``instance``."""
    return f'{metric}{{job=~"$job"}}'


def rate(metric: str, engine: bool = True, fn: str = "rate", window: str = RATE,
         kinds: str | None = None, **matchers: str) -> str:
    """``rate(metric{...}[$__rate_interval])`` (or irate/increase, or ``$__range``)."""
    return f"{fn}({sel(metric, engine, kinds, **matchers)}[{window}])"


def agg(by: str, inner: str, op: str = "sum") -> str:
    """``sum by (by) (inner)``: every panel aggregates explicitly, matching its legend."""
    return f"{op} by ({by}) ({inner})"


def quantile(q: float, histogram: str, by: str, engine: bool = True,
             kinds: str | None = None) -> str:
    """``histogram_quantile(q, sum by (le, by) (rate(histogram_bucket[$__rate_interval])))``
    (``kinds``: as :func:`sel`'s)."""
    return ("histogram_quantile("
            f"{q}, {agg(f'le, {by}', rate(histogram + '_bucket', engine, kinds=kinds))})")


@dataclass(frozen=True)
class Q:
    """One panel query: the expression, its legend and whether it may be empty when healthy."""

    expr: str
    legend: str
    event_only: bool = False
    instant: bool = False
    fmt: str = "time_series"


def _targets(queries: Sequence[Q]) -> list[Json]:
    out = []
    for i, q in enumerate(queries):
        t: Json = {
            "datasource": DS,
            "refId": chr(ord("A") + i),
            "expr": q.expr,
            "legendFormat": q.legend,
            "format": q.fmt,
            "range": not q.instant,
            "instant": q.instant,
            "editorMode": "code",
        }
        if q.event_only:
            t[EVENT_ONLY_KEY] = True
        out.append(t)
    return out


# ---------------------------------------------------------------------------------------------
# Panels: one builder per panel type; gridPos is filled in by _layout.


def _panel(kind: str, title: str, description: str, queries: Sequence[Q], unit: str,
           w: int, h: int, *, minimum: float | None = None, maximum: float | None = None,
           custom: Json | None = None, options: Json | None = None,
           mappings: list[Json] | None = None, thresholds: list[Json] | None = None,
           links: list[Json] | None = None) -> Json:
    if unit == "percentunit":  # a ratio panel always shows the whole 0..1 scale
        minimum, maximum = 0, 1
    defaults: Json = {"unit": unit}
    if minimum is not None:
        defaults["min"] = minimum
    if maximum is not None:
        defaults["max"] = maximum
    defaults["color"] = {"mode": "thresholds" if kind in ("stat", "state-timeline")
                         else "palette-classic"}
    defaults["thresholds"] = {"mode": "absolute",
                              "steps": thresholds or [{"color": "green", "value": None}]}
    defaults["mappings"] = mappings or []
    if links:
        defaults["links"] = links
    if custom:
        defaults["custom"] = custom
    return {
        "type": kind,
        "title": title,
        "description": description,
        "datasource": DS,
        "gridPos": {"h": h, "w": w, "x": 0, "y": 0},
        "fieldConfig": {"defaults": defaults, "overrides": []},
        "options": options or {},
        "targets": _targets(queries),
    }


def timeseries(title: str, description: str, queries: Sequence[Q], unit: str, *,
               stack: bool = False, w: int = 12, h: int = 8, bars: bool = False) -> Json:
    """Lines (or stacked areas, or bars for event counts) with a table legend."""
    custom = {
        "drawStyle": "bars" if bars else "line",
        "lineWidth": 1,
        "fillOpacity": 60 if stack or bars else 10,
        "showPoints": "never",
        "spanNulls": False,
        "stacking": {"mode": "normal" if stack else "none", "group": "A"},
    }
    options = {
        "legend": {"displayMode": "table", "placement": "bottom", "showLegend": True,
                   "calcs": ["lastNotNull", "max"]},
        "tooltip": {"mode": "multi", "sort": "desc"},
    }
    return _panel("timeseries", title, description, queries, unit, w, h, custom=custom,
                  options=options)


def events_by(title: str, description: str, counter: str, label: str) -> Json:
    """Bars of an engine counter's increase per rate interval by ``label``: series that exist
    only once the event happened (event_only)."""
    return timeseries(title, description,
                      [Q(agg(f"{BY_ENGINE}, {label}", rate(counter, fn="increase")),
                         f"{LEGEND_ENGINE} {{{{{label}}}}}", event_only=True)], "short",
                      bars=True)


def stat(title: str, description: str, queries: Sequence[Q], unit: str, *, w: int = 6,
         h: int = 5, thresholds: list[Json] | None = None, text_mode: str = "value_and_name",
         links: list[Json] | None = None) -> Json:
    """Current values, one per series, coloured by thresholds."""
    options = {
        "reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
        "colorMode": "value",
        "graphMode": "none",
        "textMode": text_mode,
        "justifyMode": "auto",
        "orientation": "auto",
    }
    return _panel("stat", title, description, queries, unit, w, h, options=options,
                  thresholds=thresholds, links=links)


def state_timeline(title: str, description: str, queries: Sequence[Q],
                   states: Sequence[tuple[int, str, str]], *, w: int = 24, h: int = 9) -> Json:
    """One row per series; ``states`` maps each value to (text, colour)."""
    mappings = [{"type": "value", "options": {
        str(value): {"text": text, "color": color, "index": i}
        for i, (value, text, color) in enumerate(states)}}]
    options = {
        "showValue": "never",
        "mergeValues": True,
        "alignValue": "left",
        "rowHeight": 0.9,
        "legend": {"displayMode": "list", "placement": "bottom", "showLegend": True},
        "tooltip": {"mode": "single", "sort": "none"},
    }
    return _panel("state-timeline", title, description, queries, "none", w, h,
                  custom={"fillOpacity": 80, "lineWidth": 0}, options=options,
                  mappings=mappings)


def heatmap(title: str, description: str, histogram: str, *, w: int = 12, h: int = 8) -> Json:
    """Bucket counts per interval from a Prometheus histogram (no client-side re-bucketing)."""
    query = Q(agg("le", rate(histogram + "_bucket", fn="increase")), "{{le}}", fmt="heatmap")
    options = {
        "calculate": False,
        "cellGap": 1,
        "color": {"mode": "scheme", "scheme": "Oranges", "scale": "exponential",
                  "exponent": 0.5, "steps": 64, "fill": "dark-orange", "reverse": False},
        "filterValues": {"le": 1e-9},
        "rowsFrame": {"layout": "auto"},
        "yAxis": {"axisPlacement": "left", "unit": "s", "reverse": False},
        "cellValues": {"unit": "short"},
        "tooltip": {"mode": "single", "yHistogram": True, "showColorScale": False},
        "legend": {"show": True},
        "exemplars": {"color": "rgba(255,0,255,0.7)"},
    }
    return _panel("heatmap", title, description, [query], "short", w, h, options=options)


def _layout(panels: Iterable[Json]) -> list[Json]:
    """Place panels left to right on Grafana's 24-column grid, wrapping to a new row."""
    out, x, y, row_h = [], 0, 0, 0
    for pid, panel in enumerate(panels, start=1):
        w, h = panel["gridPos"]["w"], panel["gridPos"]["h"]
        if x + w > 24:
            x, y, row_h = 0, y + row_h, 0
        out.append({"id": pid, **panel, "gridPos": {"h": h, "w": w, "x": x, "y": y}})
        x, row_h = x + w, max(row_h, h)
    return out


# ---------------------------------------------------------------------------------------------
# Dashboards


def _variable(name: str, label: str, query: str) -> Json:
    return {
        "name": name,
        "label": label,
        "type": "query",
        "datasource": DS,
        "query": {"query": query, "refId": f"cuzkd-{name}"},
        "definition": query,
        "refresh": 2,  # on time-range change: new hosts and engines appear without a reload
        "multi": True,
        "includeAll": True,
        "allValue": ".+",
        "current": {"selected": True, "text": ["All"], "value": ["$__all"]},
        "options": [],
        "regex": "",
        "sort": 1,
        "hide": 0,
    }


TEMPLATING = [
    {
        "name": "datasource",
        "label": "Data source",
        "type": "datasource",
        "query": "prometheus",
        "current": {"selected": False, "text": DATASOURCE_NAME, "value": DATASOURCE_UID},
        "options": [],
        "refresh": 1,
        "regex": "",
        "hide": 0,
    },
    _variable("job", "Job", "label_values(cuzkd_build_info, job)"),
    _variable("instance", "Instance", 'label_values(cuzkd_build_info{job=~"$job"}, instance)'),
    _variable("engine", "Engine",
              'label_values(cuzkd_engine_up{job=~"$job", instance=~"$instance"}, engine)'),
]


def dashboard(uid: str, title: str, description: str, tags: Sequence[str],
              panels: Iterable[Json]) -> Json:
    return {
        "uid": uid,
        "title": title,
        "description": description,
        "tags": ["cuzkd", *tags],
        "editable": False,
        "graphTooltip": 1,
        "schemaVersion": SCHEMA_VERSION,
        "version": 1,
        "time": {"from": "now-1h", "to": "now"},
        "refresh": "30s",
        "timezone": "",
        "fiscalYearStartMonth": 0,
        "liveNow": False,
        "timepicker": {},
        "annotations": {"list": [{
            "builtIn": 1, "datasource": {"type": "grafana", "uid": "-- Grafana --"},
            "enable": True, "hide": True, "iconColor": "rgba(0, 211, 255, 1)",
            "name": "Annotations & Alerts", "type": "dashboard"}]},
        "links": [{"title": "cuzkd dashboards", "type": "dashboards", "tags": ["cuzkd"],
                   "asDropdown": True, "includeVars": True, "keepTime": True,
                   "targetBlank": False, "icon": "external link", "tooltip": "", "url": ""}],
        "templating": {"list": TEMPLATING},
        "panels": _layout(panels),
    }


#: The colour each engine state is drawn in.
STATE_COLOURS = {State.STARTING: "blue", State.RUNNING: "green", State.BACKOFF: "orange",
                 State.STOPPING: "purple", State.STOPPED: "text", State.FAILED: "red"}
#: (code, state, colour) of every engine state: ``cuzkd_engine_state`` is one series per state,
#: folded into one value per engine (the state's code) for the state timeline.
ENGINE_STATES = [(code, state.value, STATE_COLOURS[state])
                 for code, state in enumerate(State, start=1)]


def fleet() -> Json:
    """Is every engine on every host up, and is anything restarting or being swapped?"""
    state_code = agg(BY_ENGINE, " or ".join(
        f"{sel('cuzkd_engine_state', state=name)} * {code}" for code, name, _ in ENGINE_STATES))
    panels = [
        stat("Engines up", "Engines whose process runs and whose status answered the last "
             "scrape, per host. Bad: fewer than the total — an engine is down, starting or "
             "not answering /status.",
             [Q(agg("instance", sel("cuzkd_engine_up")), "{{instance}}")], "short",
             thresholds=[{"color": "red", "value": None}, {"color": "green", "value": 1}]),
        stat("Engines configured", "Engines the supervisor manages, per host (the total the "
             "\"Engines up\" figure should reach). Bad: a host with fewer engines than GPUs.",
             [Q(agg("instance", sel("cuzkd_engine_up"), op="count"), "{{instance}}")],
             "short"),
        stat("Engines in backoff (crash-looping)", "Engines waiting to be restarted after "
             "exiting or failing their health check, per host. Bad: anything above 0 for more "
             "than a minute — the engine keeps crashing; see exit causes below and its logs.",
             [Q(agg("instance", sel("cuzkd_engine_state", state=State.BACKOFF)), "{{instance}}")],
             "short", thresholds=[{"color": "green", "value": None},
                                  {"color": "red", "value": 1}]),
        stat("Active binary release", "The engine binary release each supervisor runs (set by "
             "`cuzkd swap`). Bad: hosts of one fleet on different releases after a rollout, "
             "or no value where a release was expected.",
             [Q(agg("instance, release", sel("cuzkd_binary_release_info", engine=False),
                    op="max"), "{{instance}} {{release}}", event_only=True)],
             "short", text_mode="name"),
        state_timeline("Engine states", "Lifecycle state of each engine over time. Bad: long "
                       "orange (backoff) or red (failed) stretches, or flapping between "
                       "starting and backoff.",
                       [Q(state_code, LEGEND_ENGINE)], ENGINE_STATES, h=8),
        timeseries("Engine restarts", "Restarts per engine in each rate interval. Bad: any "
                   "restart you did not ask for; more than 3 in 15 minutes fires "
                   "CuzkdEngineCrashLooping.",
                   [Q(agg(BY_ENGINE, rate("cuzkd_engine_restarts_total", fn="increase")),
                      LEGEND_ENGINE)], "short", bars=True),
        timeseries("Engine exits by cause", "Why engine processes ended, per rate interval. "
                   "On purpose: stopped (operator, reload, shutdown), swap (binary swap). "
                   "Killed by cuzkd: unhealthy (status silent), stalled (no progress), "
                   "start_timeout. By the engine or the kernel: oom_killed, core_dumped, "
                   "signal_X, daemonized (exited 0 leaving its children: run it in the "
                   "foreground), exit_N; a cuzk engine's panic, error (Error: ...) and usage "
                   "(its command line refused). Bad: anything but stopped and swap; `cuzkd "
                   "status ENGINE` shows the last stderr lines and, for cuzk, what it said.",
                   [Q(agg(f"{BY_ENGINE}, cause",
                          rate("cuzkd_engine_exits_total", fn="increase")),
                      f"{LEGEND_ENGINE} {{{{cause}}}}", event_only=True)], "short", bars=True),
        stat("Restarts in the time range", "Restarts per engine over the whole selected time "
             "range. Bad: 3 or more — the engine is crash-looping or being restarted by hand.",
             [Q(agg(BY_ENGINE, rate("cuzkd_engine_restarts_total", fn="increase",
                                    window="$__range")), LEGEND_ENGINE, instant=True)],
             "short", w=12, thresholds=[{"color": "green", "value": None},
                                        {"color": "orange", "value": 1},
                                        {"color": "red", "value": 3}]),
        timeseries("Binary swaps by result", "Engine binary swaps per rate interval: ok, "
                   "rolled_back (the new release failed its health check and the previous one "
                   "was restored) or refused. Bad: any rolled_back or refused.",
                   [Q(agg("instance, result",
                          rate("cuzkd_binary_swaps_total", engine=False, fn="increase")),
                      "{{instance}} {{result}}")], "short", bars=True),
        events_by("Work lost to restarts", "Partitions in flight (synthesizing, "
                  "synth_done or on a GPU) when cuzkd stopped an engine, per rate interval, "
                  "by reason: operator (cuzkd stop/restart), reload, swap, stall, shutdown. "
                  "Every stop drains first (the bundled engine finishes its accepted jobs; "
                  "an engine with a status is stopped at a quiet moment), so this stays at 0 "
                  "unless a drain timed out, drain = \"none\", or a stall killed the engine. "
                  "Bad: anything but stall — raise drain_timeout (docs/supervisor.md).",
                  "cuzkd_engine_stop_inflight_partitions_total", "reason"),
        events_by("Drains by result", "Stop-sequence drains per rate interval: clean (the "
                  "engine finished its work, or a quiet moment came) or timeout "
                  "(drain_timeout elapsed and the stop signal went out with work in flight). "
                  "Bad: any timeout.", "cuzkd_engine_drains_total", "result"),
        timeseries("Engine uptime", "Time since each engine process started. Bad: a saw-tooth "
                   "that keeps returning to zero — the engine restarts.",
                   [Q(agg(BY_ENGINE, f"time() - {sel('cuzkd_engine_start_time_seconds')}",
                          op="max"), LEGEND_ENGINE)], "s"),
        timeseries("Engine resident memory", "Resident memory of each engine process. Bad: "
                   "steady growth (a leak) or values near the host's RAM (the OOM killer is "
                   "next).",
                   [Q(agg(BY_ENGINE, sel("cuzkd_engine_resident_memory_bytes")),
                      LEGEND_ENGINE)], "bytes"),
        timeseries("Engine CPU (cores)", "CPU time each engine uses per second, in cores. "
                   "Synthesis is CPU-bound, so this follows the synthesis load. Bad: near zero "
                   "while jobs are queued (stuck), or the host's core count for long (starved).",
                   [Q(agg(BY_ENGINE, rate("cuzkd_engine_cpu_seconds_total")), LEGEND_ENGINE)],
                   "short"),
        timeseries("Status fetch duration", "How long the last GET /status of each engine "
                   "took. Bad: approaching the scrape interval — the engine is overloaded and "
                   "its metrics go stale.",
                   [Q(agg(BY_ENGINE, sel("cuzkd_status_fetch_duration_seconds"), op="max"),
                      LEGEND_ENGINE)], "s"),
        timeseries("Status fetch errors", "Failed GET /status per second per engine. Bad: "
                   "anything above 0 — the engine's metrics are missing; CuzkdStatusFetchFailing "
                   "fires after 5 minutes.",
                   [Q(agg(BY_ENGINE, rate("cuzkd_status_fetch_errors_total")), LEGEND_ENGINE)],
                   "ops"),
        timeseries("Zombies reaped", "Orphaned descendant processes the supervisor reaped, per "
                   "rate interval. Bad: a steady stream — an engine leaks child processes.",
                   [Q(agg("instance", rate("cuzkd_zombies_reaped_total", engine=False,
                                           fn="increase")), "{{instance}}")], "short",
                   bars=True),
        timeseries("Supervisor resident memory", "Resident memory of the cuzkd supervisor "
                   "itself. Bad: steady growth — the supervisor leaks.",
                   [Q(agg("instance", sel("process_resident_memory_bytes", engine=False)),
                      "{{instance}}")], "bytes"),
    ]
    return dashboard("cuzkd-fleet", "cuzkd / Fleet overview",
                     "Engines up, lifecycle states, restarts, exits, binary swaps and the work "
                     "restarts lost, per host.",
                     ["fleet"], panels)


def gpu_workers() -> Json:
    """Are the GPUs proving, and are they idle while work waits?"""
    busy = rate("cuzk_gpu_worker_busy_seconds_total")
    worker_legend = f"{LEGEND_ENGINE} worker {{{{worker}}}}"
    idle_workers = agg(BY_ENGINE, f"{sel('cuzk_gpu_worker_busy')} == 0", op="count")
    waiting = (f"({agg(BY_ENGINE, sel('cuzk_queue_depth'), op='max')} > 0) or on ({BY_ENGINE}) "
               f"({agg(BY_ENGINE, sel('cuzk_partitions', phase='synth_done'))} > 0)")
    panels = [
        state_timeline("Worker busy / idle", "Each GPU worker over time: green while it proves "
                       "a partition on the GPU, orange while idle. Bad: orange rows while the "
                       "queue is not empty (see below), or every row orange under load.",
                       [Q(agg(f"{BY_ENGINE}, worker", sel("cuzk_gpu_worker_busy"), op="max"),
                          worker_legend)], [(0, "idle", "orange"), (1, "busy", "green")]),
        timeseries("Utilization per worker", "Share of time each worker spent proving (busy "
                   "seconds per second). Bad: low utilization while partitions wait in "
                   "synth_done — the GPU side is starved or stuck.",
                   [Q(agg(f"{BY_ENGINE}, worker", busy), worker_legend)], "percentunit"),
        timeseries("Utilization per GPU", "Average utilization of the workers sharing each GPU. "
                   "Bad: one GPU far below the others (a stuck worker or an unbalanced "
                   "assignment).",
                   [Q(agg(f"{BY_ENGINE}, gpu", busy, op="avg"),
                      f"{LEGEND_ENGINE} gpu {{{{gpu}}}}")], "percentunit"),
        timeseries("Current busy span", "How long each worker has been proving its current "
                   "partition (0 when idle). Bad: far above the usual GPU duration on the "
                   "Pipeline dashboard — the worker is hung.",
                   [Q(agg(f"{BY_ENGINE}, worker", sel("cuzk_gpu_worker_current_busy_seconds"),
                          op="max"), worker_legend)], "s"),
        timeseries("Idle workers while work is queued", "Idle GPU workers on engines that have "
                   "queued jobs or synthesized partitions (synth_done) waiting for a GPU. Empty "
                   "is good. Bad: any value for more than a few seconds — workers are not "
                   "picking up work (CuzkdGpuWorkersIdleWithQueuedWork fires after 5 minutes).",
                   [Q(f"{idle_workers} and on ({BY_ENGINE}) ({waiting})", LEGEND_ENGINE,
                      event_only=True)], "short"),
        state_timeline("Stalled engines", "The stall watchdog per engine: red while an engine "
                       "has work but its pipeline does not move (a hung GPU kernel or a "
                       "deadlocked worker). With stall_action = \"restart\" it is red only "
                       "briefly: see the stalls beside. Bad: any red.",
                       [Q(agg(BY_ENGINE, sel("cuzkd_engine_stalled"), op="max"),
                          LEGEND_ENGINE)],
                       [(0, "moving or idle", "green"), (1, "stalled", "red")], w=12, h=8),
        timeseries("Stalls", "Stalls the watchdog declared per engine, per rate interval "
                   "(each one restarts the engine unless stall_action = \"alert\"). Bad: "
                   "any; CuzkdEngineStalled fires.",
                   [Q(agg(BY_ENGINE, rate("cuzkd_engine_stalls_total", fn="increase")),
                      LEGEND_ENGINE)], "short", bars=True),
        timeseries("PoSt activity per GPU (gRPC)", "GPU workers of each GPU proving a "
                   "WindowPoSt or WinningPoSt now, from a cuzk engine's gRPC GetStatus (polled "
                   "every grpc_telemetry_interval, 10 s by default: a WinningPoSt of about a "
                   "second shows only when a poll falls in it; the outcome counters on the "
                   "Pipeline dashboard count every one). Worker busy / idle above shows these "
                   "workers idle: cuzk's /status does not see PoSt. Bad: PoSt proving while "
                   "the PoSt queue on the Pipeline dashboard grows — deadline proofs wait for "
                   "GPUs.",
                   [Q(agg(f"{BY_ENGINE}, gpu, proof_kind",
                          sel("cuzk_grpc_gpu_workers_proving", kinds=POST_KINDS)),
                      f"{LEGEND_ENGINE} gpu {{{{gpu}}}} {{{{proof_kind}}}}")], "short",
                   stack=True),
        events_by("Phantom-busy workers", "Spans of workers a plain cuzk shows proving a "
                  "partition that is not on a GPU in a live job (left behind by a failed GPU "
                  "run or a failed job), per rate interval, by reason: cuzkd counts them as "
                  "not busy. Empty is good. Bad: frequent — GPU runs are failing.",
                  "cuzk_gpu_worker_phantom_busy_total", "reason"),
        timeseries("Work waiting for a GPU", "Jobs queued in the scheduler and partitions "
                   "synthesized and waiting for a GPU worker. Bad: growing while utilization "
                   "is below 100 %.",
                   [Q(agg(BY_ENGINE, sel("cuzk_queue_depth"), op="max"),
                      f"{LEGEND_ENGINE} queued jobs"),
                    Q(agg(BY_ENGINE, sel("cuzk_partitions", phase="synth_done")),
                      f"{LEGEND_ENGINE} synth_done partitions")], "short"),
    ]
    return dashboard("cuzkd-gpu-workers", "cuzkd / GPU workers",
                     "Per-worker busy state and utilization, and idle GPUs while work waits.",
                     ["gpu"], panels)


def pipeline() -> Json:
    """Where do partitions spend their time, and how many jobs finish or fail?"""
    synth, gpu = "cuzk_partition_synth_duration_seconds", "cuzk_partition_gpu_duration_seconds"
    range_rate = rate("cuzk_job_duration_seconds_bucket", window="$__range")
    panels = [
        timeseries("Partitions by phase", "Partitions of in-flight jobs in each phase, stacked. "
                   "Bad: synth_done growing (GPUs are the bottleneck), pending growing "
                   "(synthesis is), or failed above 0.",
                   [Q(agg("phase", sel("cuzk_partitions")), "{{phase}}")], "short",
                   stack=True),
        timeseries("Phase transitions by proof kind", "Partitions entering each phase per "
                   "second, by proof kind. Bad: synthesizing and gpu rates diverging for long, "
                   "or any failed.",
                   [Q(agg("proof_kind, phase", rate("cuzk_partition_phase_transitions_total")),
                      "{{proof_kind}} {{phase}}")], "ops"),
        timeseries("Jobs completed and failed", "Proof jobs finished per second, by proof kind. "
                   "Bad: failures above 0, or completions dropping to 0 while jobs are queued.",
                   [Q(agg("proof_kind", rate("cuzk_jobs_completed_total")),
                      "{{proof_kind}} completed"),
                    Q(agg("proof_kind", rate("cuzk_jobs_failed_total")),
                      "{{proof_kind}} failed", event_only=True)], "ops"),
        timeseries("Synthesis vs GPU duration (p50, p95)", "Per-partition duration of CPU "
                   "synthesis and GPU proving, by proof kind. Bad: synthesis p95 well above "
                   "GPU p95 means GPUs wait on CPUs; a rising p95 means contention.",
                   [Q(quantile(q, h, "proof_kind"), f"{name} p{int(q * 100)} {{{{proof_kind}}}}")
                    for name, h in (("synthesis", synth), ("gpu", gpu)) for q in (0.5, 0.95)],
                   "s"),
        heatmap("Synthesis duration", "Distribution of per-partition synthesis durations "
                "(all proof kinds). Bad: a second band of slow partitions (memory pressure, "
                "CPU contention).", synth),
        heatmap("GPU duration", "Distribution of per-partition GPU proving durations (all "
                "proof kinds). Bad: a wide or drifting band (GPU throttling, contention "
                "between workers).", gpu),
        timeseries("Proof deadlines: job duration p50 / p99 vs deadline", "End-to-end "
                   "duration of finished jobs (accepted to finished; approximate for a plain "
                   "cuzk) by proof kind, with the deadline cuzkd is configured with "
                   "([metrics] proof_deadlines: winning-post 20 s, window-post 20 min by default). "
                   "Rare kinds (winning-post) show as points. Bad: a p99 at or above its "
                   "deadline — CuzkdProofSlowerThanDeadline fires.",
                   [*(Q(quantile(q, "cuzk_job_duration_seconds", "proof_kind"),
                        f"{{{{proof_kind}}}} p{int(q * 100)}") for q in (0.5, 0.99)),
                    Q(agg("proof_kind", sel("cuzkd_proof_deadline_seconds", engine=False),
                          op="max"), "{{proof_kind}} deadline")], "s", w=8),
        stat("Proof deadlines: p99 in the time range", "p99 job duration per proof kind over "
             "the whole selected time range (empty for kinds with no finished job in it). "
             "Bad: winning-post near 20 s, window-post near 20 min, or any kind near its deadline.",
             [Q(f"histogram_quantile(0.99, {agg('le, proof_kind', range_rate)})",
                "{{proof_kind}}", instant=True, event_only=True)], "s", w=8,
             thresholds=[{"color": "green", "value": None}, {"color": "orange", "value": 15},
                         {"color": "red", "value": 20}]),
        timeseries("Proof deadlines: failed jobs with a deadline", "Failed jobs per rate "
                   "interval of the proof kinds that have a deadline (winning-post, window-post by "
                   "default). Empty is good. Bad: any — the proof has no second chance "
                   "(CuzkdDeadlineProofFailed fires).",
                   [Q(agg("proof_kind", f"{rate('cuzk_jobs_failed_total', fn='increase')} "
                          f"and on (job, instance, proof_kind) "
                          f"{sel('cuzkd_proof_deadline_seconds', engine=False)}"),
                      "{{proof_kind}}", event_only=True)], "short", w=8, bars=True),
        timeseries("PoSt queued and in progress (gRPC)", "WindowPoSt and WinningPoSt proofs "
                   "waiting in cuzk's scheduler and being proved, from a cuzk engine's gRPC "
                   "GetStatus (cuzk's /status never lists them). Bad: queued above 0 for more "
                   "than a poll or two — deadline proofs wait behind other work. Empty for a "
                   "cuzk engine: its gRPC does not answer (cuzkd_engine_grpc_errors_total).",
                   [Q(agg("proof_kind", sel(f"cuzk_grpc_proofs_{part}", kinds=POST_KINDS)),
                      f"{{{{proof_kind}}}} {part.replace('_', ' ')}")
                    for part in ("queued", "in_progress")], "short", w=8),
        timeseries("PoSt completed and failed (gRPC)", "WindowPoSt and WinningPoSt proofs "
                   "finished per second, from a cuzk engine's gRPC GetMetrics (every failure "
                   "counted, which /status never does). Bad: any failed — "
                   "CuzkdDeadlineProofFailed fires; or no completions while PoSt is queued.",
                   [Q(agg("proof_kind", rate("cuzk_grpc_proofs_completed_total",
                                             kinds=POST_KINDS)), "{{proof_kind}} completed"),
                    Q(agg("proof_kind", rate("cuzk_grpc_proofs_failed_total", kinds=POST_KINDS)),
                      "{{proof_kind}} failed", event_only=True)], "ops", w=8),
        timeseries("gRPC telemetry errors", "Telemetry reads of cuzk engines' gRPC that told "
                   "nothing, by reason, per rate interval (their cuzk_grpc_* series are absent "
                   "meanwhile; not a health failure). Empty is good. Bad: any for long — the "
                   "PoSt panels are blind.",
                   [Q(agg(f"{BY_ENGINE}, reason",
                          f"{rate('cuzkd_engine_grpc_errors_total', fn='increase')} > 0"),
                      f"{LEGEND_ENGINE} {{{{reason}}}}", event_only=True)], "short", w=8,
                   bars=True),
        *front_door(),
        timeseries("Stale jobs (failed-work leftovers)", "Jobs a plain cuzk keeps listed "
                   "although their work failed (a failed partition, or no partition moved for "
                   "stale_job_after), by proof kind; they are not counted in flight. 0 is good. "
                   "Bad: growing — CuzkdStaleJobsAccumulating fires at 3 for 30 minutes; "
                   "`cuzkd status ENGINE` lists them with their age.",
                   [Q(agg(f"{BY_ENGINE}, proof_kind", sel("cuzk_stale_jobs"), op="max"),
                      f"{LEGEND_ENGINE} {{{{proof_kind}}}}")], "short"),
        timeseries("Queue depth", "Jobs waiting in each engine's scheduler. Bad: growing "
                   "steadily — the host cannot keep up with the offered load.",
                   [Q(agg(BY_ENGINE, sel("cuzk_queue_depth"), op="max"), LEGEND_ENGINE)],
                   "short"),
        timeseries("Jobs in flight", "Proof jobs each engine is working on. Bad: stuck at the "
                   "same value with no completions — jobs are hung.",
                   [Q(agg(BY_ENGINE, sel("cuzk_jobs_in_flight"), op="max"), LEGEND_ENGINE)],
                   "short"),
    ]
    return dashboard("cuzkd-pipeline", "cuzkd / Pipeline",
                     "Partition phases, job throughput and synthesis/GPU durations.",
                     ["pipeline"], panels)


#: The front door's timings of each proof (cuzkd_door_proof_*_seconds) but the total, in the
#: order a proof spends them.
DOOR_PHASES = ("queue_wait", "srs_load", "synthesis", "gpu_compute")


def front_door() -> list[Json]:
    """The Pipeline dashboard's front-door panels: every relayed Prove, measured by its reply
    (series labelled ``door``, the door's first engine, not ``engine``: empty without a
    door, so every query is event-only)."""
    duration = "cuzkd_door_proof_duration_seconds"
    return [
        timeseries("Front door: Prove calls by kind and result", "Prove calls the front door "
                   "relayed per second, by proof kind and result (cuzk's reply status, or "
                   "error:CODE for a gRPC error), every kind and every failure. Empty without "
                   "a door. Bad: any failed or error:* (error:unavailable: refused by the "
                   "door or its engine).",
                   [Q(agg("proof_kind, result",
                          rate("cuzkd_door_proofs_total", engine=False)),
                      "{{proof_kind}} {{result}}", event_only=True)], "ops", w=8),
        timeseries("Front door: proof duration p50 / p99 vs deadline (exact)", "Each relayed "
                   "proof's total_ms as cuzk measured it (from its Prove reply, failures "
                   "included) by proof kind, with its deadline: what CuzkdProofSlowerThanDeadline "
                   "judges engines behind a door by. Bad: a p99 at or above its deadline.",
                   [*(Q(quantile(q, duration, "proof_kind", engine=False),
                        f"{{{{proof_kind}}}} p{int(q * 100)}", event_only=True)
                      for q in (0.5, 0.99)),
                    Q(agg("proof_kind", sel("cuzkd_proof_deadline_seconds", engine=False),
                          op="max") + " and on (proof_kind) "
                      + agg("proof_kind", rate(duration + "_count", engine=False)),
                      "{{proof_kind}} deadline", event_only=True)], "s", w=8),
        timeseries("Front door: where a proof's time goes (p50)", "Median of each phase of "
                   "the relayed proofs by proof kind, from their Prove replies: waiting in "
                   "cuzk's queue, loading the SRS, synthesis, GPU. Bad: queue_wait growing "
                   "(more offered than proved), srs_load above 0 in steady state (SRS "
                   "evicted between proofs).",
                   [Q(quantile(0.5, f"cuzkd_door_proof_{phase}_seconds", "proof_kind",
                               engine=False),
                      f"{{{{proof_kind}}}} {phase.replace('_', ' ')}", event_only=True)
                    for phase in DOOR_PHASES], "s", w=8),
        timeseries("Front door: held calls", "Calls each front door holds because no engine "
                   "behind it can take them (starting, restarting, swapping, in backoff). "
                   "0 is good. Bad: held for long, or growing toward hold_max_calls.",
                   [Q(agg("instance, door", sel("cuzkd_door_held_calls", engine=False),
                          op="max"), "{{instance}} {{door}}", event_only=True)], "short", w=8),
        timeseries("Front door: hold time p50 / p99", "How long held calls waited in the door, "
                   "by how it left the hold (placed on an engine, refused, cancelled by its "
                   "caller), every kind together. Bad: p99 near hold_timeout, or any refused.",
                   [Q(quantile(q, "cuzkd_door_hold_duration_seconds", "outcome",
                               engine=False),
                      f"{{{{outcome}}}} p{int(q * 100)}", event_only=True)
                    for q in (0.5, 0.99)], "s", w=8),
        timeseries("Front door: retries and refusals", "Calls the door sent again after their "
                   "engine died or misbehaved (retry), and calls it answered with an error "
                   "itself (refusal), by reason, per rate interval. Empty is good. Bad: any "
                   "refusal (the caller saw an error); retries mean engines die under load.",
                   [Q(agg("door, reason", rate(f"cuzkd_door_{what}_total", engine=False,
                                               fn="increase") + " > 0"),
                      f"{{{{door}}}} {what} {{{{reason}}}}", event_only=True)
                    for what in ("retries", "refusals")], "short", w=8, bars=True),
        timeseries("Front door: a WinningPoSt's wait", "How long deadline calls waited in the "
                   "door before an engine took them (p99 by kind: held while no engine could, "
                   "and waiting for an engine's one PoSt slot), against a WinningPoSt's "
                   "deadline. A WinningPoSt must be proved within ~20 s of its call. Bad: a "
                   "winning-post wait of seconds (CuzkdWinningPostMissed fires when one is "
                   "refused or answered late).",
                   [Q(quantile(0.99, "cuzkd_door_hold_duration_seconds", "proof_kind",
                               engine=False, kinds=POST_KINDS),
                      "{{proof_kind}} held p99", event_only=True),
                    Q(quantile(0.99, "cuzkd_door_post_wait_seconds", "proof_kind",
                               engine=False, kinds=POST_KINDS),
                      "{{proof_kind}} PoSt slot p99", event_only=True),
                    Q(agg("proof_kind", sel("cuzkd_proof_deadline_seconds", engine=False,
                                            kinds="winning-post"), op="max"),
                      "{{proof_kind}} deadline", event_only=True)], "s", w=8),
        timeseries("Front door: deadlines missed, drains cut short, quarantines", "Deadline "
                   "calls refused because they could no longer be proved in time, or answered "
                   "after their deadline, by kind; calls and jobs a drain stopped waiting for "
                   "because the engine had dropped them, by reason; request ids quarantined "
                   "after crashing an engine twice. Empty is good. Bad: any winning-post "
                   "missed (a lost block), any quarantine (a poison request).",
                   [Q(agg("door, proof_kind", rate("cuzkd_door_refusals_total", engine=False,
                                                   fn="increase", reason="deadline") + " > 0"),
                      "{{door}} refused late {{proof_kind}}", event_only=True),
                    Q(agg("door, proof_kind", rate("cuzkd_door_late_answers_total",
                                                   engine=False, fn="increase") + " > 0"),
                      "{{door}} answered late {{proof_kind}}", event_only=True),
                    Q(agg("door, reason", rate("cuzkd_door_drain_abandoned_total",
                                               engine=False, fn="increase") + " > 0"),
                      "{{door}} drain abandoned {{reason}}", event_only=True),
                    Q(agg("door", sel("cuzkd_door_quarantined_requests", engine=False),
                          op="max") + " > 0", "{{door}} quarantined", event_only=True)],
                   "short", w=8, bars=True),
    ]


def memory() -> Json:
    """Is the host-memory budget, synthesis concurrency or GPU memory the limit?"""
    panels = [
        timeseries("Memory budget", "The engine's host-memory budget: used, available and "
                   "total. Bad: available near 0 for long — synthesis waits for memory "
                   "(CuzkdMemoryBudgetExhausted fires below 5 % for 10 minutes).",
                   [Q(agg(BY_ENGINE, sel(f"cuzk_memory_budget_{part}_bytes")),
                      f"{LEGEND_ENGINE} {part}")
                    for part in ("used", "available", "total")], "bytes"),
        timeseries("Memory budget used", "Share of the host-memory budget in use per engine. "
                   "Bad: pinned near 100 % while partitions wait in pending.",
                   [Q(f"{agg(BY_ENGINE, sel('cuzk_memory_budget_used_bytes'))} / "
                      f"{agg(BY_ENGINE, sel('cuzk_memory_budget_total_bytes'))}",
                      LEGEND_ENGINE)], "percentunit"),
        timeseries("Synthesis active vs max", "Partitions synthesizing now and how many the "
                   "memory budget allows at once; for a cuzk engine, its real capacity (from "
                   "its config: min(budget / 14 GiB, max_parallel_synthesis)), which its "
                   "max_concurrent (budget / 9 GiB) overstates. Bad: active stuck below the "
                   "capacity while partitions are pending (another limit), or a capacity of 2 "
                   "(budget too small).",
                   [*(Q(agg(BY_ENGINE, sel(f"cuzk_synthesis_{part}")), f"{LEGEND_ENGINE} {part}")
                      for part in ("active", "max_concurrent")),
                    Q(agg(BY_ENGINE, sel("cuzk_synthesis_capacity")),
                      f"{LEGEND_ENGINE} capacity")], "short"),
        timeseries("SRS and PCE allocations", "Long-lived allocations by kind (srs: proving "
                   "parameters, pce: pre-compiled circuits) and circuit, stacked. Bad: the same "
                   "circuit loaded twice, or allocations crowding out synthesis.",
                   [Q(agg(f"{BY_ENGINE}, kind, circuit", sel("cuzk_allocation_bytes")),
                      f"{LEGEND_ENGINE} {{{{kind}}}} {{{{circuit}}}}")], "bytes", stack=True),
        timeseries("Buffers in flight", "In-flight buffers by kind (synthesis outputs, prover "
                   "inputs, aux, shells, pending handles; a plain cuzk's aux and shells are "
                   "counters, cuzk_buffers_started_total). Bad: growing without bound — buffers "
                   "are not being released.",
                   [Q(agg(f"{BY_ENGINE}, buffer", sel("cuzk_buffers_in_flight")),
                      f"{LEGEND_ENGINE} {{{{buffer}}}}")], "short"),
        timeseries("GPU memory used vs total", "Device memory in use on each GPU and its size "
                   "(empty for engines computing on the CPU). Bad: used near total — proofs "
                   "fail with out-of-memory errors.",
                   [Q(agg(f"{BY_ENGINE}, gpu", sel(f"cuzk_gpu_memory_{part}_bytes"), op="max"),
                      f"{LEGEND_ENGINE} gpu {{{{gpu}}}} {part}", event_only=True)
                    for part in ("used", "total")], "bytes"),
    ]
    panels += [
        timeseries("GPU memory by device (NVML)", "Device memory in use on each GPU of each "
                   "host, all processes, as the supervisor reads it from NVML (empty without "
                   "NVML: pip install 'cuzkd[nvml]'). Unlike the engine's view this includes "
                   "other processes and a dead engine whose memory is not released yet. Bad: "
                   "used near total before an engine starts (the GPU memory gate waits).",
                   [Q(agg("instance, gpu", sel(f"cuzkd_gpu_memory_{part}_bytes", engine=False),
                          op="max"), f"{{{{instance}}}} gpu {{{{gpu}}}} {part}",
                      event_only=True) for part in ("used", "total")], "bytes"),
        timeseries("GPU utilization (NVML)", "Share of time a kernel ran on each GPU, from "
                   "NVML. Bad: low while the GPU workers report busy (the GPU waits on "
                   "transfers), or high with no engine busy (another process uses the GPU).",
                   [Q(agg("instance, gpu", sel("cuzkd_gpu_utilization_ratio", engine=False),
                          op="max"), "{{instance}} gpu {{gpu}}", event_only=True)],
                   "percentunit"),
    ]
    return dashboard("cuzkd-memory", "cuzkd / Memory",
                     "Host-memory budget, synthesis concurrency, allocations and GPU memory.",
                     ["memory"], panels)


def drilldown(uid: str, title: str) -> Json:
    """A data link to the per-host dashboard ``uid`` for the clicked series' host.

    ``instance`` is carried over from the series' labels; job, datasource and the time range
    from this dashboard, so the per-host view opens on the same data.
    """
    return {"title": f"{title} of ${{__field.labels.instance}}", "targetBlank": False,
            "url": f"/d/{uid}/{uid}?var-instance=${{__field.labels.instance}}"
                   "&${job:queryparam}&${datasource:queryparam}&${__url_time_range}"}


GREEN_AT_0 = [{"color": "green", "value": None}, {"color": "red", "value": 1}]
RED_BELOW_HALF = [{"color": "red", "value": None}, {"color": "orange", "value": 0.5},
                  {"color": "green", "value": 0.8}]


def fleet_summary() -> Json:
    """The fleet at a glance, from recording rules only (prometheus/cuzkd-recording.yml).

    Every query reads recorded series (one per host, or per host and GPU/engine/kind/release)
    so a dashboard refresh costs O(hosts) however many engines, workers and buckets the hosts
    export; docs/scale.md has the measured difference. Lists of hosts are instant top/bottom-k
    stats with links to the per-host dashboards rather than a line per host.
    """
    fleet_stats = [
        ("Hosts up", "Hosts whose cuzkd Prometheus scraped successfully. Bad: fewer than "
         "\"Hosts\" — CuzkdTargetDown names them.", "job:cuzkd_hosts_up:sum", "short", None),
        ("Hosts", "Hosts with a cuzkd target in the job (up or not). Bad: fewer than the "
         "fleet you expect — discovery lost some.", "job:cuzkd_hosts:count", "short", None),
        ("Engines up", "Engines running and answering /status across the fleet. Bad: below "
         "\"Engines\" for more than a restart.", "job:cuzkd_engines_up:sum", "short", None),
        ("Engines", "Engines the fleet's supervisors manage. Bad: fewer than the GPUs you "
         "own.", "job:cuzkd_engines:count", "short", None),
        ("Engines crash-looping", "Engines restarted more than 3 times in 15 minutes, fleet "
         "wide. Bad: anything above 0; see the list below.",
         "job:cuzkd_engines_crashlooping:count", "short", GREEN_AT_0),
        ("Hosts under memory pressure", "Hosts where an engine has used over 95 % of its "
         "host-memory budget. Bad: above 0 — synthesis waits for memory there.",
         "job:cuzk_memory_budget_pressure_hosts:count", "short", GREEN_AT_0),
    ]
    panels = [stat(title, description, [Q(agg("job", fleet_sel(record)), "{{job}}")],
                   unit, w=4, h=4, thresholds=thresholds)
              for title, description, record, unit, thresholds in fleet_stats]
    gpu = sel("instance_engine_gpu:cuzk_gpu_worker_busy:ratio_rate1m")
    host_busy = sel("instance:cuzk_gpu_worker_busy:ratio_rate1m", engine=False)
    restarts = agg("instance, engine", sel("instance_engine:cuzkd_engine_restarts:increase15m"))
    releases = agg("instance", sel("instance_release:cuzkd_engines:count", engine=False),
                   op="count")
    budget = agg("instance", sel("instance:cuzk_memory_budget_used:max_ratio", engine=False),
                 op="max")
    panels += [
        stat("Worst GPUs (lowest utilisation)", "The 10 GPUs whose workers were busy the "
             "smallest share of the last minute (click one for its host's GPU workers "
             "dashboard). Bad: red or orange while the fleet has work — a stuck worker, a "
             "starved GPU or an idle host.",
             [Q(f"bottomk(10, {agg('instance, engine, gpu', gpu, op='avg')})",
                "{{instance}} {{engine}} gpu {{gpu}}", instant=True)], "percentunit", w=12,
             h=8, thresholds=RED_BELOW_HALF,
             links=[drilldown("cuzkd-gpu-workers", "GPU workers")]),
        timeseries("GPU utilisation across hosts", "The fleet's busy fraction (all workers) "
                   "and the spread over hosts: the least busy host and the 10th percentile. "
                   "Bad: the minimum or p10 far below the fleet figure — some hosts idle "
                   "while others work.",
                   [Q(agg("job", fleet_sel("job:cuzk_gpu_worker_busy:ratio_rate1m"),
                          op="avg"), "{{job}} fleet"),
                    Q(agg("job", host_busy, op="min"), "{{job}} least busy host"),
                    Q(f"quantile by (job) (0.1, {host_busy})", "{{job}} p10 host")],
                   "percentunit"),
        timeseries("Proofs per second by kind", "Jobs completed (and failed) per second "
                   "across the fleet, by proof kind. Bad: a drop without a drop in demand, or "
                   "any failed.",
                   [Q(agg("proof_kind", fleet_sel("job_proof_kind:cuzk_jobs_completed:rate1m")),
                      "{{proof_kind}} completed"),
                    Q(agg("proof_kind", fleet_sel("job_proof_kind:cuzk_jobs_failed:rate1m")),
                      "{{proof_kind}} failed", event_only=True)], "ops"),
        timeseries("Partitions per second by kind", "Partitions proved per second across the "
                   "fleet, by proof kind: the GPU side's throughput. Bad: falling while work "
                   "is queued.",
                   [Q(agg("proof_kind", fleet_sel("job_proof_kind:cuzk_partitions_done:rate1m")),
                      "{{proof_kind}}")], "ops"),
        stat("Crash-looping engines", "Engines restarted in the last 15 minutes, with the "
             "count (click one for its host's overview: states, exit causes). Empty is good. "
             "Bad: 3 or more — CuzkdEngineCrashLooping fires above 3.",
             [Q(f"{restarts} > 0", "{{instance}} {{engine}}", event_only=True, instant=True)],
             "short",
             w=12, h=6, thresholds=[{"color": "green", "value": None},
                                    {"color": "orange", "value": 1},
                                    {"color": "red", "value": 3}],
             links=[drilldown("cuzkd-fleet", "Engines")]),
        stat("Hosts mid-rollout (more than one release)", "Hosts whose engines run more than "
             "one release, with the number of releases (click one for its host's overview). "
             "Empty is good. Bad: a host listed for longer than a rollout takes — its swap "
             "is stuck or was rolled back on some engines.",
             [Q(f"{releases} > 1", "{{instance}}", event_only=True, instant=True)], "short",
             w=12, h=6,
             thresholds=[{"color": "orange", "value": None}],
             links=[drilldown("cuzkd-fleet", "Engines")]),
        timeseries("Engines per release", "How many engines run each release across the "
                   "fleet: a rollout moves engines from the old release to the new one. Bad: "
                   "the old release's count stops falling before it reaches 0 (a stuck "
                   "rollout).",
                   [Q(agg("release", fleet_sel("job_release:cuzkd_engines:count")),
                      "{{release}}", event_only=True)], "short", stack=True),
        stat("Fullest memory budgets", "The 10 hosts whose fullest engine uses the largest "
             "share of its host-memory budget (click one for its host's memory dashboard). "
             "Bad: above 95 % — synthesis waits for memory there.",
             [Q(f"topk(10, {budget})", "{{instance}}", instant=True)], "percentunit", w=12, h=8,
             thresholds=[{"color": "green", "value": None}, {"color": "orange", "value": 0.8},
                         {"color": "red", "value": 0.95}],
             links=[drilldown("cuzkd-memory", "Memory")]),
    ]
    return dashboard("cuzkd-fleet-summary", "cuzkd / Fleet summary",
                     "The whole fleet from recording rules: hosts and engines up, worst GPUs, "
                     "crash loops, rollouts, proofs per second.", ["fleet"], panels)


DASHBOARDS = {"fleet": fleet, "gpu-workers": gpu_workers, "pipeline": pipeline,
              "memory": memory, "fleet-summary": fleet_summary}


def render() -> dict[str, str]:
    """File name → JSON text, exactly as committed."""
    return {f"cuzkd-{name}.json": json.dumps(build(), indent=2, ensure_ascii=False) + "\n"
            for name, build in DASHBOARDS.items()}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--check", action="store_true",
                        help="exit 1 if the committed JSON differs from the generator")
    args = parser.parse_args(argv)
    stale = []
    for name, text in render().items():
        path = OUT_DIR / name
        if args.check:
            if not path.is_file() or path.read_text(encoding="utf-8") != text:
                stale.append(name)
        else:
            OUT_DIR.mkdir(exist_ok=True)
            path.write_text(text, encoding="utf-8")
    if stale:
        print(f"out of date (run grafana/generate.py): {', '.join(stale)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
