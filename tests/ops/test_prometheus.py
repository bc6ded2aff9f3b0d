"""Prometheus example configs, alert rules and their promtool unit tests.

promtool does the syntax work (check config, check rules, test rules). On top: every alert the
issue names exists with `for:`, a severity and annotations naming the instance (and the engine
where the alert is per engine); every metric is in the exporter contract; and the unit tests
really cover each alert: making an alert never fire, or always fire, must break them.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from support import ops

PROM = ops.REPO / "prometheus"
RULES = PROM / "cuzkd-alerts.yml"
RULE_TESTS = PROM / "tests" / "cuzkd-alerts.test.yml"
SERIES = {**ops.series_contract(), **ops.PROMETHEUS_SERIES}
ALERTS = {
    "CuzkdEngineDown", "CuzkdEngineCrashLooping", "CuzkdGpuWorkersIdleWithQueuedWork",
    "CuzkdMemoryBudgetExhausted", "CuzkdSwapRolledBack", "CuzkdStatusFetchFailing",
    "CuzkdTargetDown", "CuzkdConfigReloadFailed", "CuzkdEngineOomKilled", "CuzkdEngineStalled",
    "CuzkdProofSlowerThanDeadline", "CuzkdDeadlineProofFailed", "CuzkdRollbackFailed",
    "CuzkdEngineDrainTimedOut", "CuzkdLabelValuesDropped", "CuzkdStaleJobsAccumulating",
    "CuzkdPartitionsFailing", "CuzkdWebConfigReloadFailed", "CuzkdHostStoppedPushing",
    "CuzkdWinningPostMissed",
}


def _promtool(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    if shutil.which("promtool") is None:
        pytest.fail("promtool not installed (apt-get install prometheus; see scripts/test.sh)")
    return subprocess.run(["promtool", *args], capture_output=True, text=True, cwd=cwd,
                          timeout=60, check=False)


def _rules() -> dict[str, dict[str, Any]]:
    doc = yaml.safe_load(RULES.read_text(encoding="utf-8"))
    return {r["alert"]: r for g in doc["groups"] for r in g["rules"] if "alert" in r}


def test_example_config_is_valid_and_warning_free() -> None:
    result = _promtool("check", "config", str(PROM / "prometheus.yml"))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "WARNING" not in result.stdout + result.stderr
    assert "2 rule files found" in result.stdout
    doc = yaml.safe_load((PROM / "prometheus.yml").read_text(encoding="utf-8"))
    jobs = {j["job_name"]: j for j in doc["scrape_configs"]}
    assert jobs["cuzkd"]["static_configs"][0]["targets"] == ["127.0.0.1:9822"]
    assert jobs["cuzkd-fleet"]["file_sd_configs"][0]["files"] == ["targets/*.yml"]
    assert all(name.startswith("cuzkd") for name in jobs), "CuzkdTargetDown matches cuzkd.*"


def test_file_sd_files_have_the_target_group_format() -> None:
    assert yaml.safe_load((PROM / "targets" / "cuzkd-fleet.yml").read_text()) == []
    example = yaml.safe_load((PROM / "targets" / "cuzkd-fleet.yml.example").read_text())
    assert example and all(set(g) <= {"targets", "labels"} for g in example)
    assert all(t.endswith(":9822") for g in example for t in g["targets"])


@pytest.mark.parametrize("name", ["prometheus.yml", "prometheus-tls.yml"])
def test_compose_prometheus_config_is_valid(tmp_path: Path, name: str) -> None:
    """deploy/prometheus.yml (and its TLS variant, compose.tls.yaml) with the rules mounted
    beside it, as compose.yaml does."""
    shutil.copy(ops.REPO / "deploy" / name, tmp_path / "prometheus.yml")
    shutil.copy(RULES, tmp_path / "cuzkd-alerts.yml")
    shutil.copy(PROM / "cuzkd-recording.yml", tmp_path / "cuzkd-recording.yml")
    result = _promtool("check", "config", "prometheus.yml", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "WARNING" not in result.stdout + result.stderr


def test_compose_tls_prometheus_config_is_the_plain_one_over_tls() -> None:
    """deploy/prometheus-tls.yml differs from deploy/prometheus.yml only in how the one job
    reaches cuzkd."""
    plain = yaml.safe_load((ops.REPO / "deploy" / "prometheus.yml").read_text())
    tls = yaml.safe_load((ops.REPO / "deploy" / "prometheus-tls.yml").read_text())
    (job,) = tls["scrape_configs"]
    assert job.pop("scheme") == "https" and job.pop("tls_config")["min_version"] == "TLS12"
    assert job.pop("basic_auth")["username"] == "prometheus"
    assert tls == plain


def test_rules_are_valid() -> None:
    result = _promtool("check", "rules", str(RULES))
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"{len(ALERTS)} rules found" in result.stdout


def test_rule_unit_tests_pass() -> None:
    result = _promtool("test", "rules", str(RULE_TESTS))
    assert result.returncode == 0, result.stdout + result.stderr


def test_every_alert_has_for_severity_and_annotations_naming_where() -> None:
    rules = _rules()
    assert set(rules) == ALERTS
    for name, rule in rules.items():
        assert "for" in rule, name
        assert rule["labels"]["severity"] in {"critical", "warning", "info"}, name
        tree = ops.parse(rule["expr"])
        per_engine = any("engine" in SERIES[s.name].labels for s in ops.selectors(tree))
        for key in ("summary", "description"):
            text = rule["annotations"][key]
            assert "{{ $labels.instance }}" in text, f"{name} {key}"
            # a non-engine alert naming the engine would render an empty name
            assert ("{{ $labels.engine }}" in text) == per_engine, f"{name} {key}"


@pytest.mark.parametrize("alert", sorted(ALERTS))
def test_alert_uses_contract_metrics_and_counters_only_in_rates(alert: str) -> None:
    tree = ops.parse(_rules()[alert]["expr"])
    for selector in ops.selectors(tree):
        assert selector.name in SERIES, selector.name
    assert ops.counter_misuse(tree, SERIES, ranges=None) == []


def test_unit_tests_cover_firing_and_quiet_cases_of_every_alert() -> None:
    doc = yaml.safe_load(RULE_TESTS.read_text(encoding="utf-8"))
    assert doc["rule_files"] == ["../cuzkd-alerts.yml"]
    firing: set[str] = set()
    quiet: set[str] = set()
    for test in doc["tests"]:
        for case in test.get("alert_rule_test", []):
            (firing if case["exp_alerts"] else quiet).add(case["alertname"])
    assert firing == ALERTS
    assert quiet == ALERTS


def _write_mutant(root: Path, alert: str, expr: str) -> Path:
    """A copy of the rules where ``alert`` has ``expr``, beside the unit tests for ``alert``.

    Only the tests that check ``alert`` are kept: the others cannot notice the mutation and
    would only cost time.
    """
    rules = yaml.safe_load(RULES.read_text(encoding="utf-8"))
    for group in rules["groups"]:
        for rule in group["rules"]:
            if rule.get("alert") == alert:
                rule["expr"] = expr
    tests = yaml.safe_load(RULE_TESTS.read_text(encoding="utf-8"))
    tests["tests"] = [t for t in tests["tests"]
                      if any(c["alertname"] == alert for c in t.get("alert_rule_test", []))]
    (root / "tests").mkdir(parents=True)
    (root / "cuzkd-alerts.yml").write_text(yaml.safe_dump(rules), encoding="utf-8")
    path = root / "tests" / RULE_TESTS.name
    path.write_text(yaml.safe_dump(tests), encoding="utf-8")
    return path


def test_unit_tests_fail_when_any_alert_is_broken(tmp_path: Path) -> None:
    """Each alert made to never fire, then to always fire: the unit tests must fail each time.

    All mutants go to one promtool run (it reports every test file separately), which keeps
    this fast.
    """
    mutations = {"never-fires": "vector(1) == 2", "always-fires": "vector(1)"}
    files = {(alert, name): _write_mutant(tmp_path / f"{alert}-{name}", alert, expr)
             for alert in sorted(ALERTS) for name, expr in mutations.items()}
    result = _promtool("test", "rules", *map(str, files.values()))
    output = result.stdout + result.stderr
    sections = output.split("Unit Testing:")[1:]
    assert len(sections) == len(files), output
    verdicts = {section.split()[0]: "SUCCESS" not in section for section in sections}
    survivors = [key for key, path in files.items() if not verdicts[str(path)]]
    assert not survivors, f"unit tests still pass for: {survivors}"
