"""The configurations docs/scale.md gives for fleets beyond one Prometheus.

promtool checks each file; a real Prometheus runs the four shards' relabelling over one list of
hosts (each host on exactly one shard, every shard some); the global Prometheus federates the
per-host recorded series except those it recomputes itself (one writer per series); and the
remote-write block printed in docs/scale.md is valid configuration.
"""

from __future__ import annotations

import copy
import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import yaml
from support import ops
from support.live import Prometheus
from support.waiting import wait_until

SCALE = ops.REPO / "prometheus" / "scale"
SHARD, GLOBAL = SCALE / "prometheus-shard.yml", SCALE / "prometheus-global.yml"
SHARDS = 4


def _check_config(config: dict[str, Any], where: Path) -> None:
    """promtool check config of ``config`` written in ``where`` (with copies of the rule files
    and the file_sd targets at the relative paths the shipped files use)."""
    (where / "prometheus").mkdir(parents=True, exist_ok=True)
    for rules in ("cuzkd-alerts.yml", "cuzkd-recording.yml"):
        shutil.copy(ops.REPO / "prometheus" / rules, where / rules)
    shutil.copytree(ops.REPO / "prometheus" / "targets", where / "targets")
    path = where / "prometheus" / "config.yml"
    path.write_text(yaml.safe_dump(config))
    result = subprocess.run(["promtool", "check", "config", str(path)], capture_output=True,
                            text=True, timeout=60, check=False)
    output = result.stdout + result.stderr
    assert result.returncode == 0 and "WARNING" not in output, output


def _yaml(path: Path) -> dict[str, Any]:
    return dict(yaml.safe_load(path.read_text(encoding="utf-8")))


def test_shard_and_global_configs_are_valid() -> None:
    for path in (SHARD, GLOBAL):
        result = subprocess.run(["promtool", "check", "config", str(path)], capture_output=True,
                                text=True, timeout=60, check=False)
        assert result.returncode == 0, result.stdout + result.stderr
        assert "WARNING" not in result.stdout + result.stderr
    (job,) = _yaml(GLOBAL)["scrape_configs"]
    assert not job["job_name"].startswith("cuzkd"), "its up would count as a cuzkd host"
    assert job["honor_labels"] is True


def test_shards_split_the_hosts_disjointly_and_completely(tmp_path: Path) -> None:
    """Four jobs, each the shipped shard job keeping one remainder, in a real Prometheus."""
    hosts = [f"gpu-host-{i:02d}.example.internal:9822" for i in range(40)]
    (tmp_path / "hosts.json").write_text(json.dumps([{"targets": hosts}]))
    (shard_job,) = _yaml(SHARD)["scrape_configs"]
    jobs = []
    for shard in range(SHARDS):
        job = copy.deepcopy(shard_job)
        job["job_name"] = f"shard-{shard}"
        job["file_sd_configs"] = [{"files": ["hosts.json"]}]
        job["relabel_configs"][-1]["regex"] = str(shard)
        jobs.append(job)
    prometheus = Prometheus.start(tmp_path, [], scrape_configs=jobs, scrape_interval="15s")
    try:
        def discovered() -> list[dict[str, Any]] | None:
            data = prometheus.data("targets")
            total = len(data["activeTargets"]) + len(data["droppedTargets"])
            return data["activeTargets"] if total == SHARDS * len(hosts) else None

        active = wait_until(discovered, 30, "every shard's targets", interval=0.1)
    finally:
        prometheus.stop()
    by_shard: dict[str, set[str]] = {}
    for target in active:
        by_shard.setdefault(target["scrapePool"], set()).add(target["labels"]["instance"])
    assert len(by_shard) == SHARDS, "a shard got no host"
    assert sum(len(s) for s in by_shard.values()) == len(hosts)  # disjoint ...
    assert set().union(*by_shard.values()) == set(hosts)         # ... and complete


def _federated(name: str, matcher: str) -> bool:
    """Whether ``{__name__=~"...", __name__!~"..."}`` selects the series name ``name``."""
    regexes = re.findall(r'__name__(=~|!~|=)"([^"]*)"', matcher)
    return all((re.fullmatch(value, name) is not None) == (op != "!~")
               for op, value in regexes)


def test_global_federates_every_per_host_record_it_does_not_compute_itself() -> None:
    (job,) = _yaml(GLOBAL)["scrape_configs"]
    recorded_matcher = next(m for m in job["params"]["match[]"] if "instance" in m)
    doc = _yaml(ops.RECORDING_RULES)
    recorded = ops.recorded_series()
    for group in doc["groups"]:
        for rule in group["rules"]:
            name = rule["record"]
            if not name.startswith("instance"):
                assert not _federated(name, recorded_matcher), f"{name} is fleet-level"
                continue
            reads = {s.name for s in ops.selectors(ops.parse(rule["expr"]))}
            recomputed = reads <= set(recorded)  # the global has its inputs
            assert _federated(name, recorded_matcher) != recomputed, name
    assert '{__name__="up", job=~"cuzkd.*"}' in job["params"]["match[]"]


def test_remote_write_example_in_the_docs_is_valid(tmp_path: Path) -> None:
    text = (ops.REPO / "docs" / "scale.md").read_text(encoding="utf-8")
    blocks = [b for b in re.findall(r"```yaml\n(.*?)```", text, re.S) if "remote_write:" in b]
    assert blocks, "docs/scale.md shows no remote_write configuration"
    for block in blocks:
        config = {**_yaml(SHARD), **yaml.safe_load(block)}
        _check_config(config, tmp_path)
