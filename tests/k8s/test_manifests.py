"""deploy/kubernetes: every object kustomize renders is valid and does what the issue asks.

Validation is offline: Kubernetes objects against the schemas ``kubernetes-validate`` ships
(strict: unknown fields are errors), the Prometheus Operator's objects against the pinned
field list beside this file. The DaemonSet's properties (no surge, hash-suffixed config,
hostPath state, probes, grace period, security context) are checked on the rendered objects,
and the ConfigMap's cuzkd.toml through cuzkd's own config loader.
"""

from __future__ import annotations

import copy
import shutil
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from support import k8s

from cuzkd.config import load_config
from cuzkd.units import parse_listen

KUBERNETES_VERSION = "1.37.0"
RENDERED = {name: k8s.render(k8s.KUSTOMIZE_ROOT / name) for name in k8s.OVERLAYS}
OBJECTS = [(name, obj) for name, objects in RENDERED.items() for obj in objects]
KINDS = {"Namespace", "ServiceAccount", "ConfigMap", "DaemonSet", "PodMonitor",
         "PrometheusRule"}
#: What the supervisor may take, at most, to exit after shutdown_grace expired (engines are
#: SIGKILLed then; reaping and the exit itself are quick). The kubelet's SIGKILL must not come
#: earlier.
EXIT_MARGIN_SECS = 30


def _id(item: tuple[str, dict[str, Any]]) -> str:
    return f"{item[0]}/{item[1]['kind']}/{item[1]['metadata']['name']}"


def _pod(overlay: str) -> dict[str, Any]:
    return dict(k8s.by_kind(RENDERED[overlay], "DaemonSet")["spec"]["template"]["spec"])


def _container(overlay: str) -> dict[str, Any]:
    (container,) = _pod(overlay)["containers"]
    return dict(container)


def _config_toml(overlay: str, tmp_path: Path) -> Path:
    path = tmp_path / "cuzkd.toml"
    path.write_text(k8s.by_kind(RENDERED[overlay], "ConfigMap")["data"]["cuzkd.toml"])
    return path


# --- validation ------------------------------------------------------------------------------


def test_every_overlay_renders_the_same_kinds_in_one_namespace() -> None:
    for overlay, objects in RENDERED.items():
        assert {o["kind"] for o in objects} == KINDS, overlay
        namespaced = [o for o in objects if o["kind"] != "Namespace"]
        assert {o["metadata"]["namespace"] for o in namespaced} == {"cuzkd"}, overlay


@pytest.mark.parametrize("overlay,obj", OBJECTS, ids=[_id(x) for x in OBJECTS])
def test_object_validates_offline(overlay: str, obj: dict[str, Any]) -> None:
    if obj["kind"] in k8s.OPERATOR_KINDS:
        assert k8s.operator_problems(obj) == []
    else:
        kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True)


def test_validation_rejects_unknown_fields() -> None:
    """Strict mode is on, and the pinned field list is applied: a typo fails either way."""
    daemonset = copy.deepcopy(k8s.by_kind(RENDERED["nvidia"], "DaemonSet"))
    daemonset["spec"]["template"]["spec"]["containers"][0]["livenessProbe"]["httpGett"] = {}
    with pytest.raises(kubernetes_validate.ValidationError, match="httpGett"):
        kubernetes_validate.validate(daemonset, KUBERNETES_VERSION, strict=True)
    monitor = copy.deepcopy(k8s.by_kind(RENDERED["nvidia"], "PodMonitor"))
    monitor["spec"]["podMetricsEndpoints"][0]["intervall"] = "15s"
    monitor["spec"]["podMetricsEndpoints"][0]["scrapeTimeout"] = "ten seconds"
    problems = " | ".join(k8s.operator_problems(monitor))
    assert "intervall: not in the pinned field list" in problems
    assert "scrapeTimeout: 'ten seconds' is not a duration" in problems


# --- the DaemonSet ---------------------------------------------------------------------------


@pytest.mark.parametrize("overlay", k8s.OVERLAYS)
def test_daemonset_rolls_one_node_at_a_time_without_surge(overlay: str) -> None:
    strategy = k8s.by_kind(RENDERED[overlay], "DaemonSet")["spec"]["updateStrategy"]
    assert strategy["type"] == "RollingUpdate"
    assert strategy["rollingUpdate"] == {"maxSurge": 0, "maxUnavailable": 1}


@pytest.mark.parametrize("overlay", k8s.OVERLAYS)
def test_supervisor_is_pid_1_with_the_images_entrypoint(overlay: str) -> None:
    """No command/args: the image runs ``cuzkd run --config /etc/cuzkd/cuzkd.toml`` as PID 1,
    with the config mounted where that command line reads it."""
    container = _container(overlay)
    assert "command" not in container and "args" not in container
    entrypoint = (k8s.REPO / "Dockerfile").read_text().split("ENTRYPOINT ")[1].splitlines()[0]
    assert yaml.safe_load(entrypoint) == ["cuzkd", "run", "--config", "/etc/cuzkd/cuzkd.toml"]
    mounts = {m["name"]: m for m in container["volumeMounts"]}
    assert mounts["config"]["mountPath"] == "/etc/cuzkd" and mounts["config"]["readOnly"]
    assert _pod(overlay).get("shareProcessNamespace") is not True


@pytest.mark.parametrize("overlay", k8s.OVERLAYS)
def test_config_map_is_hash_suffixed_referenced_and_valid(overlay: str,
                                                          tmp_path: Path) -> None:
    config_map = k8s.by_kind(RENDERED[overlay], "ConfigMap")
    name = config_map["metadata"]["name"]
    assert name.startswith("cuzkd-config-") and len(name) > len("cuzkd-config-")
    volumes = {v["name"]: v for v in _pod(overlay)["volumes"]}
    assert volumes["config"]["configMap"]["name"] == name
    config = load_config(_config_toml(overlay, tmp_path))  # exits 78-style on a bad file
    assert str(config.supervisor.state_dir) == "/var/lib/cuzkd"


def test_a_config_change_renames_the_config_map_so_pods_roll(tmp_path: Path) -> None:
    copy_root = tmp_path / "kubernetes"
    shutil.copytree(k8s.KUSTOMIZE_ROOT, copy_root)
    toml = copy_root / "base" / "cuzkd.toml"
    toml.write_text(toml.read_text().replace('shutdown_grace = "60s"', 'shutdown_grace = "50s"'))
    before = k8s.by_kind(RENDERED["cpu"], "ConfigMap")["metadata"]["name"]
    after_objects = k8s.render(copy_root / "cpu")
    after = k8s.by_kind(after_objects, "ConfigMap")["metadata"]["name"]
    assert after != before
    volumes = {v["name"]: v for v in k8s.by_kind(after_objects, "DaemonSet")["spec"]["template"][
        "spec"]["volumes"]}
    assert volumes["config"]["configMap"]["name"] == after


@pytest.mark.parametrize("overlay", k8s.OVERLAYS)
def test_state_dir_is_a_host_path_per_node(overlay: str, tmp_path: Path) -> None:
    state_dir = str(load_config(_config_toml(overlay, tmp_path)).supervisor.state_dir)
    volumes = {v["name"]: v for v in _pod(overlay)["volumes"]}
    assert volumes["state"]["hostPath"] == {"path": state_dir, "type": "DirectoryOrCreate"}
    mounts = {m["name"]: m["mountPath"] for m in _container(overlay)["volumeMounts"]}
    assert mounts["state"] == state_dir
    (init,) = _pod(overlay)["initContainers"]  # hands the kubelet-created dir to uid 10001
    assert init["command"] == ["chown", "10001:10001", state_dir]
    assert init["securityContext"]["capabilities"] == {"drop": ["ALL"], "add": ["CHOWN"]}


@pytest.mark.parametrize("overlay", k8s.OVERLAYS)
def test_liveness_probes_healthz_on_the_metrics_listener(overlay: str, tmp_path: Path) -> None:
    container = _container(overlay)
    listen = parse_listen(load_config(_config_toml(overlay, tmp_path)).metrics.listen)
    host, port = listen.host, listen.port
    assert host == "0.0.0.0"  # the pod IP, where the kubelet and Prometheus connect
    (metrics_port,) = container["ports"]
    assert (metrics_port["name"], metrics_port["containerPort"]) == ("metrics", port)
    for probe in ("livenessProbe", "readinessProbe"):
        assert container[probe]["httpGet"] == {"path": "/healthz", "port": "metrics"}, probe


@pytest.mark.parametrize("overlay", k8s.OVERLAYS)
def test_grace_period_exceeds_shutdown_grace(overlay: str, tmp_path: Path) -> None:
    grace = load_config(_config_toml(overlay, tmp_path)).supervisor.shutdown_grace
    assert _pod(overlay)["terminationGracePeriodSeconds"] >= grace + EXIT_MARGIN_SECS


@pytest.mark.parametrize("overlay", k8s.OVERLAYS)
def test_security_context_and_resources(overlay: str) -> None:
    pod, container = _pod(overlay), _container(overlay)
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] == 10001  # the image's user
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert pod["automountServiceAccountToken"] is False
    context = container["securityContext"]
    assert context == {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                       "capabilities": {"drop": ["ALL"]}}
    assert {"cpu", "memory"} <= set(container["resources"]["requests"])
    assert "memory" in container["resources"]["limits"]
    mounts = {m["mountPath"] for m in container["volumeMounts"]}
    assert "/tmp" in mounts  # writable scratch on a read-only root


def test_nvidia_overlay_requests_gpus_on_gpu_nodes() -> None:
    pod, container = _pod("nvidia"), _container("nvidia")
    gpus = container["resources"]["limits"]["nvidia.com/gpu"]
    assert isinstance(gpus, int) and gpus >= 1
    assert pod["nodeSelector"]["nvidia.com/gpu.present"] == "true"
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod[
        "tolerations"]
    assert container["image"].endswith("-gpu")


def test_cpu_overlay_stays_off_gpu_nodes_and_requests_no_gpu() -> None:
    pod, container = _pod("cpu"), _container("cpu")
    assert "nvidia.com/gpu" not in container["resources"].get("limits", {})
    terms = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert {"key": "nvidia.com/gpu.present", "operator": "DoesNotExist"} in terms[
        "nodeSelectorTerms"][0]["matchExpressions"]
    assert pod["nodeSelector"] == {"cuzkd/prover": "true"}
