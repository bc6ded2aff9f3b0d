"""Swaps under load that lose no proving work, and canary analysis that catches bad builds.

Four ``{binary}`` engines run the bundled engine behind a release wrapper (``#!/bin/sh`` exec of
``cuzkd engine`` with its test-only switches, tests/support/canary_fleet.py) under continuous
load: jobs submitted round-robin, at most ``--outstanding`` open per engine, offered to the next
engine on 503 (draining) or while one restarts. Then, with ``drain = "http"``:

1. ``cuzkd swap --analysis`` to a good build (another wrapper, same engine): every accepted job
   must complete;
2. to a build proving at half speed (``--test-slowdown 2``): the analysis must roll it back;
3. to a build failing a third of its jobs (``--test-failure-rate 1/3``): rolled back too;

and, on a second supervisor with ``drain = "none"`` and a short ``stop_timeout``, the good
swap again (no analysis) for comparison. Analysis at the production criteria (ratio 0.8,
20 partitions per kind, no failed job) over ``--window``.

For each: jobs accepted during the scenario, jobs lost (accepted and never completed: failed
for a drain timeout, or never ended; failures a bad build injects on purpose are counted
apart), partitions in flight at the stops (``cuzkd_engine_stop_inflight_partitions_total``),
the swap's duration, exit code and verdict. Prints a Markdown table (docs/benchmarks.md).

    .venv/bin/python bench/swap_analysis.py [--window 15s] [--outstanding 3] [--kind snap-update]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))  # support: canary_fleet, supervisor_harness, waiting

from support.canary_fleet import (  # noqa: E402
    Loader,
    engine_tables,
    job_outcomes,
    release_script,
)
from support.supervisor_harness import (  # noqa: E402
    RunningSupervisor,
    start_supervisor,
    write_config,
)
from support.waiting import wait_until  # noqa: E402

ENGINES = ("gpu0", "gpu1", "gpu2", "gpu3")


@dataclass
class Row:
    scenario: str
    drain: str
    code: int
    seconds: float
    verdict: str
    #: the canary's throughput over the old engines', per counted proof kind
    ratio: str
    accepted: int
    lost: int
    injected: int
    inflight: float


def inflight_at_stops(sup: RunningSupervisor) -> float:
    """Sum of ``cuzkd_engine_stop_inflight_partitions_total`` over engines and reasons."""
    with urllib.request.urlopen(f"http://{sup.about()['metrics_listen']}/metrics",
                                timeout=10) as resp:
        text = resp.read().decode()
    return sum(float(line.split()[-1]) for line in text.splitlines()
               if line.startswith("cuzkd_engine_stop_inflight_partitions_total{"))


def run_fleet(tmp: Path, drain: str, scenarios: list[tuple[str, Path, list[str]]],
              load: argparse.Namespace, **keys: str) -> list[Row]:
    tmp.mkdir()
    good = release_script(tmp / "builds", "good")
    supervisor = {"initial_binary": str(good), "release_settle": "2s", "shutdown_grace": "60s"}
    timings = {"health_interval": "250ms", "start_timeout": "60s", "drain": drain, **keys}
    config = write_config(tmp, engine_tables(tmp, ENGINES, **timings), supervisor=supervisor)
    sup = start_supervisor(config, timeout=120)
    loader = Loader({name: tmp / f"{name}.sock" for name in ENGINES}, kind=load.kind,
                    outstanding=load.outstanding)
    rows: list[Row] = []
    try:
        for name in ENGINES:
            sup.wait_engine(name, lambda e: e["state"] == "running", timeout=120)
        loader.start()
        time.sleep(5)  # every engine busy, NTT tables built
        for label, release, options in scenarios:
            before = set(loader.accepted)
            inflight_before = inflight_at_stops(sup)
            started = time.monotonic()
            done = subprocess.run(
                [sys.executable, "-m", "cuzkd", "swap", str(release), "--config", str(config),
                 "--settle", "2s", *options], capture_output=True, text=True, timeout=900)
            seconds = time.monotonic() - started
            loader.pause()
            accepted = set(loader.accepted) - before

            def dry(jobs: set[str] = accepted) -> bool:
                ended = job_outcomes(sup.events())
                return jobs <= ended.done | set(ended.failed)

            with contextlib.suppress(AssertionError):  # what never ended is counted lost
                wait_until(dry, 120, "the accepted jobs to end")
            outcomes = job_outcomes(sup.events())
            history = json.loads(subprocess.run(
                [sys.executable, "-m", "cuzkd", "swap", "--history", "--json", "--config",
                 str(config)], capture_output=True, text=True, check=True).stdout)
            record = next(r for r in history["records"] if r["release"] == release_id(release))
            analysis: dict[str, Any] | None = record["analysis"]
            verdict = "-" if analysis is None else analysis["result"]
            ratios = [] if analysis is None else [f"{k['proof_kind']} {k['ratio']:.2f}"
                                                  for k in analysis["kinds"] if k["ratio"]]
            rows.append(Row(label, drain, done.returncode, seconds,
                            f"{verdict} → {record['verdict']}", ", ".join(ratios) or "-",
                            len(accepted),
                            len(outcomes.lost(accepted)),
                            sum(1 for j in accepted if j in outcomes.failed
                                and j not in outcomes.lost(accepted)),
                            inflight_at_stops(sup) - inflight_before))
            print(f"{label}: {done.stdout.strip().splitlines()[-1] if done.stdout else ''} "
                  f"{done.stderr.strip()}", file=sys.stderr)
            loader.resume()
    finally:
        loader.stop()
        sup.stop(timeout=120)
    return rows


def release_id(path: Path) -> str:
    from cuzkd.swap.releases import source_release_id

    return source_release_id(path)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--window", default="15s", help="--analysis DURATION (default 15s)")
    parser.add_argument("--outstanding", type=int, default=3,
                        help="jobs open per engine at most (default 3)")
    parser.add_argument("--kind", default="snap-update",
                        help="proof kind of the load (default snap-update: 16 partitions of 2^11)")
    args = parser.parse_args()
    analysis = ["--analysis", args.window]
    with tempfile.TemporaryDirectory(prefix="cuzkd-swap-bench-") as raw:
        tmp = Path(raw)
        builds = tmp / "releases"
        rows = run_fleet(tmp / "http", "http", [
            ("good build", release_script(builds, "good2"), analysis),
            ("half-speed build", release_script(builds, "half", slowdown=2), analysis),
            ("1/3 of jobs fail", release_script(builds, "failing", failure_rate="1/3"),
             analysis),
        ], args)
        rows += run_fleet(tmp / "none", "none", [
            ("good build, no analysis", release_script(builds, "good3"), []),
        ], args, stop_timeout="1s")
    print("| scenario | drain | exit | swap duration | verdict → release | throughput ratio | "
          "jobs accepted | jobs lost | injected failures | partitions in flight at stops |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r.scenario} | {r.drain} | {r.code} | {r.seconds:.1f} s | {r.verdict} | "
              f"{r.ratio} | {r.accepted} | {r.lost} | {r.injected} | {r.inflight:g} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
