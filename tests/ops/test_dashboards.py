"""The shipped Grafana dashboards and provisioning follow grafana-dashboards.md, rule by rule.

The rules are checked on the committed JSON (what Grafana loads), after checking that the JSON is
exactly what grafana/generate.py produces. A few deliberately broken queries make sure the PromQL
lint itself catches what it claims to.
"""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml
from support import ops

from cuzkd.states import State
from cuzkd.units import parse_duration

GENERATOR = ops.REPO / "grafana" / "generate.py"
PANEL_TYPES = {"timeseries", "stat", "state-timeline", "heatmap"}
UNITS = {"bytes", "s", "percentunit", "ops", "short", "none"}
SERIES = {**ops.series_contract(), **ops.PROMETHEUS_SERIES, **ops.recorded_series()}
TARGETS = list(ops.iter_panel_targets())
PANELS = [(d, p) for d in ops.load_dashboards().values() for p in d["panels"]]


def _load_generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("cuzkd_grafana_generate", GENERATOR)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while being created
    spec.loader.exec_module(module)
    return module


def _id(item: tuple[dict[str, Any], ...]) -> str:
    dash, panel, *rest = item
    ref = f"/{rest[0]['refId']}" if rest else ""
    return f"{dash['uid']}/{panel['title']}{ref}"


def _yaml(path: Path) -> Any:
    return yaml.safe_load(path.read_text(encoding="utf-8"))


# --- rule 10: generated, committed, identical -------------------------------------------------


def test_committed_json_is_what_the_generator_writes() -> None:
    rendered = _load_generator().render()
    committed = {p.name for p in ops.DASHBOARD_DIR.glob("*.json")}
    assert committed == set(rendered), "stale or missing dashboard files"
    for name, text in rendered.items():
        assert (ops.DASHBOARD_DIR / name).read_bytes() == text.encode(), (
            f"{name} differs from grafana/generate.py output: run `python grafana/generate.py`")


# --- rule 8: dashboard-level fields -----------------------------------------------------------


def test_dashboards_have_fixed_uids_unique_titles_and_current_schema() -> None:
    dashboards = ops.load_dashboards()
    assert {d["uid"] for d in dashboards.values()} == {
        "cuzkd-fleet", "cuzkd-gpu-workers", "cuzkd-pipeline", "cuzkd-memory",
        "cuzkd-fleet-summary"}
    titles = [d["title"] for d in dashboards.values()]
    assert len(set(titles)) == len(titles)
    for dash in dashboards.values():
        assert dash["editable"] is False
        assert dash["schemaVersion"] == 39
        assert "cuzkd" in dash["tags"] and len(dash["tags"]) >= 2
        assert dash["time"]["from"].startswith("now-") and dash["refresh"]
        panel_titles = [p["title"] for p in dash["panels"]]
        assert len(set(panel_titles)) == len(panel_titles), dash["uid"]
        ids = [p["id"] for p in dash["panels"]]
        assert len(set(ids)) == len(ids)


def test_panels_do_not_overlap_on_the_grid() -> None:
    for dash in ops.load_dashboards().values():
        cells: set[tuple[int, int]] = set()
        for p in dash["panels"]:
            g = p["gridPos"]
            assert g["x"] >= 0 and g["x"] + g["w"] <= 24, p["title"]
            mine = {(x, y) for x in range(g["x"], g["x"] + g["w"])
                    for y in range(g["y"], g["y"] + g["h"])}
            assert not cells & mine, f"{dash['uid']}: {p['title']} overlaps"
            cells |= mine


# --- rules 1 and 2: variables ----------------------------------------------------------------


def test_template_variables() -> None:
    for dash in ops.load_dashboards().values():
        variables = {v["name"]: v for v in dash["templating"]["list"]}
        assert list(variables)[:1] == ["datasource"]
        ds = variables["datasource"]
        assert ds["type"] == "datasource" and ds["query"] == "prometheus"
        assert ds["current"]["value"] == _provisioned_datasource()["uid"]
        for name in ("job", "instance", "engine"):
            var = variables[name]
            assert var["type"] == "query"
            assert var["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
            assert var["multi"] is True and var["includeAll"] is True
            assert var["allValue"] == ".+"
            assert var["refresh"] == 2, "refresh on time-range change"
            query = var["query"]["query"]
            assert query == var["definition"]
            assert re.fullmatch(rf"label_values\((.+), {name}\)", query), query
            # the inner selector parses and names a contract metric
            inner = re.fullmatch(rf"label_values\((.+), {name}\)", query)
            assert inner is not None
            selector = ops.parse(ops.substitute(inner.group(1)))
            assert next(ops.selectors(selector)).name in SERIES


# --- rule 7: every panel ---------------------------------------------------------------------


@pytest.mark.parametrize("dash,panel", PANELS, ids=[_id(x) for x in PANELS])
def test_panel_has_title_description_unit_targets_and_datasource(
        dash: dict[str, Any], panel: dict[str, Any]) -> None:
    assert panel["type"] in PANEL_TYPES
    assert panel["title"].strip()
    description = panel["description"]
    assert len(description) >= 60 and "Bad" in description, "must say what a bad value is"
    assert panel["datasource"] == ops.DASHBOARD_DATASOURCE
    assert panel["targets"], "no targets"
    for target in panel["targets"]:
        assert target["datasource"] == ops.DASHBOARD_DATASOURCE
        assert target["expr"].strip()
    defaults = panel["fieldConfig"]["defaults"]
    assert defaults.get("unit") in UNITS
    if defaults["unit"] == "percentunit":
        assert (defaults.get("min"), defaults.get("max")) == (0, 1)


# --- rules 3-7 on every query ----------------------------------------------------------------


@pytest.mark.parametrize("dash,panel,target", TARGETS, ids=[_id(x) for x in TARGETS])
def test_query_follows_promql_rules(dash: dict[str, Any], panel: dict[str, Any],
                                    target: dict[str, Any]) -> None:
    assert ops.lint_expr(target["expr"], target["legendFormat"], SERIES) == []


BROKEN = {
    "missing job/instance": ('sum by (engine) (cuzk_queue_depth{engine=~"$engine"})',
                             "{{engine}}", ['missing job=~"$job"']),
    "missing engine": ('sum by (instance) (cuzk_queue_depth{job=~"$job", '
                       'instance=~"$instance"})', "{{instance}}", ['missing engine=~"$engine"']),
    "counter outside rate": ('sum by (instance) (cuzkd_zombies_reaped_total{job=~"$job", '
                             'instance=~"$instance"})', "{{instance}}", ["counter"]),
    "gauge inside rate": ('sum by (instance) (rate(process_open_fds{job=~"$job", '
                          'instance=~"$instance"}[$__rate_interval]))', "{{instance}}",
                          ["gauge process_open_fds inside rate"]),
    "counter inside max_over_time": ('sum by (instance) (max_over_time('
                                     'cuzkd_zombies_reaped_total{job=~"$job", '
                                     'instance=~"$instance"}[$__rate_interval]))',
                                     "{{instance}}",
                                     ["counter cuzkd_zombies_reaped_total inside max_over_time"]),
    "fixed window": ('sum by (instance) (rate(cuzkd_zombies_reaped_total{job=~"$job", '
                     'instance=~"$instance"}[5m]))', "{{instance}}", ["fixed range"]),
    "no aggregation": ('process_open_fds{job=~"$job", instance=~"$instance"}', "{{instance}}",
                       ["not explicitly aggregated"]),
    "legend mismatch": ('sum by (instance, engine) (cuzk_queue_depth{job=~"$job", '
                        'instance=~"$instance", engine=~"$engine"})', "{{instance}}",
                        ["legend"]),
    "unknown metric": ('sum by (instance) (cuzk_no_such_metric{job=~"$job", '
                       'instance=~"$instance"})', "{{instance}}", ["not in the exporter"]),
    "bad quantile": ('histogram_quantile(0.9, rate(cuzk_partition_gpu_duration_seconds_bucket'
                     '{job=~"$job", instance=~"$instance", engine=~"$engine"}'
                     '[$__rate_interval]))', "", ["histogram_quantile must wrap"]),
    "label the series lacks": ('sum by (job) (job:cuzkd_hosts:count{job=~"$job", '
                               'instance=~"$instance"})', "{{job}}",
                               ["job:cuzkd_hosts:count has no instance label"]),
    "recorded series without job": ('sum by (job) (job:cuzkd_hosts:count)', "{{job}}",
                                    ['missing job=~"$job"']),
    "unknown variable": ('sum by (instance) (up{job=~"$jobb", instance=~"$instance"})',
                         "{{instance}}", ["does not parse"]),
}


@pytest.mark.parametrize("case", BROKEN)
def test_lint_catches_broken_queries(case: str) -> None:
    expr, legend, expected = BROKEN[case]
    problems = " | ".join(ops.lint_expr(expr, legend, SERIES))
    for fragment in expected:
        assert fragment in problems, problems


# --- rule 9: heatmaps and state timelines ----------------------------------------------------


def test_heatmaps_use_bucket_increases_without_recalculation() -> None:
    heatmaps = [(d, p) for d, p in PANELS if p["type"] == "heatmap"]
    assert len(heatmaps) >= 2
    for _, panel in heatmaps:
        assert panel["options"]["calculate"] is False
        assert panel["options"]["yAxis"]["unit"] == "s"
        for target in panel["targets"]:
            assert target["format"] == "heatmap"
            assert ops.heatmap_problems(target["expr"]) == []
    assert ops.heatmap_problems('sum by (le) (rate(x_bucket{job=~"$job"}[$__rate_interval]))')


def test_state_timelines_map_values_to_coloured_states() -> None:
    timelines = {p["title"]: p for _, p in PANELS if p["type"] == "state-timeline"}
    for panel in timelines.values():
        (mapping,) = panel["fieldConfig"]["defaults"]["mappings"]
        assert mapping["type"] == "value"
        assert all(m["text"] and m["color"] for m in mapping["options"].values())
    workers = timelines["Worker busy / idle"]["fieldConfig"]["defaults"]["mappings"][0]
    assert {k: v["text"] for k, v in workers["options"].items()} == {"0": "idle", "1": "busy"}
    states = timelines["Engine states"]["fieldConfig"]["defaults"]["mappings"][0]["options"]
    assert sorted(v["text"] for v in states.values()) == sorted(
        ["starting", "running", "backoff", "stopping", "stopped", "failed"])


# --- the panel list -------------------------------------------------------------------


def test_required_panels_exist() -> None:
    exprs = {d["uid"]: " ".join(t["expr"] for p in d["panels"] for t in p["targets"])
             for d in ops.load_dashboards().values()}
    required = {
        "cuzkd-fleet": ["cuzkd_engine_up", "cuzkd_engine_state", "cuzkd_engine_restarts_total",
                        "cuzkd_engine_exits_total", "cuzkd_binary_release_info",
                        "cuzkd_binary_swaps_total"],
        "cuzkd-gpu-workers": ["cuzk_gpu_worker_busy{", "cuzk_gpu_worker_busy_seconds_total",
                              "cuzk_gpu_worker_current_busy_seconds", "cuzk_queue_depth",
                              'phase="synth_done"'],
        "cuzkd-pipeline": ["cuzk_partitions", "cuzk_partition_phase_transitions_total",
                           "cuzk_jobs_completed_total", "cuzk_jobs_failed_total",
                           "cuzk_partition_synth_duration_seconds_bucket",
                           "cuzk_partition_gpu_duration_seconds_bucket", "cuzk_queue_depth",
                           "cuzk_jobs_in_flight", "cuzk_job_duration_seconds_bucket",
                           "cuzkd_proof_deadline_seconds"],
        "cuzkd-memory": ["cuzk_memory_budget_used_bytes", "cuzk_memory_budget_available_bytes",
                         "cuzk_memory_budget_total_bytes", "cuzk_synthesis_active",
                         "cuzk_synthesis_max_concurrent", "cuzk_allocation_bytes",
                         "cuzk_buffers_in_flight", "cuzk_gpu_memory_used_bytes",
                         "cuzk_gpu_memory_total_bytes"],
    }
    for uid, names in required.items():
        for name in names:
            assert name in exprs[uid], f"{uid} lacks {name}"


# --- the Fleet summary: recorded series only, drill-down links -------------------------------


def _fleet_summary() -> dict[str, Any]:
    (dash,) = [d for d in ops.load_dashboards().values() if d["uid"] == "cuzkd-fleet-summary"]
    return dash


def test_fleet_summary_reads_only_recorded_series() -> None:
    """O(hosts) per refresh: no raw exporter series, only the recording rules' output."""
    recorded = ops.recorded_series()
    read: set[str] = set()
    for panel in _fleet_summary()["panels"]:
        for target in panel["targets"]:
            tree = ops.parse(ops.substitute(target["expr"]))
            read |= {s.name for s in ops.selectors(tree)}
    assert read <= set(recorded), read - set(recorded)
    assert {"instance_engine_gpu:cuzk_gpu_worker_busy:ratio_rate1m",
            "instance_engine:cuzkd_engine_restarts:increase15m",
            "instance_release:cuzkd_engines:count",
            "job_proof_kind:cuzk_jobs_completed:rate1m"} <= read


def test_fleet_summary_lists_worst_gpus_with_bottomk_as_of_now() -> None:
    panels = {p["title"]: p for p in _fleet_summary()["panels"]}
    (worst,) = panels["Worst GPUs (lowest utilisation)"]["targets"]
    assert worst["expr"].startswith("bottomk(10, ")
    assert worst["instant"] is True, "bottomk per step of a range query shows > 10 series"


def test_fleet_summary_links_drill_down_to_per_host_dashboards() -> None:
    uids = {d["uid"] for d in ops.load_dashboards().values()}
    linked = 0
    for panel in _fleet_summary()["panels"]:
        for link in panel["fieldConfig"]["defaults"].get("links", []):
            linked += 1
            match = re.fullmatch(r"/d/([\w-]+)/[\w-]+\?(.*)", link["url"])
            assert match, link["url"]
            assert match.group(1) in uids and match.group(1) != "cuzkd-fleet-summary"
            params = match.group(2).split("&")
            assert "var-instance=${__field.labels.instance}" in params
            assert {"${job:queryparam}", "${__url_time_range}"} <= set(params)
            for target in panel["targets"]:  # the clicked series has an instance label
                tree = ops.parse(ops.substitute(target["expr"]))
                assert "instance" in ops.output_labels(tree, ops.recorded_series())
    assert linked >= 3


def test_panel_query_helper_substitutes_every_variable_and_marks_events() -> None:
    queries = list(ops.iter_panel_queries(rate_interval="4s", range_="10m"))
    assert len(queries) == len(TARGETS)
    for q in queries:
        assert "$" not in q.expr, q
        ops.parse(q.expr)
    events = {q.panel for q in queries if q.event_only}
    assert {"Engine exits by cause", "Jobs completed and failed",
            "Idle workers while work is queued", "Active binary release"} <= events
    assert "Engine restarts" not in events
    assert any("[4s]" in q.expr for q in queries) and any("[10m]" in q.expr for q in queries)


# --- provisioning (rule 1's datasource, rule 8's provider) ------------------------------------


def _provisioned_datasource() -> dict[str, Any]:
    doc = _yaml(ops.REPO / "grafana" / "provisioning" / "datasources" / "cuzkd.yaml")
    (ds,) = doc["datasources"]
    return dict(ds)


def test_datasource_has_fixed_uid_env_url_and_the_scrape_interval() -> None:
    ds = _provisioned_datasource()
    assert ds["type"] == "prometheus" and ds["uid"] == "cuzkd-prometheus"
    assert ds["url"] == "${CUZKD_PROMETHEUS_URL}"
    time_interval = parse_duration(ds["jsonData"]["timeInterval"])
    for config in (ops.REPO / "prometheus" / "prometheus.yml",
                   ops.REPO / "deploy" / "prometheus.yml"):
        scrape = _yaml(config)["global"]["scrape_interval"]
        assert parse_duration(scrape) == time_interval, config
    compose = _yaml(ops.REPO / "deploy" / "compose.yaml")
    env = compose["services"]["grafana"]["environment"]
    assert env["CUZKD_PROMETHEUS_URL"] == "${CUZKD_PROMETHEUS_URL:-http://prometheus:9090}"


def test_dashboard_provider_is_read_only_and_points_at_the_mounted_dashboards() -> None:
    doc = _yaml(ops.REPO / "grafana" / "provisioning" / "dashboards" / "cuzkd.yaml")
    (provider,) = doc["providers"]
    assert provider["type"] == "file" and provider["folder"] == "cuzkd"
    assert provider["allowUiUpdates"] is False
    grafana = _yaml(ops.REPO / "deploy" / "compose.yaml")["services"]["grafana"]
    mounts = {v.split(":")[1]: v.split(":")[0] for v in grafana["volumes"]}
    source = mounts[provider["options"]["path"]]
    assert (ops.REPO / "deploy" / source).resolve() == ops.DASHBOARD_DIR


def test_composite_panel_queries_compute_what_they_claim(tmp_path: Path) -> None:
    """The two queries that combine series evaluate correctly in promtool.

    Engine states: one-hot state → one code per engine (backoff = 3). Idle while queued: one of
    two workers idle, empty queue but synth_done partitions waiting → 1 idle worker.
    """
    queries = {q.panel: q.expr for q in ops.iter_panel_queries()}
    where = 'job="c", instance="h", engine="e"'
    series = {f'cuzkd_engine_state{{{where}, state="{s}"}}': v
              for s, v in (("starting", "0x5"), ("running", "0x5"), ("backoff", "1x5"))}
    series |= {f'cuzk_gpu_worker_busy{{{where}, worker="{w}", gpu="0"}}': v
               for w, v in (("0", "0x5"), ("1", "1x5"))}
    series |= {f"cuzk_queue_depth{{{where}}}": "0x5",
               f'cuzk_partitions{{{where}, proof_kind="porep-c2", phase="synth_done"}}': "2x5"}
    expected = {"Engine states": 3, "Idle workers while work is queued": 1}
    (tmp_path / "none.yml").write_text("groups: []\n")
    doc = {"rule_files": ["none.yml"], "evaluation_interval": "1m", "tests": [{
        "interval": "1m",
        "input_series": [{"series": s, "values": v} for s, v in series.items()],
        "promql_expr_test": [{"expr": queries[panel], "eval_time": "3m", "exp_samples": [
            {"labels": '{instance="h", engine="e"}', "value": value}]}
            for panel, value in expected.items()]}]}
    (tmp_path / "t.yml").write_text(yaml.safe_dump(doc))
    result = subprocess.run(["promtool", "test", "rules", "t.yml"], cwd=tmp_path,
                            capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_engine_state_timeline_draws_every_engine_state() -> None:
    """The fleet's state timeline folds every ``cuzkd_engine_state`` series (one per state of
    ``cuzkd.states.State``) into its code, and names every code: a state the exporter exports
    is never a blank or a mislabelled stretch on the dashboard."""
    panel = next(p for d in ops.load_dashboards().values() for p in d["panels"]
                 if p["title"] == "Engine states")
    (mappings,) = panel["fieldConfig"]["defaults"]["mappings"]
    codes = {int(code): mapping["text"] for code, mapping in mappings["options"].items()}
    assert codes == {code: str(state) for code, state in enumerate(State, start=1)}
    (target,) = panel["targets"]
    folded = re.findall(r'state="(\w+)"\} \* (\d+)', target["expr"])
    assert [(name, int(code)) for name, code in folded] == [
        (str(state), code) for code, state in enumerate(State, start=1)]
