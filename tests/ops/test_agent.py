"""Prometheus in agent mode beside cuzkd: its config, its systemd unit, its compose service.

promtool checks the config in agent mode and systemd's verifier the unit, as for cuzkd's own
files. On top: the three install paths agree (the unit, the compose service and the config
name the same flags and the same credential path), and the host identity really reaches
``instance`` on the way out. tests/live/test_agent.py runs the config with real servers.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from support import ops
from support.live import AGENT_FLAGS

AGENT_CONFIG = ops.REPO / "prometheus" / "prometheus-agent.yml"
UNIT = ops.REPO / "systemd" / "cuzkd-prometheus-agent.service"
COMPOSE = ops.REPO / "deploy" / "compose.agent.yaml"
INSTALLED_CONFIG = "/etc/cuzkd/prometheus-agent.yml"


def _run(*argv: str) -> subprocess.CompletedProcess[str]:
    if shutil.which(argv[0]) is None:
        pytest.fail(f"{argv[0]} not installed (apt-get install prometheus systemd)")
    return subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)


def _config() -> dict[str, Any]:
    return dict(yaml.safe_load(AGENT_CONFIG.read_text(encoding="utf-8")))


def _exec_start() -> list[str]:
    """The unit's ExecStart, continuation lines joined, split into words."""
    text = UNIT.read_text(encoding="utf-8").replace("\\\n", " ")
    (line,) = [raw for raw in text.splitlines() if raw.startswith("ExecStart=")]
    return line.removeprefix("ExecStart=").split()


def _directive(key: str) -> list[str]:
    return [line.partition("=")[2] for line in UNIT.read_text(encoding="utf-8").splitlines()
            if line.startswith(f"{key}=")]


def test_config_is_valid_in_agent_mode_and_warning_free() -> None:
    result = _run("promtool", "check", "config", "--agent", str(AGENT_CONFIG))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "WARNING" not in result.stdout + result.stderr
    # a server could not load it: agent mode is what the file is for
    assert "rule_files" not in _config() and "alerting" not in _config()


def test_the_host_identity_replaces_the_scrape_address_on_every_pushed_series() -> None:
    config = _config()
    (job,) = config["scrape_configs"]
    assert job["job_name"] == "cuzkd-push", "CuzkdHostStoppedPushing matches this job"
    assert job["static_configs"] == [{"targets": ["127.0.0.1:9822"]}]
    assert job["scheme"] == "https" and job["tls_config"]["min_version"] == "TLS12"
    assert config["global"]["external_labels"] == {"cuzkd_host": "${CUZKD_HOST_ID}"}
    (write,) = config["remote_write"]
    assert write["write_relabel_configs"] == [
        {"source_labels": ["cuzkd_host"], "regex": "(.+)", "target_label": "instance"},
        {"regex": "cuzkd_host", "action": "labeldrop"}]


def test_unit_is_clean_for_systemds_verifier() -> None:
    binary = _exec_start()[0]
    assert Path(binary).exists(), f"{binary} missing: apt-get install prometheus"
    result = _run("systemd-analyze", "verify", str(UNIT))
    assert result.returncode == 0, result.stderr
    assert result.stdout + result.stderr == "", "verify printed warnings"


def test_unit_exposure_is_low_and_documented() -> None:
    result = _run("systemd-analyze", "security", "--offline=true", str(UNIT))
    match = re.search(rf"Overall exposure level for {re.escape(UNIT.name)}: (\d+\.\d+)",
                      result.stdout)
    assert match, result.stdout + result.stderr
    assert float(match.group(1)) <= 3.0
    docs = (ops.REPO / "docs" / "operations.md").read_text(encoding="utf-8")
    assert f"It scores **{match.group(1)}** on `systemd-analyze" in docs


def test_unit_runs_the_agent_on_the_shipped_config_with_the_host_identity() -> None:
    argv = _exec_start()
    assert argv[:2] == ["/usr/bin/prometheus", AGENT_FLAGS]
    assert f"--config.file={INSTALLED_CONFIG}" in argv
    assert _directive("Environment") == ["CUZKD_HOST_ID=%H"]
    assert _directive("DynamicUser") == ["yes"]
    # the listener stays on loopback: only the agent itself reads it
    (listen,) = [a for a in argv if a.startswith("--web.listen-address=")]
    assert listen.partition("=")[2].startswith("127.0.0.1:")


def test_unit_and_compose_hand_the_passwords_where_the_config_reads_them() -> None:
    config = _config()
    (write,) = config["remote_write"]
    (job,) = config["scrape_configs"]
    read = {Path(write["basic_auth"]["password_file"]), Path(job["basic_auth"]["password_file"])}
    credentials = Path("/run/credentials") / UNIT.name
    loaded = {credentials / line.partition(":")[0] for line in _directive("LoadCredential")}
    assert loaded == read
    secrets = yaml.safe_load(COMPOSE.read_text(encoding="utf-8"))["services"][
        "prometheus-agent"]["secrets"]
    mounted = {Path(s["target"]) for s in secrets}
    assert mounted == read | {Path(job["tls_config"]["ca_file"])}


def test_compose_service_runs_the_same_agent_in_cuzkds_network() -> None:
    agent = yaml.safe_load(COMPOSE.read_text(encoding="utf-8"))["services"]["prometheus-agent"]
    mounts = {v.split(":")[1]: v.split(":")[0] for v in agent["volumes"]}
    (config_flag,) = [a for a in agent["command"] if a.startswith("--config.file=")]
    source = mounts[config_flag.partition("=")[2]]
    assert (COMPOSE.parent / source).resolve() == AGENT_CONFIG
    assert agent["command"][0] == AGENT_FLAGS
    # 127.0.0.1:9822 in the config is cuzkd's own loopback
    assert agent["network_mode"] == "service:cuzkd"
    assert agent["environment"]["CUZKD_HOST_ID"].startswith("${CUZKD_HOST_ID:?")
    unit_image = yaml.safe_load((ops.REPO / "deploy" / "compose.yaml").read_text())[
        "services"]["prometheus"]["image"]
    assert agent["image"] == unit_image, "one Prometheus version in the stack"
