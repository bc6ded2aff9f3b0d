"""The rendered exposition passes Prometheus' own linter (``promtool check metrics``)."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from cuzkd.metrics.http import render, self_collectors
from cuzkd.metrics.sample import SupervisorSample


def test_promtool_check_metrics_is_silent(example_status, example_extensions, make_engine):
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.fail("promtool missing: apt-get install prometheus (scripts/test.sh does)")
    sample = SupervisorSample(
        engines=[
            make_engine("e0", status=example_status, extensions=example_extensions,
                        exits_total={"exit_1": 1}, release="r1"),
            make_engine("e1", status=example_status),
            make_engine("e2", state="backoff", start_time_seconds=None, status=None),
        ],
        zombies_reaped_total=2, swaps_total={"ok": 1}, active_release="r1",
    )
    body = render(sample, accept="", accept_encoding="", extra=self_collectors()).body
    assert b"cuzk_partition_gpu_duration_seconds_bucket" in body
    result = subprocess.run([promtool, "check", "metrics"], input=body, capture_output=True,
                            timeout=30, check=False)
    output = (result.stdout + result.stderr).decode()
    assert result.returncode == 0 and output == "", output
