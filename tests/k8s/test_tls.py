"""deploy/kubernetes/tls: the component that turns on TLS and basic auth, rendered in overlays.

It is rendered as an operator would use it: a copy of the overlays with ``../tls`` added to
their components (after the operator's, and without it: the PodMonitor patch must not break an
overlay that has no PodMonitor). Every object validates offline as in test_manifests.py; then
the probes, the config and the PodMonitor must all follow TLS.
"""

from __future__ import annotations

import shutil
import tomllib
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
from support import k8s

KUBERNETES_VERSION = "1.37.0"
TLS = k8s.KUSTOMIZE_ROOT / "tls"


def _render_with_tls(tmp_path: Path, overlay: str, *,
                     operator: bool = True) -> list[dict[str, Any]]:
    root = tmp_path / "kubernetes"
    shutil.copytree(k8s.KUSTOMIZE_ROOT, root)
    kustomization = root / overlay / "kustomization.yaml"
    text = kustomization.read_text(encoding="utf-8")
    assert "  - ../prometheus-operator\n" in text
    components = "  - ../prometheus-operator\n" if operator else ""
    kustomization.write_text(text.replace("  - ../prometheus-operator\n",
                                          components + "  - ../tls\n"), encoding="utf-8")
    return k8s.render(root / overlay)


@pytest.fixture(scope="module")
def rendered(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    return _render_with_tls(tmp_path_factory.mktemp("k8s-tls"), "nvidia")


def test_every_object_validates_offline(rendered: list[dict[str, Any]]) -> None:
    for obj in rendered:
        if obj["kind"] in k8s.OPERATOR_KINDS:
            assert k8s.operator_problems(obj) == [], obj["kind"]
        else:
            kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True)


def test_probes_use_https_and_the_secret_is_mounted_where_the_config_reads(
        rendered: list[dict[str, Any]]) -> None:
    pod = k8s.by_kind(rendered, "DaemonSet")["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    for probe in ("livenessProbe", "readinessProbe"):
        assert container[probe]["httpGet"] == {"path": "/healthz", "port": "metrics",
                                               "scheme": "HTTPS"}, probe
    toml = tomllib.loads(k8s.by_kind(rendered, "ConfigMap")["data"]["cuzkd.toml"])
    web_config = Path(toml["metrics"]["web_config"])
    mounts = {m["name"]: m for m in container["volumeMounts"]}
    assert web_config.parent == Path(mounts["tls"]["mountPath"]) and mounts["tls"]["readOnly"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["tls"]["secret"]["secretName"] == "cuzkd-tls"
    # group-readable files and the pod's group: the cuzkd user (not root) reads the key
    assert volumes["tls"]["secret"]["defaultMode"] == 0o440
    assert pod["securityContext"]["fsGroup"] == pod["securityContext"]["runAsGroup"]


def test_config_is_the_bases_with_a_web_config() -> None:
    """tls/cuzkd.toml replaces base/cuzkd.toml whole: it must not drift from it."""
    base = tomllib.loads((k8s.KUSTOMIZE_ROOT / "base" / "cuzkd.toml").read_text())
    tls = tomllib.loads((TLS / "cuzkd.toml").read_text())
    assert tls["metrics"].pop("web_config").endswith("/web-config.yml")
    assert tls == base


def test_pod_monitor_scrapes_over_tls_with_basic_auth(rendered: list[dict[str, Any]]) -> None:
    (endpoint,) = k8s.by_kind(rendered, "PodMonitor")["spec"]["podMetricsEndpoints"]
    assert endpoint["scheme"] == "https"
    tls = endpoint["tlsConfig"]
    assert tls["ca"]["secret"] == {"name": "cuzkd-tls", "key": "ca.crt"}
    assert tls["minVersion"] == "TLS12" and tls["serverName"] == "cuzkd"
    assert {endpoint["basicAuth"][k]["name"] for k in ("username", "password")} == {
        "cuzkd-scrape"}
    assert "insecureSkipVerify" not in tls


def test_an_overlay_without_the_operator_still_builds(tmp_path: Path) -> None:
    kinds = {o["kind"] for o in _render_with_tls(tmp_path, "cpu", operator=False)}
    assert "PodMonitor" not in kinds and "DaemonSet" in kinds
