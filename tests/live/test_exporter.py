"""Issue 5 on a live stack: the exporter as Prometheus sees it while real engines prove jobs.

Everything here reads the session stack of tests/live/conftest.py (real ``cuzkd run --demo``,
bundled engines doing NTTs, document engines, a real Prometheus scraping every second).
Conditions on Prometheus are polled against a deadline; nothing sleeps to synchronise.
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from support.live import Exposition, LabelSet, by_label, promtool_check_metrics
from support.live_stack import BAD_DOCUMENTS, BUNDLED, CUZK, VICTIM_BACKOFF, LiveStack
from support.waiting import wait_until

from cuzkd.status.document import PartitionState

BUNDLED_RE = "|".join(BUNDLED)


def _busy_bundled_engines(s: Exposition) -> set[str]:
    return {dict(labels)["engine"] for (name, labels), v in s.samples.items()
            if name == "cuzk_gpu_worker_busy" and v == 1 and dict(labels)["engine"] in BUNDLED}


def _scrape_until(live: LiveStack, predicate: Callable[[Exposition], Any], timeout: float,
                  what: str) -> Exposition:
    """Scrape /metrics until a scrape satisfies ``predicate``; that scrape."""
    def check() -> Exposition | None:
        s = live.scrape()
        return s if predicate(s) else None

    return wait_until(check, timeout, what, interval=0.1)  # type: ignore[no-any-return]


def test_live_scrape_under_load_passes_promtool(live: LiveStack) -> None:
    """``promtool check metrics`` is silent on a scrape taken while bundled workers prove."""
    s = _scrape_until(live, _busy_bundled_engines, 30, "a scrape with a busy bundled worker")
    assert promtool_check_metrics(s.text) == ""


def _each_bundled(predicate: Callable[[float], bool]) -> Callable[[dict[LabelSet, float]], bool]:
    """A wait_for predicate: both bundled engines are in the answer and pass ``predicate``."""
    return lambda values: (set(by_label(values, "engine")) == set(BUNDLED)
                           and all(predicate(v) for v in values.values()))


@pytest.mark.parametrize(("expr", "predicate"), [
    # a worker of each engine was seen busy
    (f'max by (engine) (max_over_time(cuzk_gpu_worker_busy{{engine=~"{BUNDLED_RE}"}}[1m]))',
     lambda v: v == 1),
    # busy time accumulates: utilisation is measurable with rate()
    (f"max by (engine) (rate(cuzk_gpu_worker_busy_seconds_total"
     f'{{engine=~"{BUNDLED_RE}"}}[5s]))', lambda v: v > 0),
    # partitions finish
    (f"sum by (engine) (increase(cuzk_partition_phase_transitions_total"
     f'{{engine=~"{BUNDLED_RE}",phase="done"}}[1m]))', lambda v: v > 0),
    # the memory budget is in use
    (f"max by (engine) (max_over_time(cuzk_memory_budget_used_bytes"
     f'{{engine=~"{BUNDLED_RE}"}}[1m]))', lambda v: v > 0),
], ids=["worker_busy", "busy_seconds_rate", "done_transitions", "budget_used"])
def test_prometheus_sees_the_engines_work(live: LiveStack, expr: str, predicate: Any) -> None:
    live.prometheus.wait_for(expr, _each_bundled(predicate), 45, "bundled engines at work")


def _runs(values: list[float]) -> list[float]:
    """Collapse repeats: [1, 1, 0, 0, 1] → [1, 0, 1]."""
    return [v for i, v in enumerate(values) if i == 0 or values[i - 1] != v]


def test_engine_up_goes_to_zero_and_back_on_sigkill(live: LiveStack) -> None:
    """SIGKILL an engine: Prometheus sees ``cuzkd_engine_up`` 1 → 0 → 1 and the exit counted.

    The victim already failed once (its first start), so this is its second failure: the
    supervisor waits ``backoff_initial`` (≥ 3.2 s with jitter) before restarting, and the down
    window spans several 1 s scrapes. Without the backoff an immediate restart of a fake engine
    could fall between two scrapes.
    """
    prom, sup = live.prometheus, live.supervisor
    up = 'cuzkd_engine_up{engine="victim"}'
    prom.wait_for(up, lambda v: list(v.values()) == [1.0], 20, "victim up in Prometheus")
    before = sup.engine("victim")
    killed_at = time.time()
    os.kill(before["pid"], signal.SIGKILL)

    backoff = sup.wait_engine("victim", lambda e: e["state"] == "backoff", 10, "victim backoff")
    assert backoff["next_restart_at"] - killed_at >= 0.8 * VICTIM_BACKOFF - 0.5
    after = sup.wait_engine("victim", lambda e: e["state"] == "running", 30, "victim restarted")
    assert after["pid"] != before["pid"]
    assert after["exits"]["signal_SIGKILL"] == before["exits"].get("signal_SIGKILL", 0) + 1

    # The raw scraped samples of the victim's up series since just before the kill.
    def seen_down_and_up() -> list[float] | None:
        window = f"{int(time.time() - killed_at) + 3}s"
        values = [v for t, v in prom.samples(up, window) if t >= killed_at - 2]
        return values if _runs(values)[-3:] == [1.0, 0.0, 1.0] else None

    values = wait_until(seen_down_and_up, 30, "cuzkd_engine_up 1 → 0 → 1", interval=0.25)
    assert values.count(0.0) >= 2, values  # ≥ 3.2 s down: 3 scrapes, one may fail
    prom.wait_for('cuzkd_engine_exits_total{engine="victim",cause="signal_SIGKILL"}',
                  lambda v: list(v.values()) == [after["exits"]["signal_SIGKILL"]], 10,
                  "the SIGKILL exit counted")
    prom.wait_for('cuzkd_engine_restarts_total{engine="victim"}',
                  lambda v: list(v.values()) == [before["restarts"] + 1], 10,
                  "the restart counted")
    prom.wait_for('max_over_time(cuzkd_engine_state{engine="victim",state="backoff"}[1m])',
                  lambda v: list(v.values()) == [1.0], 10, "the backoff state seen")


# --- cuzk's reference document through a real supervisor ---------------------------------------


def expected_example_series(doc: dict[str, Any], engine: str) -> dict[tuple[str, LabelSet], float]:
    """What /metrics must say for an engine serving ``doc``, worked out from the raw JSON.

    Written against cuzk's field list (tests/fixtures/cuzk-status.md), not against cuzkd's
    decoder, so a misread field shows up as a mismatch.
    """
    out: dict[tuple[str, LabelSet], float] = {}

    def put(name: str, value: float, **labels: str) -> None:
        out[(name, frozenset({"engine": engine, **labels}.items()))] = value

    for w in doc["gpu_workers"]:
        ids = {"worker": str(w["worker_id"]), "gpu": str(w["gpu_ordinal"])}
        put("cuzk_gpu_worker_busy", float(w["state"] == "proving"), **ids)
        put("cuzk_gpu_worker_current_busy_seconds", w["busy_secs"] or 0.0, **ids)
    counters = doc["counters"]
    kinds = ({p["proof_kind"] for p in doc["pipelines"]} | set(counters["completed_by_kind"])
             | set(counters["failed_by_kind"]))
    phases = Counter((p["proof_kind"], part["state"]) for p in doc["pipelines"]
                     for part in p["partitions"])
    for kind in kinds:
        for phase in PartitionState:
            put("cuzk_partitions", phases[kind, phase], proof_kind=kind, phase=phase)
        put("cuzk_jobs_completed_total", counters["completed_by_kind"].get(kind, 0),
            proof_kind=kind)
        put("cuzk_jobs_failed_total", counters["failed_by_kind"].get(kind, 0), proof_kind=kind)
    put("cuzk_queue_depth", counters["queue_depth"])
    for field in ("total", "used", "available"):
        put(f"cuzk_memory_budget_{field}_bytes", doc["memory"][f"{field}_bytes"])
    put("cuzk_synthesis_active", doc["synthesis"]["active"])
    put("cuzk_synthesis_max_concurrent", doc["synthesis"]["max_concurrent"])
    allocations: Counter[tuple[str, str]] = Counter()
    for kind in ("srs", "pce"):
        for a in doc["allocations"][kind]:
            allocations[kind, a["circuit_id"]] += a["bytes"]
    for (kind, circuit), size in allocations.items():
        put("cuzk_allocation_bytes", size, kind=kind, circuit=circuit)
    for buffer in ("synth", "provers"):
        put("cuzk_buffers_in_flight", doc["buffers"][f"{buffer}_in_flight"], buffer=buffer)
    for buffer in ("aux", "shells"):  # a real cuzk never decrements these: buffers ever started
        put("cuzk_buffers_started_total", doc["buffers"][f"{buffer}_in_flight"], buffer=buffer)
    put("cuzk_pending_handles", doc["buffers"]["pending_handles"])
    put("cuzk_engine_uptime_seconds", doc["uptime_secs"])
    put("cuzkd_engine_up", 1)
    return out


def test_example_document_is_exported_exactly(live: LiveStack) -> None:
    """The ``example`` engine serves cuzk-status.example.json; /metrics carries its values."""
    doc = json.loads(live.example_document.read_text())
    expected = expected_example_series(doc, "example")
    s = live.scrape()
    wrong = {f"{name}{dict(labels)}": (want, s.samples.get((name, labels)))
             for (name, labels), want in expected.items()
             if s.samples.get((name, labels)) != pytest.approx(want)}
    assert not wrong, f"(expected, exported): {wrong}"
    # nothing else under those families for this engine (e.g. a phantom worker or kind)
    for name in {name for name, _ in expected}:
        exported = {labels for (n, labels) in s.samples if n == name
                    and dict(labels).get("engine") == "example"}
        assert exported == {labels for (n, labels) in expected if n == name}, name


def _fetch_errors(s: Exposition) -> dict[str, float]:
    return {name: s.value("cuzkd_status_fetch_errors_total", engine=name) or 0.0
            for name in BAD_DOCUMENTS}


def test_bad_documents_mark_only_their_engine_down(live: LiveStack) -> None:
    """Non-JSON and wrong-schema engines: down, fetch errors rising, the rest of /metrics intact."""
    sup = live.supervisor
    for name in BAD_DOCUMENTS:  # the engine listens: errors from now on are about its answers
        sock = Path(sup.engine(name)["status_address"].removeprefix("unix:"))
        wait_until(sock.exists, 20, f"{name} listening")
    first = _fetch_errors(live.scrape())
    s = _scrape_until(live, lambda s: all(_fetch_errors(s)[n] > first[n] for n in BAD_DOCUMENTS),
                      20, "fetch errors rising for both bad engines")

    for name in BAD_DOCUMENTS:
        assert s.value("cuzkd_engine_up", engine=name) == 0, name
        assert s.value("cuzkd_engine_state", engine=name, state="starting") == 1, name
    with_engine_series = s.engines_with("cuzk_")
    assert not with_engine_series & set(BAD_DOCUMENTS), "no cuzk_* series for a bad document"
    assert {*BUNDLED, "example"} <= with_engine_series
    assert s.engines_with("cuzkd_engine_state") == {*BUNDLED, "example", *BAD_DOCUMENTS,
                                                    CUZK, "victim"}
    assert promtool_check_metrics(s.text) == ""
    live.prometheus.wait_for(
        'increase(cuzkd_status_fetch_errors_total{engine=~"garbage|badschema"}[10s])',
        lambda v: len(v) == 2 and all(x > 0 for x in v.values()), 20,
        "Prometheus sees the fetch errors rise")
