"""Stops of a cuzk engine under load: what each one throws away, before and after the cuzk drain.

One ``cuzkd run`` per scenario supervises the cuzk stand-in (tests/support/cuzk_standin.py) as
a ``{binary}`` engine of ``type = "cuzk"``, loaded over its gRPC ``Prove`` as Curio loads it
(tests/support/cuzk_load.py): ``steady`` keeps ``--in-flight`` PoRep C2 / SnapDeals jobs in
flight (the next one goes as soon as one finishes), ``light`` sends one PoRep C2 or WindowPoSt
at a time with ``--gap`` seconds between them. Then one stop: ``cuzkd restart``, a ``cuzkd
swap`` to another release, or a shutdown (SIGTERM to cuzkd, ``shutdown_grace`` 30 s). Each
stop runs with the drain of before (``drain = "quiet"``, 20 s: the documented generic
configuration) and after (``drain = "cuzk"``, ``--cuzk-drain-timeout``).

For each: the jobs in flight when the stop began, the jobs lost (calls the engine dropped),
the jobs and partitions cuzkd counted lost (``cuzkd_engine_jobs_lost_total``,
``cuzkd_engine_stop_inflight_partitions_total``) and how long the stop took (request to the
old process's exit). Prints a Markdown table (docs/benchmarks.md).

    .venv/bin/python bench/cuzk_stop.py [--synth 1.0] [--gpu 0.2] [--in-flight 6] [--gap 3]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))  # support: the stand-in, its load, the harness

from support.cuzk_harness import LoadThread, cuzk_engine  # noqa: E402
from support.cuzk_load import Load  # noqa: E402
from support.cuzk_standin import SCRIPT  # noqa: E402
from support.supervisor_harness import (  # noqa: E402
    RunningSupervisor,
    start_supervisor,
    write_config,
)
from support.waiting import wait_until  # noqa: E402


@dataclass
class Row:
    load: str
    stop: str
    drain: str
    in_flight: int
    lost: int
    counted_jobs: float
    counted_partitions: float
    seconds: float


def release(tmp: Path, name: str) -> Path:
    """A release of the stand-in: a wrapper ``cuzkd swap`` can install."""
    path = tmp / name
    path.write_text(f"#!/bin/sh\nexec {sys.executable} {SCRIPT} \"$@\"\n")
    path.chmod(0o755)
    return path


def counter(sup: RunningSupervisor, name: str) -> float:
    with urllib.request.urlopen(f"http://{sup.about()['metrics_listen']}/metrics",
                                timeout=10) as resp:
        return sum(float(line.split()[-1]) for line in resp.read().decode().splitlines()
                   if line.startswith(name + "{"))


def at(event: dict[str, Any]) -> float:
    return datetime.fromisoformat(str(event["timestamp"])).timestamp()


def run(args: argparse.Namespace, load_shape: str, stop: str, drain: str) -> Row:
    with tempfile.TemporaryDirectory(prefix="czb", dir="/tmp") as name:
        tmp = Path(name)
        env = {"CUZK_STANDIN_SYNTH_SECS": str(args.synth), "CUZK_STANDIN_GPU_SECS": str(args.gpu),
               "CUZK_STANDIN_POST_SECS": str(args.post)}
        keys = ({"drain": "quiet", "drain_timeout": "20s"} if drain == "before"
                else {"drain_timeout": args.cuzk_drain_timeout})
        engine, grpc = cuzk_engine(tmp, env=env, **keys)
        engine["command"][:2] = ["{binary}"]
        supervisor = {"initial_binary": str(release(tmp, "cuzk-a")), "release_settle": "1s",
                      "shutdown_grace": "30s"}
        sup = start_supervisor(write_config(tmp, [engine], supervisor=supervisor), timeout=60)
        pid = sup.wait_engine("cuzk", lambda e: e["state"] == "running", timeout=60)["pid"]
        kinds = ["porep-c2", "snap-update"] if load_shape == "steady" else ["porep-c2",
                                                                             "window-post"]

        def shape(load: Load) -> None:
            if load_shape == "steady":
                load.steady(args.in_flight)
            else:
                load.light(args.gap)

        load = LoadThread(grpc, kinds, shape)
        time.sleep(args.warm)
        # the stop begins while a job runs (under light load: just after one was sent)
        wait_until(lambda: any(not s.outcome for s in load.sent), 60, "a job in flight")
        in_flight = sum(not s.outcome for s in load.sent)
        began = time.time()
        if stop == "restart":
            sup.request("POST", "/v1/engines/cuzk/restart", timeout=600)
        elif stop == "swap":
            subprocess.run([sys.executable, "-m", "cuzkd", "swap", "--config", str(sup.config),
                            "--settle", "1s", str(release(tmp, "cuzk-b"))], check=True,
                           stdout=subprocess.DEVNULL, env={**os.environ})
        else:
            sup.proc.send_signal(15)
            sup.proc.wait(120)
        wait_until(lambda: sup.events("engine_exited", pid=pid), 60, "the old process's exit")
        seconds = at(sup.events("engine_exited", pid=pid)[0]) - began
        if stop != "shutdown":
            jobs, parts = (counter(sup, "cuzkd_engine_jobs_lost_total"),
                           counter(sup, "cuzkd_engine_stop_inflight_partitions_total"))
        sent = load.stop()
        if stop == "shutdown":  # the counters died with the supervisor: its log has them
            lost_events = sup.events("engine_jobs_lost")
            jobs = sum(sum(e["jobs"].values()) for e in lost_events)
            parts = sum(e["partitions"] for e in sup.events("engine_inflight_lost"))
        sup.stop()
        return Row(load_shape, stop, drain, in_flight, sum(s.outcome == "lost" for s in sent),
                   jobs, parts, seconds)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--synth", type=float, default=1.0, help="seconds per partition")
    parser.add_argument("--gpu", type=float, default=0.2, help="GPU seconds per partition")
    parser.add_argument("--post", type=float, default=1.5, help="seconds per WindowPoSt")
    parser.add_argument("--in-flight", type=int, default=6)
    parser.add_argument("--gap", type=float, default=3.0)
    parser.add_argument("--warm", type=float, default=4.0, help="load before the stop (s)")
    parser.add_argument("--cuzk-drain-timeout", default="30s")
    parser.add_argument("--only", nargs="*", default=[], help="LOAD:STOP:DRAIN rows to run")
    args = parser.parse_args()
    rows = []
    for load_shape in ("light", "steady"):
        for stop in ("restart", "swap", "shutdown"):
            for drain in ("before", "after"):
                if args.only and f"{load_shape}:{stop}:{drain}" not in args.only:
                    continue
                rows.append(run(args, load_shape, stop, drain))
                print(rows[-1], file=sys.stderr, flush=True)
    print("| load | stop | drain | jobs in flight | jobs lost | counted lost jobs | "
          "counted lost partitions | stop took |")
    print("|---|---|---|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r.load} | {r.stop} | {r.drain} | {r.in_flight} | {r.lost} | "
              f"{r.counted_jobs:g} | {r.counted_partitions:g} | {r.seconds:.1f} s |")


if __name__ == "__main__":
    main()
