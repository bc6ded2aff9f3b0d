"""Stops of a cuzk engine end to end: ``cuzkd run`` supervising the cuzk stand-in under load.

A cuzk cannot drain itself, so cuzkd waits for a moment when it holds no job (``/status`` and
``GetStatus``), then SIGTERM (which kills cuzk at once); what a forced stop throws away is
counted per job and proof kind. Durations are the stand-in's real (short) seconds. One
supervisor runs one cuzk per test (each loaded only by its own test); the shutdown has its own.
"""

from __future__ import annotations

import asyncio
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support.cuzk_harness import LoadThread, cuzk_engine
from support.supervisor_harness import RunningSupervisor, start_supervisor, write_config
from support.waiting import wait_until

from cuzkd.cuzk.client import read_queues

#: one PoRep C2 job: 10 partitions x 0.2 s synthesis (all at once), then 10 x 0.05 s on 2 GPUs
FAST_JOBS = {"CUZK_STANDIN_SYNTH_SECS": "0.2", "CUZK_STANDIN_GPU_SECS": "0.05"}
JOB_SECONDS = 0.2 + 10 * 0.05 / 2
#: engine name -> (its stand-in's knobs, its keys)
ENGINES: dict[str, tuple[dict[str, str], dict[str, Any]]] = {
    "light": ({**FAST_JOBS, "CUZK_STANDIN_FAIL": "porep-9-9:4"}, {}),
    "steady": (FAST_JOBS, {"drain_timeout": "1500ms"}),
    "post": ({"CUZK_STANDIN_POST_SECS": "1.5"}, {"grpc_telemetry_interval": "300ms"}),
    "stubborn": ({**FAST_JOBS, "CUZK_STANDIN_IGNORE_SIGNALS": "1"},
                 {"drain_timeout": "1s", "stop_timeout": "1s"}),
}


class Fleet:
    def __init__(self, tmp: Path) -> None:
        tables, self.grpc = [], {}
        for name, (env, keys) in ENGINES.items():
            table, self.grpc[name] = cuzk_engine(tmp, name, env=env, **keys)
            tables.append(table)
        self.sup = start_supervisor(write_config(tmp, tables))

    def running(self, name: str) -> int:
        """The engine's pid once it runs."""
        return int(self.sup.wait_engine(name, lambda e: e["state"] == "running")["pid"])

    def restart(self, name: str) -> float:
        began = time.monotonic()
        status, body = self.sup.request("POST", f"/v1/engines/{name}/restart", timeout=60)
        assert status == 200, body
        return time.monotonic() - began


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    fleet = Fleet(tmp_path_factory.mktemp("cz"))
    try:
        yield fleet
    finally:
        assert fleet.sup.stop() == 0


def metric(sup: RunningSupervisor, name: str, **labels: str) -> float | None:
    """The series' value in a scrape now; None when the scrape has no such series."""
    with urllib.request.urlopen(f"http://{sup.about()['metrics_listen']}/metrics",
                                timeout=10) as resp:
        text = resp.read().decode()
    want = ",".join(f'{k}="{v}"' for k, v in labels.items())
    line = next((line for line in text.splitlines() if line.startswith(f"{name}{{{want}}}")),
                None)
    return None if line is None else float(line.split()[-1])


def test_a_restart_under_light_load_loses_no_job_within_one_jobs_time(fleet: Fleet) -> None:
    """Also with a job cuzk left behind (a failed partition: listed in /status for good)."""
    sup, pid = fleet.sup, fleet.running("light")
    load = LoadThread(fleet.grpc["light"], ["porep-c2"], lambda load: None)
    try:
        assert load.load is not None
        assert load.run(load.load.prove_one("porep-c2", "porep-9-9")) == "failed"
        load.shape(lambda load: load.light(gap=2.0))
        wait_until(lambda: len(load.sent) > 1, 10, "a job sent")
        took = fleet.restart("light")
        sent = load.stop()
        [drained] = sup.events("engine_drained", pid=pid)
        assert (drained["mode"], drained["result"]) == ("cuzk", "clean")
        assert drained["seconds"] <= JOB_SECONDS + 1.0  # the rest of one job, two reads
        assert took < JOB_SECONDS + 3.0  # the drain, SIGTERM, and the new cuzk up
        assert [s.outcome for s in sent][:2] == ["failed", "completed"]
        assert "lost" not in [s.outcome for s in sent]
        assert metric(sup, "cuzkd_engine_jobs_lost_total", engine="light", kind="porep-c2") == 0
        assert not sup.events("engine_jobs_lost", engine="light")
    finally:
        load.stop()


def test_a_restart_under_steady_load_waits_drain_timeout_then_counts_jobs_lost(
        fleet: Fleet) -> None:
    sup, pid = fleet.sup, fleet.running("steady")
    load = LoadThread(fleet.grpc["steady"], ["porep-c2", "snap-update"],
                      lambda load: load.steady(4))
    try:
        wait_until(lambda: len(load.sent) >= 6, 10, "the load going")
        fleet.restart("steady")
        [drain] = sup.events("engine_drain_requested", pid=pid)
        [drained] = sup.events("engine_drained", pid=pid)
        assert (drain["mode"], drained["result"]) == ("cuzk", "timeout")
        assert 1.5 <= drained["seconds"] < 3.5
        [stop] = sup.events("engine_stopping", pid=pid)
        assert stop["signal"] == "SIGTERM"
        assert not sup.events("engine_killed", pid=pid), "SIGTERM kills cuzk at once"
        [lost] = sup.events("engine_jobs_lost", engine="steady")
        sent = load.stop()
        dropped = {s.job_id for s in sent if s.outcome == "lost"}
        named = set(lost["job_ids"])
        # counted by the drain's last read (0.1 s before SIGTERM): a lane may have replaced a
        # job that finished in between (named, not lost) with one sent after it (lost, unnamed)
        assert dropped and len(dropped - named) <= 4 and len(named - dropped) <= 4
        # a lane is between two jobs, or its job still queued (counted, no id yet), at times
        total = sum(lost["jobs"].values())
        assert named <= {s.job_id for s in sent} and len(named) <= total and 2 <= total <= 4
        counted = {kind: metric(sup, "cuzkd_engine_jobs_lost_total", engine="steady",
                                kind=kind) for kind in ("porep-c2", "snap-update", "window-post")}
        assert counted == {k: float(lost["jobs"].get(k, 0)) for k in counted}
        assert counted["window-post"] == 0
    finally:
        load.stop()


def test_a_gpu_proving_post_shows_busy_in_the_grpc_telemetry_alone(fleet: Fleet) -> None:
    """/status shows the worker idle; the gRPC families show the WindowPoSt, then count it."""
    sup = fleet.sup
    fleet.running("post")
    load = LoadThread(fleet.grpc["post"], ["window-post"], lambda load: load.light(gap=30))
    post = {"engine": "post", "proof_kind": "window-post"}
    try:
        wait_until(lambda: metric(sup, "cuzk_grpc_gpu_workers_proving", engine="post", gpu="0",
                                  proof_kind="window-post") == 1, 10, "the PoSt in the telemetry")
        assert metric(sup, "cuzk_grpc_proofs_in_progress", **post) == 1
        for worker in ("0", "1"):  # /status: both idle
            assert metric(sup, "cuzk_gpu_worker_busy", engine="post", gpu="0", worker=worker) == 0
        wait_until(lambda: metric(sup, "cuzk_grpc_proofs_completed_total", **post) == 1, 10,
                   "the PoSt counted")
        assert metric(sup, "cuzk_grpc_proofs_failed_total", **post) == 0
        assert metric(sup, "cuzkd_engine_grpc_errors_total", engine="post",
                      reason="unavailable") == 0
    finally:
        load.stop()


def test_post_only_in_grpc_queues_holds_the_stop(fleet: Fleet) -> None:
    """WindowPoSt never shows in /status: only GetStatus says it is in progress, while a GPU
    worker proves it (as it synthesizes, nothing shows it: the restart waits for the GPU)."""
    sup, pid = fleet.sup, fleet.running("post")
    load = LoadThread(fleet.grpc["post"], ["window-post"], lambda load: load.light(gap=30))
    try:
        [sent] = wait_until(lambda: load.sent, 10, "a WindowPoSt sent")

        def on_gpu() -> bool:
            reading = asyncio.run(read_queues(fleet.grpc["post"], timeout=5))
            return sent.job_id in reading.current_jobs

        wait_until(on_gpu, 10, "the WindowPoSt on a GPU worker")
        fleet.restart("post")
        [drained] = sup.events("engine_drained", pid=pid)
        assert drained["result"] == "clean" and drained["seconds"] >= 0.5
        [post] = load.stop()
        assert post.outcome == "completed"
    finally:
        load.stop()


def test_a_cuzk_ignoring_all_but_sigkill_stops_within_drain_and_stop_timeout(
        fleet: Fleet) -> None:
    sup, pid = fleet.sup, fleet.running("stubborn")
    load = LoadThread(fleet.grpc["stubborn"], ["porep-c2"], lambda load: load.steady(3))
    try:
        wait_until(lambda: len(load.sent) >= 4, 10, "the load going")
        began = time.monotonic()
        status, body = sup.request("POST", "/v1/engines/stubborn/stop", timeout=30)
        assert status == 200 and body["state"] == "stopped", body
        assert time.monotonic() - began < 1 + 1 + 1.0
        [kill] = sup.events("engine_killed", pid=pid)
        assert kill["reason"] == "stop_timeout elapsed"
    finally:
        load.stop()


def test_a_shutdown_drains_for_what_shutdown_grace_leaves(tmp_path: Path) -> None:
    """drain_timeout 180 s (cuzk's default), shutdown_grace 3 s: the drain gets 2 s."""
    engine, grpc = cuzk_engine(tmp_path, env=FAST_JOBS, stop_timeout="1s")
    sup = start_supervisor(write_config(tmp_path, [engine],
                                        supervisor={"shutdown_grace": "3s"}))
    pid = sup.wait_engine("cuzk", lambda e: e["state"] == "running")["pid"]
    load = LoadThread(grpc, ["porep-c2"], lambda load: load.steady(3))
    try:
        wait_until(lambda: len(load.sent) >= 4, 10, "the load going")
        began = time.monotonic()
        assert sup.stop(timeout=30) == 0
        assert time.monotonic() - began < 3 + 4.0  # the grace, then the exit (a loaded host)
        [drain] = sup.events("engine_drain_requested", pid=pid)
        [drained] = sup.events("engine_drained", pid=pid)
        # the grace less stop_timeout, less the moments the shutdown already took
        assert 1.5 <= drain["timeout"] <= 2.0 and drained["result"] == "timeout", drain
        assert sup.events("engine_stopping", pid=pid) and not sup.events("shutdown_grace_elapsed")
    finally:
        load.stop()
        sup.close()
