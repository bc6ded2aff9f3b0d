"""deploy/compose.yaml, config-checked by a real compose implementation (podman-compose).

Its images (Prometheus, Grafana) cannot be pulled here, so the stack is not started: ``config``
parses and merges the files, resolves paths and refuses undeclared volumes, which is what can
be checked offline. tests/ops/test_container.py reads the same files for their meaning.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"


def _compose_config(*files: Path,
                    env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    exe = shutil.which("podman-compose") or str(Path(sys.executable).parent / "podman-compose")
    if not Path(exe).exists():
        pytest.fail("podman-compose not installed (pip install -e '.[dev]' provides it)")
    if shutil.which("podman") is None:
        pytest.fail("podman not installed (./scripts/test.sh installs it)")
    args = [a for f in files for a in ("-f", str(f))]
    return subprocess.run([exe, *args, "config"], capture_output=True, text=True, timeout=60,
                          check=False, cwd=files[0].parent,
                          env=None if env is None else {**os.environ, **env})


def _resolved(*files: Path, env: dict[str, str] | None = None) -> dict[str, Any]:
    result = _compose_config(*files, env=env)
    assert result.returncode == 0, result.stdout + result.stderr
    return dict(yaml.safe_load(result.stdout))


def test_the_stack_resolves() -> None:
    config = _resolved(DEPLOY / "compose.yaml")
    assert set(config["services"]) == {"cuzkd", "prometheus", "grafana"}
    cuzkd = config["services"]["cuzkd"]
    assert Path(cuzkd["build"]["context"]).resolve() == REPO
    assert (REPO / cuzkd["build"]["dockerfile"]).is_file()
    assert cuzkd["command"] == ["--demo"]


def test_the_gpu_override_merges_into_the_stack() -> None:
    config = _resolved(DEPLOY / "compose.yaml", DEPLOY / "compose.gpu.yaml")
    cuzkd = config["services"]["cuzkd"]
    args = cuzkd["build"]["args"]  # normalised to a list of "KEY=VALUE"
    args = dict(a.split("=", 1) for a in args) if isinstance(args, list) else args
    assert args["BASE_IMAGE"].startswith("nvidia/cuda:12.") and args["EXTRAS"] == "gpu"
    assert cuzkd["deploy"]["resources"]["reservations"]["devices"][0]["driver"] == "nvidia"
    assert cuzkd["command"] == ["--demo"], "the override keeps the base service's settings"
    assert set(config["services"]) == {"cuzkd", "prometheus", "grafana"}


def test_the_check_refuses_a_broken_stack(tmp_path: Path) -> None:
    """Not vacuous: a service mounting an undeclared named volume is refused."""
    text = (DEPLOY / "compose.yaml").read_text(encoding="utf-8")
    broken = tmp_path / "compose.yaml"
    broken.write_text(text.replace("cuzkd-state:/var/lib/cuzkd", "undeclared:/var/lib/cuzkd"))
    result = _compose_config(broken)
    assert result.returncode != 0
    assert "undeclared" in result.stdout + result.stderr


AGENT_ENV = {"CUZKD_HOST_ID": "gpu-host-17", "CUZKD_REMOTE_WRITE_PASSWORD_FILE": "/dev/null",
             "CUZKD_SCRAPE_PASSWORD_FILE": "/dev/null", "CUZKD_CA_FILE": "/dev/null"}


def test_the_agent_override_adds_the_agent_beside_cuzkd() -> None:
    config = _resolved(DEPLOY / "compose.yaml", DEPLOY / "compose.agent.yaml", env=AGENT_ENV)
    agent = config["services"]["prometheus-agent"]
    assert agent["environment"]["CUZKD_HOST_ID"] == "gpu-host-17"
    assert agent["network_mode"] == "service:cuzkd"
    assert config["secrets"]["remote-write-password"]["file"] == "/dev/null"
    assert config["services"]["cuzkd"]["command"] == ["--demo"], "cuzkd's service unchanged"


@pytest.mark.parametrize("missing", sorted(AGENT_ENV))
def test_the_agent_override_refuses_a_host_without_identity_or_credentials(missing: str) -> None:
    """Any left out: refused by name, never a host pushing as 127.0.0.1:9822."""
    env = {**AGENT_ENV, missing: ""}
    result = _compose_config(DEPLOY / "compose.yaml", DEPLOY / "compose.agent.yaml", env=env)
    assert result.returncode != 0
    assert missing in result.stdout + result.stderr


def test_the_tls_override_resolves_and_needs_its_files() -> None:
    files = (DEPLOY / "compose.yaml", DEPLOY / "compose.tls.yaml")
    env = {"CUZKD_TLS_DIR": "/srv/tls", "CUZKD_SCRAPE_PASSWORD_FILE": "/dev/null"}
    config = _resolved(*files, env=env)
    assert "/srv/tls:/etc/cuzkd/tls:ro" in config["services"]["cuzkd"]["volumes"]
    assert "./cuzkd-tls.toml:/etc/cuzkd/cuzkd.toml:ro" in config["services"]["cuzkd"]["volumes"]
    assert "./cuzkd.toml:/etc/cuzkd/cuzkd.toml:ro" not in config["services"]["cuzkd"]["volumes"]
    result = _compose_config(*files, env={**env, "CUZKD_TLS_DIR": ""})
    assert result.returncode != 0 and "CUZKD_TLS_DIR" in result.stdout + result.stderr
