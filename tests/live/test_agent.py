"""A host behind NAT: a real Prometheus agent pushes cuzkd's metrics to a real central one.

The agent runs the shipped ``prometheus/prometheus-agent.yml`` changed only where a test must:
its target is the live supervisor's port instead of 9822, the central URL is a second
Prometheus started with its remote-write receiver, the password file is a temporary one, and
intervals are 1 s. The host identity comes from the environment, as the systemd unit and the
compose service give it. The central Prometheus scrapes nothing: everything it holds was pushed,
and it evaluates the shipped recording rules over it.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest
import yaml
from support.live import Prometheus, by_label
from support.live_stack import RECORDING_RULES, REPO, LiveStack

AGENT_CONFIG = REPO / "prometheus" / "prometheus-agent.yml"
HOST = "gpu-host-17"
PUSH = f'job="cuzkd-push", instance="{HOST}"'


def _agent_config(target: str, central: str, password_file: Path) -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load(AGENT_CONFIG.read_text(encoding="utf-8"))
    doc["global"]["scrape_interval"] = "1s"
    (job,) = doc["scrape_configs"]
    job["scrape_timeout"] = "1s"
    (group,) = job["static_configs"]
    assert group["targets"] == ["127.0.0.1:9822"], "the shipped agent scrapes the local cuzkd"
    group["targets"] = [target]
    (write,) = doc["remote_write"]
    write["url"] = f"{central}/api/v1/write"
    write["basic_auth"]["password_file"] = str(password_file)
    write["queue_config"] = {"batch_send_deadline": "1s"}  # default 5 s: a slower test only
    return doc


@pytest.fixture(scope="module")
def central(live: LiveStack, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Prometheus]:
    tmp = tmp_path_factory.mktemp("agent")
    password = tmp / "remote-write-password"
    password.write_text("push-secret\n")
    with ExitStack() as cleanup:
        receiver = Prometheus.start(tmp / "central", [], rule_files=[RECORDING_RULES],
                                    scrape_configs=[],
                                    flags=["--web.enable-remote-write-receiver"])
        cleanup.callback(receiver.stop)
        target = live.metrics_url.removeprefix("http://").removesuffix("/metrics")
        agent = Prometheus.start(tmp / "agent", [], agent=True,
                                 config=_agent_config(target, receiver.url, password),
                                 env={**os.environ, "CUZKD_HOST_ID": HOST})
        cleanup.callback(agent.stop)
        yield receiver


def test_pushed_series_carry_the_host_identity_and_nothing_else(central: Prometheus) -> None:
    central.wait_for(f"up{{{PUSH}}}", lambda v: list(v.values()) == [1.0], 30,
                     "the agent's up == 1 pushed under the host identity")
    engines = central.wait_for(f"cuzkd_engine_up{{{PUSH}}}",
                               lambda v: {"b0", "b1", "example"} <= set(by_label(v, "engine")),
                               30, "the engines' series pushed")
    assert all(dict(labels)["instance"] == HOST for labels in engines)
    # every pushed series, not only these (records, named level:metric:op, are made here):
    # one instance, and the helper label not sent
    pushed = 'count by (instance) ({job="cuzkd-push", __name__!~".+:.+"})'
    assert set(by_label(central.values(pushed), "instance")) == {HOST}
    assert central.values('count({cuzkd_host!=""})') == {}


def test_recording_rules_evaluate_over_pushed_series(central: Prometheus) -> None:
    central.wait_for('job:cuzkd_hosts_up:sum{job="cuzkd-push"}',
                     lambda v: list(v.values()) == [1.0], 30,
                     "the fleet's hosts-up record over the pushed host")
    records = central.wait_for(f"instance:cuzkd_engines:count{{{PUSH}}}",
                               lambda v: len(v) == 1, 30, "the per-host engine count")
    pushed = central.values(f"count(cuzkd_engine_up{{{PUSH}}})")
    assert list(records.values()) == list(pushed.values())
