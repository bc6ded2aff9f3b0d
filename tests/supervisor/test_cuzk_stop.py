"""Stops of a cuzk engine end to end: ``cuzkd run`` supervising the cuzk stand-in under load.

A cuzk cannot drain itself, so cuzkd waits for a moment when it holds no job (``/status`` and
``GetStatus``), then SIGTERM (which kills cuzk at once); what a forced stop throws away is
counted per job and proof kind. Durations are the stand-in's real (short) seconds.
"""

from __future__ import annotations

import time
import urllib.request
from pathlib import Path
from typing import Any

from support.cuzk_harness import LoadThread, cuzk_engine
from support.supervisor_harness import RunningSupervisor, start_supervisor, write_config
from support.waiting import wait_until

#: one PoRep C2 job: 10 partitions x 0.2 s synthesis (all at once), then 10 x 0.05 s on 2 GPUs
FAST_JOBS = {"CUZK_STANDIN_SYNTH_SECS": "0.2", "CUZK_STANDIN_GPU_SECS": "0.05"}
JOB_SECONDS = 0.2 + 10 * 0.05 / 2


def metric(sup: RunningSupervisor, name: str, **labels: str) -> float:
    with urllib.request.urlopen(f"http://{sup.about()['metrics_listen']}/metrics",
                                timeout=10) as resp:
        text = resp.read().decode()
    want = ",".join(f'{k}="{v}"' for k, v in labels.items())
    line = next(line for line in text.splitlines() if line.startswith(f"{name}{{{want}}}"))
    return float(line.split()[-1])


def started(tmp_path: Path, env: dict[str, str], supervisor: dict[str, Any] | None = None,
            **keys: Any) -> tuple[RunningSupervisor, str, int]:
    engine, grpc = cuzk_engine(tmp_path, env=env, **keys)
    sup = start_supervisor(write_config(tmp_path, [engine], supervisor=supervisor))
    pid = sup.wait_engine("cuzk", lambda e: e["state"] == "running")["pid"]
    return sup, grpc, pid


def restart(sup: RunningSupervisor) -> float:
    began = time.monotonic()
    status, body = sup.request("POST", "/v1/engines/cuzk/restart", timeout=60)
    assert status == 200, body
    return time.monotonic() - began


def test_a_restart_under_light_load_loses_no_job_within_one_jobs_time(tmp_path: Path) -> None:
    """Also with a job cuzk left behind (a failed partition: listed in /status for good)."""
    sup, grpc, pid = started(tmp_path, {**FAST_JOBS, "CUZK_STANDIN_FAIL": "porep-9-9:4"})
    load = LoadThread(grpc, ["porep-c2"], lambda load: None)
    try:
        assert load.load is not None
        assert load.run(load.load.prove_one("porep-c2", "porep-9-9")) == "failed"
        load.shape(lambda load: load.light(gap=2.0))
        wait_until(lambda: len(load.sent) > 1, 10, "a job sent")
        took = restart(sup)
        sent = load.stop()
        [drained] = sup.events("engine_drained", pid=pid)
        assert (drained["mode"], drained["result"]) == ("cuzk", "clean")
        assert drained["seconds"] <= JOB_SECONDS + 0.5
        assert took < JOB_SECONDS + 3.0  # the drain, SIGTERM, and the new cuzk up
        assert [s.outcome for s in sent][:2] == ["failed", "completed"]
        assert "lost" not in [s.outcome for s in sent]
        assert metric(sup, "cuzkd_engine_jobs_lost_total", engine="cuzk", kind="porep-c2") == 0
        assert not sup.events("engine_stop_jobs_lost")
    finally:
        load.stop()
        assert sup.stop() == 0


def test_a_restart_under_steady_load_waits_drain_timeout_then_counts_jobs_lost(
        tmp_path: Path) -> None:
    sup, grpc, pid = started(tmp_path, FAST_JOBS, drain_timeout="1500ms")
    load = LoadThread(grpc, ["porep-c2", "snap-update"], lambda load: load.steady(4))
    try:
        wait_until(lambda: len(load.sent) >= 6, 10, "the load going")
        restart(sup)
        [drain] = sup.events("engine_drain", pid=pid)
        [drained] = sup.events("engine_drained", pid=pid)
        assert (drain["mode"], drained["result"]) == ("cuzk", "timeout")
        assert 1.5 <= drained["seconds"] < 2.5
        [stop] = sup.events("engine_stop", pid=pid)
        assert stop["signal"] == "SIGTERM"
        assert not sup.events("engine_kill", pid=pid), "SIGTERM kills cuzk at once"
        [lost] = sup.events("engine_stop_jobs_lost")
        sent = load.stop()
        dropped = {s.job_id for s in sent if s.outcome == "lost"}
        assert dropped and dropped <= set(lost["job_ids"])
        counted = {kind: metric(sup, "cuzkd_engine_jobs_lost_total", engine="cuzk", kind=kind)
                   for kind in ("porep-c2", "snap-update", "window-post")}
        assert counted == {k: float(lost["jobs"].get(k, 0)) for k in counted}
        assert counted["porep-c2"] + counted["snap-update"] >= len(dropped)
        assert counted["window-post"] == 0
    finally:
        load.stop()
        assert sup.stop() == 0


def test_post_only_in_grpc_queues_holds_the_stop(tmp_path: Path) -> None:
    """WindowPoSt never shows in /status: only GetStatus says it is in progress."""
    sup, grpc, pid = started(tmp_path, {"CUZK_STANDIN_POST_SECS": "1.5"})
    load = LoadThread(grpc, ["window-post"], lambda load: load.light(gap=30))
    try:
        wait_until(lambda: load.sent, 10, "a WindowPoSt sent")
        restart(sup)
        [drained] = sup.events("engine_drained", pid=pid)
        assert drained["result"] == "clean" and drained["seconds"] >= 0.5
        [post] = load.stop()
        assert post.outcome == "completed"
    finally:
        load.stop()
        assert sup.stop() == 0


def test_a_cuzk_ignoring_all_but_sigkill_stops_within_drain_and_stop_timeout(
        tmp_path: Path) -> None:
    env = {**FAST_JOBS, "CUZK_STANDIN_IGNORE_SIGNALS": "1"}
    sup, grpc, pid = started(tmp_path, env, drain_timeout="1s", stop_timeout="1s")
    load = LoadThread(grpc, ["porep-c2"], lambda load: load.steady(3))
    try:
        wait_until(lambda: len(load.sent) >= 4, 10, "the load going")
        began = time.monotonic()
        status, body = sup.request("POST", "/v1/engines/cuzk/stop", timeout=30)
        assert status == 200 and body["state"] == "stopped", body
        assert time.monotonic() - began < 1 + 1 + 1.0
        [kill] = sup.events("engine_kill", pid=pid)
        assert kill["reason"] == "stop_timeout elapsed"
    finally:
        load.stop()
        assert sup.stop() == 0


def test_a_shutdown_drains_for_what_shutdown_grace_leaves(tmp_path: Path) -> None:
    """drain_timeout 180 s (cuzk's default), shutdown_grace 3 s: the drain gets 2 s."""
    sup, grpc, pid = started(tmp_path, FAST_JOBS, supervisor={"shutdown_grace": "3s"},
                             stop_timeout="1s")
    load = LoadThread(grpc, ["porep-c2"], lambda load: load.steady(3))
    try:
        wait_until(lambda: len(load.sent) >= 4, 10, "the load going")
        began = time.monotonic()
        assert sup.stop(timeout=30) == 0
        assert time.monotonic() - began < 3 + 2.0
        [drain] = sup.events("engine_drain", pid=pid)
        [drained] = sup.events("engine_drained", pid=pid)
        assert drain["timeout"] == 2.0 and drained["result"] == "timeout"
        assert sup.events("engine_stop", pid=pid) and not sup.events("shutdown_grace_elapsed")
    finally:
        load.stop()
        sup.close()
