"""The live stack shared by every test in tests/live (the fixture is in conftest.py).

Starting engines and a Prometheus costs seconds and the panel checks need ~30 s of history, so
the stack is session-scoped and every live test reads it; tests that disturb an engine use the
``victim`` engine, which nothing else asserts on.

Engines (one ``cuzkd run --demo`` with ``[metrics] listen`` on port 0):

* ``b0``, ``b1``: bundled reference engines (demo engines) driven by the demo's bursts;
* ``example``: serves cuzk's reference document byte for byte (``status_url``);
* ``garbage``, ``badschema``: serve non-JSON and a wrong-schema document. ``start_timeout`` is
  long so they stay ``starting`` (down, fetch errors counting) for the whole session instead of
  being killed and restarted;
* ``cuzk``: the cuzk stand-in as a ``type = "cuzk"`` engine proving WindowPoSt and WinningPoSt
  one at a time (2 s each, 1.5 s apart) over gRPC: its gRPC telemetry (every second) makes the
  ``cuzk_grpc_*`` families and ``cuzkd_engine_grpc_errors_total`` live, and its PoSt panels
  move (cuzk's /status never shows PoSt);
* ``victim``: a fake engine whose first start exits 1 (restarted at once, as the first failure
  always is). That leaves its backoff one failure deep with ``backoff_reset_after`` far away,
  so the *next* failure (the SIGKILL test) waits ``backoff_initial`` (4 s, at least 3.2 s with
  jitter) before restarting: a down window several 1 s scrapes long, by the supervisor's own
  rule rather than by luck. Its exit also makes ``cuzkd_engine_exits_total`` exist from the
  start, so the contract checks do not depend on test order. Its command is ``{binary}``
  with ``initial_binary`` set to this Python interpreter (a real ELF file, so
  ``/proc/PID/exe`` names the release): the release families (``cuzkd_binary_release_info``,
  ``cuzkd_engine_release_info``) are live too, and every family of the contract is exported.

Prometheus scrapes the supervisor every second and evaluates the shipped alert and recording
rules (the Fleet summary dashboard reads the recorded series).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cuzkd.config import BINARY_PLACEHOLDER
from support.cuzk_harness import LoadThread, cuzk_engine
from support.live import Exposition, Prometheus, file_status_engine, scrape
from support.supervisor_harness import (
    RunningSupervisor,
    scripted_engine,
    start_supervisor,
    write_config,
)

REPO = Path(__file__).resolve().parents[2]
ALERT_RULES = REPO / "prometheus" / "cuzkd-alerts.yml"
RECORDING_RULES = REPO / "prometheus" / "cuzkd-recording.yml"
RULE_FILES = (ALERT_RULES, RECORDING_RULES)
BUNDLED = ("b0", "b1")
BAD_DOCUMENTS = ("garbage", "badschema")
CUZK = "cuzk"
VICTIM_BACKOFF = 4.0
#: Pipeline panels empty without a front door (so event-only) that this stack fills: under
#: ``--demo`` the bundled engines' loads come through their doors as Prove calls, every kind
#: completing. Held calls stay at 0 (data, but steady); hold times, retries and refusals are
#: events (a healthy door has none).
DEMO_DOOR_PANELS = frozenset({
    "Front door: Prove calls by kind and result",
    "Front door: proof duration p50 / p99 vs deadline (exact)",
    "Front door: where a proof's time goes (p50)",
    "Front door: held calls",
})


@dataclass
class LiveStack:
    supervisor: RunningSupervisor
    metrics_url: str
    prometheus: Prometheus
    example_document: Path

    def scrape(self) -> Exposition:
        return scrape(self.metrics_url)


def _bad_documents(tmp: Path, example: Path) -> dict[str, Path]:
    """Non-JSON, and valid JSON that is not a status document (a whole section of cuzk's is
    not an object: an odd field alone would only cost its own series)."""
    wrong = json.loads(example.read_text())
    wrong["memory"] = "lots"
    paths = {"garbage": tmp / "garbage.json", "badschema": tmp / "badschema.json"}
    paths["garbage"].write_bytes(b"<html><body>502 Bad Gateway</body></html>")
    paths["badschema"].write_text(json.dumps(wrong))
    return paths


def _victim(tmp: Path) -> dict[str, Any]:
    """The fake engine run by the active release's binary (a copy of this interpreter)."""
    victim = scripted_engine(tmp, "victim", args=["--fail-starts", "1", "--pidfile",
                                              str(tmp / "victim.pids")],
                         backoff_initial=f"{VICTIM_BACKOFF}s", backoff_reset_after="1h")
    victim["command"][0] = BINARY_PLACEHOLDER  # was sys.executable
    return victim


@contextmanager
def live_stack(tmp: Path, example: Path) -> Iterator[LiveStack]:
    """Start the stack under ``tmp``; everything started is stopped on exit, failure or not."""
    bad = _bad_documents(tmp, example)
    cuzk_table, cuzk_grpc = cuzk_engine(tmp, CUZK, env={"CUZK_STANDIN_POST_SECS": "2"},
                                        health_interval="1s", grpc_telemetry_interval="1s")
    engines = [
        *({"name": name} for name in BUNDLED),
        file_status_engine(tmp, "example", example),
        *(file_status_engine(tmp, name, bad[name], start_timeout="1h") for name in BAD_DOCUMENTS),
        cuzk_table,
        _victim(tmp),
    ]
    # The release store is seeded with this Python interpreter: the victim runs it as {binary}.
    supervisor = {"initial_binary": str(Path(sys.executable).resolve())}
    with ExitStack() as cleanup:
        sup = start_supervisor(write_config(tmp, engines, supervisor=supervisor),
                               extra_args=["--demo"])
        cleanup.callback(sup.stop)
        address = sup.about()["metrics_listen"]
        prometheus = Prometheus.start(tmp / "prometheus", [address], rule_files=RULE_FILES)
        cleanup.callback(prometheus.stop)
        for name in (*BUNDLED, "example", CUZK):
            sup.wait_engine(name, lambda e: e["state"] == "running", timeout=60,
                            what=f"{name} running")
        post = LoadThread(cuzk_grpc, ["window-post", "winning-post"],
                          lambda load: load.light(gap=1.5))
        cleanup.callback(post.stop)
        sup.wait_engine("victim", lambda e: e["state"] == "running" and e["restarts"] == 1,
                        timeout=30, what="victim running after its failed first start")
        yield LiveStack(sup, f"http://{address}/metrics", prometheus, example)
