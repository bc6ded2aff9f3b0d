"""Scraping and rules on Kubernetes: the PodMonitor, the PrometheusRule and the plain-Prometheus
``kubernetes_sd`` job (prometheus/prometheus-kubernetes.yml).

Both scrape paths must give every series the same two target labels, ``job`` and
``instance`` = node name, and no ``pod`` label, so that a rolled pod continues its node's
series. Relabelling is checked by a real Prometheus: Debian's Prometheus is built without
Kubernetes discovery, so the shipped ``relabel_configs`` run behind a ``file_sd`` block that
hands Prometheus the ``__meta_kubernetes_*`` labels its pod discovery would; the PodMonitor's
relabelings run the same way after the labels the operator adds in front of them.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
from pathlib import Path
from types import ModuleType
from typing import Any

import yaml
from support import k8s
from support.live import Prometheus
from support.waiting import wait_until

PROM = k8s.REPO / "prometheus"
PLAIN_CONFIG = PROM / "prometheus-kubernetes.yml"
RULE_FILES = (PROM / "cuzkd-alerts.yml", PROM / "cuzkd-recording.yml")
GENERATOR = k8s.KUSTOMIZE_ROOT / "generate_rules.py"
OBJECTS = k8s.render(k8s.KUSTOMIZE_ROOT / "nvidia")
JOB = "cuzkd-kubernetes"


def _generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("cuzkd_generate_rules", GENERATOR)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _plain_job() -> dict[str, Any]:
    (job,) = yaml.safe_load(PLAIN_CONFIG.read_text())["scrape_configs"]
    return dict(job)


# --- PrometheusRule --------------------------------------------------------------------------


def test_prometheus_rule_is_what_the_generator_writes() -> None:
    generator = _generator()
    committed = generator.OUTPUT.read_text(encoding="utf-8")
    assert committed == generator.render(), "run deploy/kubernetes/generate_rules.py"
    assert generator.main(["--check"]) == 0


def test_prometheus_rule_holds_every_group_of_the_rule_files_unchanged() -> None:
    """Whatever the rule files hold (alerts added later included) is in the object, as is."""
    groups = [g for path in RULE_FILES for g in yaml.safe_load(path.read_text())["groups"]]
    rule = k8s.by_kind(OBJECTS, "PrometheusRule")
    assert rule["spec"]["groups"] == groups
    alerts = {r["alert"] for g in groups for r in g["rules"] if "alert" in r}
    records = {r["record"] for g in groups for r in g["rules"] if "record" in r}
    assert "CuzkdEngineDown" in alerts and "job:cuzk_gpu_worker_busy:ratio_rate1m" in records


def test_generator_check_fails_on_a_stale_file(tmp_path: Path) -> None:
    generator = _generator()
    generator.OUTPUT = tmp_path / "prometheusrule.yaml"
    generator.OUTPUT.write_text(generator.render().replace("CuzkdEngineDown", "Renamed"))
    assert generator.main(["--check"]) == 1
    assert generator.main([]) == 0 and generator.main(["--check"]) == 0


# --- PodMonitor and the plain job agree with the DaemonSet ------------------------------------


def test_pod_monitor_selects_the_daemonset_pods_on_their_metrics_port() -> None:
    monitor = k8s.by_kind(OBJECTS, "PodMonitor")["spec"]
    template = k8s.by_kind(OBJECTS, "DaemonSet")["spec"]["template"]
    pod_labels = template["metadata"]["labels"]
    assert monitor["selector"]["matchLabels"].items() <= pod_labels.items()
    (endpoint,) = monitor["podMetricsEndpoints"]
    ports = {p["name"] for c in template["spec"]["containers"] for p in c["ports"]}
    assert endpoint["port"] in ports
    datasource = yaml.safe_load((k8s.REPO / "grafana" / "provisioning" / "datasources"
                                 / "cuzkd.yaml").read_text())["datasources"][0]
    assert endpoint["interval"] == datasource["jsonData"]["timeInterval"]


def test_plain_job_discovers_the_daemonset_pods() -> None:
    job = _plain_job()
    (sd,) = job["kubernetes_sd_configs"]
    namespace = k8s.by_kind(OBJECTS, "DaemonSet")["metadata"]["namespace"]
    assert sd["role"] == "pod" and sd["namespaces"]["names"] == [namespace]
    assert sd["selectors"] == [{"role": "pod", "label": "app.kubernetes.io/name=cuzkd"}]
    assert job["job_name"] == JOB and yaml.safe_load(PLAIN_CONFIG.read_text())[
        "global"]["scrape_interval"] == "15s"


def _to_prometheus(relabeling: dict[str, Any]) -> dict[str, Any]:
    """An operator RelabelConfig (camelCase) as a Prometheus relabel_config (snake_case)."""
    names = {"sourceLabels": "source_labels", "targetLabel": "target_label"}
    return {names.get(k, k): v for k, v in relabeling.items()}


#: What the operator's generated job does before the PodMonitor's own relabelings: drop pods
#: that finished (filterRunning, on by default), keep the selected pods' named port, then add
#: namespace, container, pod, job and endpoint labels.
OPERATOR_PREFIX = [
    {"source_labels": ["__meta_kubernetes_pod_phase"], "regex": "(Failed|Succeeded)",
     "action": "drop"},
    {"source_labels": ["__meta_kubernetes_pod_label_app_kubernetes_io_name"], "regex": "cuzkd",
     "action": "keep"},
    {"source_labels": ["__meta_kubernetes_pod_container_port_name"], "regex": "metrics",
     "action": "keep"},
    {"source_labels": ["__meta_kubernetes_namespace"], "target_label": "namespace"},
    {"source_labels": ["__meta_kubernetes_pod_container_name"], "target_label": "container"},
    {"source_labels": ["__meta_kubernetes_pod_name"], "target_label": "pod"},
    {"target_label": "job", "replacement": "cuzkd/cuzkd"},
    {"target_label": "endpoint", "replacement": "metrics"},
]


def _discovered(pod: str, node: str, port_name: str = "metrics", phase: str = "Running",
                app: str = "cuzkd") -> dict[str, Any]:
    """A target group as Kubernetes pod discovery would produce it (no listener behind it:
    target labels are computed whether or not the scrape succeeds)."""
    return {"targets": ["127.0.0.1:9"], "labels": {
        "__meta_kubernetes_namespace": "cuzkd",
        "__meta_kubernetes_pod_name": pod,
        "__meta_kubernetes_pod_node_name": node,
        "__meta_kubernetes_pod_phase": phase,
        "__meta_kubernetes_pod_container_name": "cuzkd",
        "__meta_kubernetes_pod_container_port_name": port_name,
        "__meta_kubernetes_pod_label_app_kubernetes_io_name": app,
    }}


def test_both_scrape_paths_label_series_by_node_only(tmp_path: Path) -> None:
    """A real Prometheus applies the shipped relabelling to discovered pods: only running cuzkd
    pods' metrics ports are scraped, with labels {job, instance=node} and nothing else."""
    groups = [
        _discovered("cuzkd-7xk2p", "gpu-node-1"),
        _discovered("cuzkd-9qz4w", "gpu-node-2"),
        _discovered("cuzkd-old", "gpu-node-3", phase="Succeeded"),   # a rolled pod's remains
        _discovered("cuzkd-7xk2p", "gpu-node-1", port_name="debug"),  # another port
        _discovered("node-exporter-1", "gpu-node-1", app="node-exporter"),
    ]
    check_dir, run_dir = tmp_path / "check", tmp_path / "run"
    for directory in (check_dir, run_dir):
        directory.mkdir()
        (directory / "pods.json").write_text(json.dumps(groups))
    plain = {key: value for key, value in _plain_job().items() if key != "kubernetes_sd_configs"}
    (endpoint,) = k8s.by_kind(OBJECTS, "PodMonitor")["spec"]["podMetricsEndpoints"]
    operator = {"job_name": "podmonitor", "scrape_interval": endpoint["interval"],
                "scrape_timeout": endpoint["scrapeTimeout"],
                "relabel_configs": OPERATOR_PREFIX + [_to_prometheus(r)
                                                      for r in endpoint["relabelings"]]}
    jobs = [{**job, "file_sd_configs": [{"files": ["pods.json"]}]} for job in (plain, operator)]
    for rules in RULE_FILES:  # the full config, as promtool checks it, with the rule files
        shutil.copy(rules, check_dir / rules.name)
    config = {**yaml.safe_load(PLAIN_CONFIG.read_text()), "scrape_configs": jobs}
    (check_dir / "prometheus.yml").write_text(yaml.safe_dump(config))
    check = subprocess.run(["promtool", "check", "config", "prometheus.yml"], cwd=check_dir,
                           capture_output=True, text=True, timeout=60, check=False)
    assert check.returncode == 0 and "WARNING" not in check.stdout + check.stderr, (
        check.stdout + check.stderr)

    prometheus = Prometheus.start(run_dir, [], scrape_configs=jobs, scrape_interval="15s")
    try:
        def targets() -> dict[str, Any] | None:
            data = prometheus.data("targets")
            pools = {t["scrapePool"] for t in data["activeTargets"]}
            return data if pools == {JOB, "podmonitor"} else None

        data = wait_until(targets, 30, "both jobs' targets discovered", interval=0.1)
    finally:
        prometheus.stop()
    labels = {(t["scrapePool"], json.dumps(t["labels"], sort_keys=True))
              for t in data["activeTargets"]}
    assert labels == {(pool, json.dumps({"instance": node, "job": JOB}, sort_keys=True))
                      for pool in (JOB, "podmonitor") for node in ("gpu-node-1", "gpu-node-2")}
    assert len(data["droppedTargets"]) == 2 * 3


def test_plain_config_passes_promtool_as_far_as_this_build_knows_kubernetes_sd() -> None:
    """A promtool with Kubernetes discovery checks the file as shipped. Debian's is built
    without it and stops at that one field; everything else in the file is checked by
    ``test_both_scrape_paths_label_series_by_node_only`` with file_sd in its place."""
    result = subprocess.run(["promtool", "check", "config", str(PLAIN_CONFIG)],
                            capture_output=True, text=True, timeout=60, check=False)
    output = result.stdout + result.stderr
    if result.returncode == 0:
        assert "WARNING" not in output and "2 rule files found" in output, output
    else:
        errors = [line for line in output.splitlines() if "FAILED" in line or "line " in line]
        assert errors and all("kubernetes_sd_configs not found" in line or "FAILED: parsing"
                              in line for line in errors), output
        assert "field kubernetes_sd_configs not found in type config.ScrapeConfig" in output


def test_plain_config_keeps_no_pod_label() -> None:
    """No relabelling copies pod, namespace or container metadata into a label."""
    for rule in _plain_job()["relabel_configs"]:
        assert rule.get("action", "replace") in {"keep", "drop", "replace"}, rule
        if rule.get("action", "replace") == "replace":
            assert rule["target_label"] == "instance", rule
