"""The stop sequence end to end: drain (``http`` with the bundled engine, ``quiet`` with a
stand-in whose work ends, ``none``), the stop signal, and what stops cost in the metrics."""

from __future__ import annotations

import json
import signal
import urllib.request
from datetime import datetime
from pathlib import Path
from typing import Any

from support.supervisor_harness import (
    RunningSupervisor,
    _UnixHTTPConnection,
    scripted_engine,
    start_supervisor,
    write_config,
)
from support.waiting import wait_until

FAST = {"health_interval": "100ms"}


def at(event: dict[str, Any]) -> float:
    return datetime.fromisoformat(str(event["timestamp"])).timestamp()


def metrics(sup: RunningSupervisor) -> str:
    with urllib.request.urlopen(f"http://{sup.about()['metrics_listen']}/metrics",
                                timeout=10) as resp:
        return str(resp.read().decode())


def post_json(sock: Path, url: str, body: dict[str, Any]) -> tuple[int, Any]:
    conn = _UnixHTTPConnection(str(sock), 30)
    try:
        conn.request("POST", url, body=json.dumps(body),
                     headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        return resp.status, json.loads(resp.read() or b"null")
    finally:
        conn.close()


def test_quiet_drain_waits_for_the_work_to_end_before_the_stop_signal(tmp_path: Path) -> None:
    engines = [scripted_engine(tmp_path, "busy", args=["--progress-every", "0.1",
                                                   "--quiet-after", "2.5"],
                           drain_timeout="15s", **FAST)]
    sup = start_supervisor(write_config(tmp_path, engines))
    try:
        pid = sup.wait_engine("busy", lambda e: e["state"] == "running")["pid"]
        status, body = sup.request("POST", "/v1/engines/busy/restart")
        assert status == 200, body
        [spawned] = sup.events("engine_spawned", pid=pid)
        [drained] = sup.events("engine_drained", pid=pid)
        [stop] = sup.events("engine_stopping", pid=pid)
        assert (drained["mode"], drained["result"]) == ("quiet", "clean")
        assert at(stop) - at(spawned) >= 2.5 - 0.1, "stopped before the quiet moment"
        text = metrics(sup)
        assert 'cuzkd_engine_drains_total{engine="busy",result="clean"} 1.0' in text
        assert ('cuzkd_engine_stop_inflight_partitions_total{engine="busy",reason="operator"} '
                '0.0') in text
    finally:
        assert sup.stop() == 0


def test_drain_timeout_then_the_stop_signal_and_the_lost_work_is_counted(
        tmp_path: Path) -> None:
    engines = [scripted_engine(tmp_path, "busy", args=["--progress-every", "0.1"],
                           drain_timeout="1s", **FAST),
               scripted_engine(tmp_path, "plain", args=["--progress-every", "0.1"], drain="none",
                           **FAST)]
    sup = start_supervisor(write_config(tmp_path, engines))
    try:
        busy = sup.wait_engine("busy", lambda e: e["state"] == "running")["pid"]
        plain = sup.wait_engine("plain", lambda e: e["state"] == "running")["pid"]
        for name in ("busy", "plain"):
            status, body = sup.request("POST", f"/v1/engines/{name}/stop")
            assert status == 200 and body["state"] == "stopped", body
        [drain] = sup.events("engine_drain_requested", pid=busy)
        [drained] = sup.events("engine_drained", pid=busy)
        assert drained["result"] == "timeout" and 1.0 <= at(drained) - at(drain) < 3.0
        assert sup.events("engine_stopping", pid=busy)
        assert not sup.events("engine_drain_requested", pid=plain), \
            "drain = none: straight to the signal"
        assert sup.events("engine_stopping", pid=plain)
        text = metrics(sup)
        assert 'cuzkd_engine_drains_total{engine="busy",result="timeout"} 1.0' in text
        assert 'cuzkd_engine_drains_total{engine="plain",result="timeout"} 0.0' in text
        for name in ("busy", "plain"):  # the moving job: one or two partitions past pending
            line = next(line for line in text.splitlines() if line.startswith(
                f'cuzkd_engine_stop_inflight_partitions_total{{engine="{name}",'
                'reason="operator"}'))
            assert float(line.split()[-1]) >= 1.0, line
    finally:
        assert sup.stop() == 0


def test_bundled_engine_drains_over_http_and_no_accepted_job_is_lost(tmp_path: Path) -> None:
    """Restart (operator), then supervisor shutdown, each with jobs queued: every accepted job
    finishes; the engine exits by itself (no stop signal), drains counted clean."""
    sup = start_supervisor(write_config(tmp_path, [{"name": "ref", **FAST}]), timeout=60)
    sock = sup.state_dir / "engines" / "ref.sock"
    accepted: list[str] = []
    try:
        for round_ in range(2):
            pid = sup.wait_engine("ref", lambda e: e["state"] == "running", timeout=60)["pid"]
            for _ in range(3):
                status, body = post_json(sock, "/v1/jobs", {"proof_kind": "porep-c2",
                                                            "partitions": 4, "size_log2": 15})
                assert status == 202, body
                accepted.append(body["job_id"])
            if round_ == 0:
                status, body = sup.request("POST", "/v1/engines/ref/restart", timeout=120)
                assert status == 200, body
                [drained] = sup.events("engine_drained", pid=pid)
                assert (drained["mode"], drained["result"]) == ("http", "clean")
                assert not sup.events("engine_stopping", pid=pid), "it exited by itself"
                text = metrics(sup)
                assert 'cuzkd_engine_drains_total{engine="ref",result="clean"} 1.0' in text
                assert ('cuzkd_engine_stop_inflight_partitions_total{engine="ref",'
                        'reason="operator"} 0.0') in text
        assert sup.stop(signal.SIGTERM, timeout=120) == 0
        finished = {e["job_id"] for e in sup.events("job_finished", engine="ref")
                    if e["verified"]}
        assert finished == set(accepted)
        assert not sup.events("job_failed")
        assert [e["result"] for e in sup.events("engine_drained")] == ["clean", "clean"]
        exits = [e["cause"] for e in sup.events("engine_exited", engine="ref")]
        assert exits == ["stopped", "stopped"]
    finally:
        sup.close()
    wait_until(lambda: not sock.exists(), 5, "the engine socket removed")
