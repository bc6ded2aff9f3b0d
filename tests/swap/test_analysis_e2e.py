"""Canary analysis end to end: a real ``cuzkd run`` whose ``{binary}`` engines are the bundled
engine behind a release wrapper, real load, ``cuzkd swap --analysis`` to a good build, a slower
one, a failing one, and with too little work to decide; on one engine, the self-comparison.

Analysis windows are a few seconds and ``--min-partitions`` small, so each swap takes seconds;
the figures at production defaults are bench/swap_analysis.py's (docs/benchmarks.md).
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from support.canary_fleet import Loader, engine_tables, job_outcomes, release_script
from support.supervisor_harness import RunningSupervisor, start_supervisor, write_config
from support.waiting import wait_until

from cuzkd.swap.releases import source_release_id

WINDOW = "3s"
TIMINGS = {"health_interval": "200ms", "start_timeout": "30s", "stop_timeout": "5s",
           "drain_timeout": "15s"}


@dataclass
class CanaryFleet:
    sup: RunningSupervisor
    tmp: Path
    loader: Loader

    def swap(self, release: Path, *options: str) -> tuple[int, str, dict[str, Any]]:
        """``cuzkd swap`` with an analysis; (exit code, output, the history's last record)."""
        done = subprocess.run(
            [sys.executable, "-m", "cuzkd", "swap", str(release), "--config",
             str(self.sup.config), "--settle", "1s", "--analysis", WINDOW,
             "--min-partitions", "8", *options],
            capture_output=True, text=True, timeout=180)
        history = subprocess.run(
            [sys.executable, "-m", "cuzkd", "swap", "--history", "--json", "--config",
             str(self.sup.config)], capture_output=True, text=True, timeout=30, check=True)
        record = json.loads(history.stdout)["records"][-1]
        return done.returncode, done.stdout + done.stderr, record

    def releases(self) -> set[str]:
        """The release each engine's current process was started on (a wrapper script execs
        Python, so ``/proc/PID/exe`` does not name it: the spawn's argv does)."""
        spawned = {e["engine"]: Path(e["argv"][0]).parent.name
                   for e in self.sup.events("engine_spawned")}
        return set(spawned.values())


def start(tmp: Path, names: tuple[str, ...]) -> CanaryFleet:
    good = release_script(tmp / "builds", "good")
    supervisor = {"initial_binary": str(good), "release_settle": "1s", "shutdown_grace": "60s"}
    config = write_config(tmp, engine_tables(tmp, names, **TIMINGS), supervisor=supervisor)
    sup = start_supervisor(config, timeout=60)
    for name in names:
        sup.wait_engine(name, lambda e: e["state"] == "running", timeout=60)
    loader = Loader({name: tmp / f"{name}.sock" for name in names}).start()
    for name in names:  # past the warm-up (NTT tables built), or a baseline window is slow
        wait_until(lambda n=name: len(sup.events("job_finished", engine=n)) >= 20, 60,
                   f"{name} warmed up")
    return CanaryFleet(sup, tmp, loader)


@pytest.fixture
def pair(tmp_path: Path) -> Iterator[CanaryFleet]:
    fleet = start(tmp_path, ("gpu0", "gpu1"))
    try:
        yield fleet
    finally:
        fleet.loader.stop()
        fleet.sup.stop(timeout=90)


def test_each_verdict_on_two_engines_and_no_accepted_job_is_lost(pair: CanaryFleet) -> None:
    builds = pair.tmp / "builds"
    start_release = pair.releases()

    code, out, record = pair.swap(release_script(builds, "slow", slowdown=3),
                                  "--min-throughput-ratio", "0.6")
    assert code == 1, out
    assert record["verdict"] == "rejected" and record["analysis"]["result"] == "fail", record
    assert record["analysis"]["baseline"] == "peers"
    [kind] = [k for k in record["analysis"]["kinds"] if k["ratio"] is not None]
    assert kind["ratio"] < 0.6 and "throughput" in record["reason"]
    assert "analysis     fail (baseline: peers)" in out
    assert pair.releases() == start_release, "the canary is back on the old release"

    code, out, record = pair.swap(release_script(builds, "failing", failure_rate="1/3"),
                                  "--min-throughput-ratio", "0.6")
    assert code == 1, out
    assert record["analysis"]["result"] == "fail" and record["analysis"]["canary_failed_jobs"] > 0
    assert "failed job(s) on the canary" in record["reason"]

    code, out, record = pair.swap(release_script(builds, "good2"),
                                  "--min-throughput-ratio", "0.6")
    assert code == 0, out
    assert record["verdict"] == "accepted" and record["analysis"]["result"] == "pass", record
    assert len(pair.releases()) == 1 and pair.releases() != start_release

    pair.loader.pause()  # no work: nothing to compare

    def dry() -> bool:
        ended = job_outcomes(pair.sup.events())
        return set(pair.loader.accepted) <= ended.done | set(ended.failed)

    wait_until(dry, 60, "the engines to run dry")
    code, out, record = pair.swap(release_script(builds, "idle"))
    assert code == 1 and record["analysis"]["result"] == "inconclusive", out
    assert "too little work" in record["reason"]
    marker = pair.tmp / "check-env"
    check = f"{sys.executable} -c \"import os,sys; open(sys.argv[1],'w').write(os.environ[" \
            f"'CUZKD_CANARY_ENGINE'] + ' ' + os.environ['CUZKD_CANARY_STATUS_URL'])\" {marker}"
    code, out, record = pair.swap(release_script(builds, "idle"), "--on-inconclusive",
                                  "proceed", "--check", check)
    assert code == 0, out
    assert record["analysis"]["result"] == "inconclusive"
    assert record["analysis"]["check"] == "exit_0"
    assert marker.read_text() == f"gpu0 unix:{pair.tmp / 'gpu0.sock'}"
    code, out, record = pair.swap(release_script(builds, "good3"), "--check", "false",
                                  "--on-inconclusive", "proceed")
    assert code == 1 and "the check ended with exit_1" in record["reason"], out

    outcomes = job_outcomes(pair.sup.events())
    assert outcomes.lost(pair.loader.accepted) == [], "an accepted job was lost to a swap"
    swaps = [line for line in pair.sup.events("swap_step_reached") if line["step"] == "analysis"]
    assert [s["verdict"] for s in swaps] == ["fail", "fail", "pass", "inconclusive",
                                             "inconclusive", "fail"]


def test_one_engine_is_compared_with_its_own_window_before_the_swap(tmp_path: Path) -> None:
    fleet = start(tmp_path, ("gpu0",))
    try:
        code, out, record = fleet.swap(release_script(tmp_path / "builds", "slow", slowdown=3),
                                       "--min-throughput-ratio", "0.6")
        assert code == 1, out
        assert record["analysis"]["baseline"] == "self", record
        assert record["analysis"]["result"] == "fail" and "throughput" in record["reason"]
        steps = [e["step"] for e in fleet.sup.events("swap_step_reached")]
        assert steps.index("analysis_baseline") < steps.index("activated")

        # The CLI that started a swap goes away mid-analysis: the swap goes on to its verdict.
        good = release_script(tmp_path / "builds", "good2")
        cli = subprocess.Popen([sys.executable, "-m", "cuzkd", "swap", str(good), "--config",
                                str(fleet.sup.config), "--settle", "1s", "--analysis", WINDOW,
                                "--min-partitions", "8", "--min-throughput-ratio", "0.6"],
                               stdout=subprocess.PIPE, text=True)
        assert cli.stdout is not None
        for line in cli.stdout:
            if "analysis_baseline" in line:
                break
        cli.kill()
        cli.wait(10)

        def judged() -> dict[str, Any] | None:
            body = json.loads(subprocess.run(
                [sys.executable, "-m", "cuzkd", "swap", "--history", "--json", "--config",
                 str(fleet.sup.config)], capture_output=True, text=True, check=True).stdout)
            found = [r for r in body["records"] if r["release"] == release]
            return found[0] if found and found[0]["verdict"] != "pending" else None

        release = source_release_id(good)

        record = wait_until(judged, 90, "the swap to reach its verdict without its CLI")
        # judged by its analysis (pass or not: a self-comparison on a shared machine is noisy)
        assert record["analysis"]["baseline"] == "self", record
        assert record["verdict"] == {"pass": "accepted"}.get(record["analysis"]["result"],
                                                             "rejected")
    finally:
        fleet.loader.stop()
        fleet.sup.stop(timeout=90)
