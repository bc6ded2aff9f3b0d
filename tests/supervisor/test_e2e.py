"""End to end with the real bundled engine and --demo: /healthz, /status, /metrics move."""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path
from typing import Any

from support.supervisor_harness import start_supervisor, write_config
from support.waiting import wait_until


def get(url: str) -> tuple[int, bytes]:
    with urllib.request.urlopen(url, timeout=10) as resp:
        return resp.status, resp.read()


def test_bundled_engine_with_demo_load(tmp_path: Path) -> None:
    config = write_config(tmp_path, [{"name": "cpu0", "health_interval": "200ms"}])
    # a file from before cuzk's kind names: taken, and the daemon says what to change
    config.write_text(config.read_text().replace(
        '[metrics]\n', '[metrics]\nproof_deadlines = { wpost = "30m" }\n', 1))
    sup = start_supervisor(config, extra_args=["--demo"])
    try:
        sup.wait_engine("cpu0", lambda e: e["state"] == "running", timeout=60)
        base = f"http://{sup.about()['metrics_listen']}"
        assert get(f"{base}/healthz")[0] == 200

        def completed() -> Any:
            doc = json.loads(get(f"{base}/status")[1])
            status = doc["engines"][0]["status"]
            return status and status["counters"]["total_completed"] > 0 and doc

        doc = wait_until(completed, 60, "demo jobs to complete", interval=0.5)
        assert doc["supervisor"]["engines_running"] == 1
        assert doc["engines"][0]["status_address"].startswith("unix:")
        status, body = get(f"{base}/metrics")
        assert status == 200 and body
        # completed demo jobs are timed end to end, beside the deadlines they are held to
        text = body.decode()
        assert 'cuzk_job_duration_seconds_count{engine="cpu0",proof_kind=' in text
        assert 'cuzkd_proof_deadline_seconds{proof_kind="winning-post"} 20.0' in text
        assert 'cuzkd_proof_deadline_seconds{proof_kind="window-post"} 1800.0' in text
        [warning] = sup.events("config_warning")
        assert warning["detail"].startswith(f"{config}: key `metrics.proof_deadlines.wpost`: ")
        assert 'cuzkd_engine_stalled{engine="cpu0"} 0.0' in text
    finally:
        assert sup.stop() == 0
