"""A real ``cuzkd run`` against engines serving production-size status documents, and against
engines whose status fails in every way: large documents keep their engine healthy and
exported; every failure is named in ``cuzkd status``, ``--json``, ``/status`` and the log."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families
from support.ports import free_port
from support.supervisor_harness import (
    RunningSupervisor,
    _UnixHTTPConnection,
    scripted_engine,
    start_supervisor,
    write_config,
)
from support.waiting import wait_until

#: Production's poll period (so a fetch may take up to 1 s on a loaded CI machine), a short
#: unhealthy_after so a regression (every fetch failing) restarts the engine within the test.
POLLS = {"health_interval": "1s", "unhealthy_after": "3s", "start_timeout": "10s"}


def get(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=30) as resp:
        body: bytes = resp.read()
        return body


def samples(sup: RunningSupervisor) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = get(f"http://{sup.about()['metrics_listen']}/metrics").decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def value(found: dict[tuple[str, tuple[tuple[str, str], ...]], float], name: str,
          **labels: str) -> float | None:
    return found.get((name, tuple(sorted(labels.items()))))


def stays_healthy(sup: RunningSupervisor, names: list[str], secs: float) -> None:
    """Each engine's process has been running ``secs`` (several unhealthy_after periods of
    1 MB health polls) without a restart, and no status fetch failed meanwhile (polls before
    the engine listened may have)."""
    before = samples(sup)

    def long_enough() -> bool:
        engines = sup.engines()
        return all(engines[n]["started_at"] and time.time() - engines[n]["started_at"] > secs
                   for n in names)

    wait_until(long_enough, secs + 30, f"{names} to run {secs}s", interval=0.2)
    found = samples(sup)
    for name in names:
        eng = sup.engine(name)
        assert (eng["state"], eng["restarts"], eng["last_error"]) == ("running", 0, None), eng
        assert value(found, "cuzkd_status_fetch_errors_total", engine=name) == \
            value(before, "cuzkd_status_fetch_errors_total", engine=name)


def test_one_megabyte_documents_in_small_chunks_over_unix_and_tcp(tmp_path: Path) -> None:
    port = free_port()
    big_tcp = scripted_engine(tmp_path, "big-tcp", "big", **POLLS)
    big_tcp["command"] = [a for a in big_tcp["command"] if a != "--socket"
                          and not a.endswith("big-tcp.sock")] + ["--port", str(port)]
    big_tcp["status_url"] = f"http://127.0.0.1:{port}/status"
    config = write_config(tmp_path,
                          [scripted_engine(tmp_path, "big-unix", "big", **POLLS), big_tcp])
    sup = start_supervisor(config)
    try:
        for name in ("big-unix", "big-tcp"):
            sup.wait_engine(name, lambda e: e["state"] == "running", timeout=30)
        stays_healthy(sup, ["big-unix", "big-tcp"], 3.0)
        found = samples(sup)  # a scrape: every 1 MB document decoded and exported
        for name in ("big-unix", "big-tcp"):
            assert value(found, "cuzkd_engine_up", engine=name) == 1
            assert value(found, "cuzk_partitions", engine=name, proof_kind="snap-update",
                         phase="pending") == 480 * 16
        doc = json.loads(get(f"http://{sup.about()['metrics_listen']}/status"))
        assert {len(e["status"]["pipelines"]) for e in doc["engines"]} == {480}
    finally:
        assert sup.stop() == 0


def test_a_document_slower_than_the_poll_period_still_answers(tmp_path: Path) -> None:
    """A 1 MB document that takes 1.5 s to arrive, polled every 1 s: the fetch may run past
    the poll period (``status_timeout``, 5 s by default), so the engine is ``running`` and
    stays healthy instead of looping on start_timeout with every fetch timed out."""
    slow = scripted_engine(tmp_path, "slow", "big", args=["--send-secs", "1.5"],
                       **{**POLLS, "unhealthy_after": "4s"})
    sup = start_supervisor(write_config(tmp_path, [slow]))
    try:
        sup.wait_engine("slow", lambda e: e["state"] == "running", timeout=30)
        stays_healthy(sup, ["slow"], 6.0)
    finally:
        assert sup.stop() == 0


def submit_jobs(socket_path: Path, count: int) -> None:
    """POST ``count`` window-post jobs to the bundled engine over one keep-alive connection."""
    conn = _UnixHTTPConnection(str(socket_path), timeout=30)
    try:
        for _ in range(count):
            conn.request("POST", "/v1/jobs", body=b'{"proof_kind": "window-post"}',
                         headers={"Content-Type": "application/json"})
            resp = conn.getresponse()
            assert resp.status == 202, resp.read()
            resp.read()
    finally:
        conn.close()


def test_bundled_engine_with_thousands_of_queued_jobs_stays_healthy(tmp_path: Path) -> None:
    # no drain at the end: 2,000 queued jobs would take minutes
    config = write_config(tmp_path, [{"name": "cpu0", **POLLS, "start_timeout": "60s",
                                      "drain": "none", "stop_timeout": "2s"}])
    sup = start_supervisor(config)
    try:
        eng = sup.wait_engine("cpu0", lambda e: e["state"] == "running", timeout=60)
        socket_path = Path(eng["status_address"].removeprefix("unix:"))
        submit_jobs(socket_path, 2000)
        conn = _UnixHTTPConnection(str(socket_path), timeout=30)
        conn.request("GET", "/status")
        document = conn.getresponse().read()
        conn.close()
        assert len(document) > 300_000
        stays_healthy(sup, ["cpu0"], time.time() - eng["started_at"] + 3.0)
        found = samples(sup)
        assert value(found, "cuzkd_engine_up", engine="cpu0") == 1
        in_flight = value(found, "cuzk_jobs_in_flight", engine="cpu0")
        assert in_flight is not None and in_flight > 1000
    finally:
        assert sup.stop() == 0


#: engine -> (mode, extra fake-engine args, what its last_error must contain)
FAILING: dict[str, tuple[str, list[str], str]] = {
    "hangs": ("hang", [], "no answer from unix:"),
    "garbage": ("garbage", [], "invalid status document: JSON is malformed"),
    "http500": ("http500", [], "HTTP 500 Internal Server Error: 'worker pool gone'"),
    "shape": ("wrong-shape", [], "Object missing required field `memory`"),
    "silent": ("silent", [], ": No such file or directory"),
    "late-hang": ("serve", ["--hang-after", "3"], "no answer from unix:"),
}


def test_every_status_failure_says_why(tmp_path: Path) -> None:
    keys = {"health_interval": "100ms", "unhealthy_after": "500ms", "start_timeout": "1500ms",
            "restart": "never", "stop_timeout": "1s"}
    engines = [scripted_engine(tmp_path, name, mode, args=args, **keys)
               for name, (mode, args, _) in FAILING.items()]
    config = write_config(tmp_path, engines)
    sup = start_supervisor(config)
    try:
        def all_failed() -> dict[str, dict[str, Any]] | None:
            listed = sup.engines()
            return listed if all(e["state"] == "failed" for e in listed.values()) else None

        listed = wait_until(all_failed, 30, "every engine to fail")
        for name, (_, _, expected) in FAILING.items():
            assert expected in (listed[name]["last_error"] or ""), listed[name]
        assert "(body starts 'this is not json')" in listed["garbage"]["last_error"]
        assert listed["late-hang"]["last_exit_cause"] == "unhealthy"
        assert {e["last_exit_cause"] for n, e in listed.items() if n != "late-hang"} == {
            "start_timeout"}

        cli = [sys.executable, "-m", "cuzkd", "status", "--config", str(config)]
        text = subprocess.run(cli, capture_output=True, text=True, check=True).stdout
        as_json = json.loads(subprocess.run([*cli, "--json"], capture_output=True, text=True,
                                            check=True).stdout)
        one = subprocess.run([*cli, "http500"], capture_output=True, text=True).stdout
        assert f"last error: {listed['http500']['last_error']}" in one
        web = json.loads(get(f"http://{sup.about()['metrics_listen']}/status"))
        for name, eng in listed.items():
            assert f"error: {eng['last_error']}" in text
            assert {e["name"]: e["last_error"] for e in as_json["engines"]}[name] == \
                eng["last_error"]
            assert {e["name"]: e["last_error"] for e in web["engines"]}[name] == \
                eng["last_error"]

        failures = sup.events("engine_status_failed")
        for name in FAILING:
            logged = [e for e in failures if e["engine"] == name]
            # rate-limited: ~15 failed polls while starting, one line (at most one more
            # for the late one's running phase); nothing answering while starting is the
            # start, not logged: only the poll that finds start_timeout over is
            assert 1 <= len(logged) <= 2, logged
            assert all(e["repeated"] >= 1 and e["error"] for e in logged)
        assert {e["state"] for e in failures if e["engine"] != "late-hang"} == {"starting"}
        for name in ("hangs", "silent"):
            assert [e["repeated"] for e in failures if e["engine"] == name] == [1]
        # (a poll before it listened was its start: not logged)
        assert {e["state"] for e in failures if e["engine"] == "late-hang"} == {"running"}
        kills = [e["reason"] for e in sup.events("engine_state_changed", new="stopping")]
        assert len(kills) == len(FAILING) and all("(last error: " in r for r in kills), kills
        log = sup.log_text()
        assert "TimeoutError: " not in log and "error: None" not in log
        assert '"error": null' not in log and '"error": ""' not in log
    finally:
        sup.stop()
