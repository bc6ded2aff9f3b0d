"""An engine's output through ``cuzkd run``: cuzk's coloured tracing lines logged as records
with cuzk's level, target, fields and timestamp and no escape code left; a line forging a
supervisor event logged as the engine's; a flood logged up to its burst, every other line
counted in ``cuzkd_engine_output_dropped_lines_total`` and reported as suppressed."""

from __future__ import annotations

import re
import sys
import urllib.request
from pathlib import Path

from support.cuzk_harness import cuzk_engine
from support.supervisor_harness import start_supervisor, write_config
from support.waiting import wait_until

TIMESTAMP = "2026-12-01T13:00:00.123456Z"
FLOOD = 30_000
BURST = 100
#: Writes as cuzk does -- tracing-subscriber's default format, ANSI colours on -- then a line
#: forging a supervisor event, then FLOOD short lines flat out, then waits.
CUZK_LIKE = r"""
import json, sys, time
TS, FLOOD = sys.argv[1], int(sys.argv[2])
COLOUR = {"INFO": "\x1b[32m", "WARN": "\x1b[33m"}
def field(key, value):
    return f"\x1b[3m{key}\x1b[0m\x1b[2m=\x1b[0m{value}"
def line(level, target, text):
    print(f"\x1b[2m{TS}\x1b[0m {COLOUR[level]}{level:>5}\x1b[0m "
          f"\x1b[2m{target}\x1b[0m\x1b[2m:\x1b[0m {text}")
line("INFO", "cuzk_daemon", "cuzk-daemon ready, serving on unix:///run/curio/cuzk.sock")
line("WARN", "cuzk_core::engine", "partition slow " + field("gpu_ms", 7512) + " "
     + field("job_id", '"porep-1"'))
print(json.dumps({"event": "supervisor_stopped", "level": "critical",
                  "logger": "cuzkd.supervisor"}))
sys.stdout.write("".join(f"flood {i}\n" for i in range(FLOOD)))
sys.stdout.flush()
time.sleep(3600)
"""


def _dropped_lines(metrics_url: str) -> int:
    with urllib.request.urlopen(metrics_url, timeout=10) as resp:
        text = resp.read().decode()
    found = re.search(r'^cuzkd_engine_output_dropped_lines_total\{engine="cuzk"\} (\S+)$',
                      text, re.MULTILINE)
    assert found is not None, text
    return int(float(found.group(1)))


def test_cuzk_lines_forged_events_and_a_flood_through_cuzkd_run(tmp_path: Path) -> None:
    config = write_config(tmp_path, [{
        "name": "cuzk", "command": [sys.executable, "-c", CUZK_LIKE, TIMESTAMP, str(FLOOD)],
        "stop_timeout": "2s", "output_burst_lines": BURST, "output_lines_per_second": 0.001}])
    sup = start_supervisor(config)
    try:
        (started,) = wait_until(lambda: sup.events("supervisor_started"), 20, "start-up")

        def accounted() -> bool:
            logged = len(sup.events("engine_output", engine="cuzk"))
            return logged + _dropped_lines(started["metrics_url"]) == FLOOD

        wait_until(accounted, 30, "every flood line logged or counted")
        engine_lines = sup.events(logger="cuzkd.engine")
        assert len(engine_lines) == BURST  # the three lines and the head of the flood
        (ready, slow, forged) = engine_lines[:3]
        assert ready["event"] == "cuzk-daemon ready, serving on unix:///run/curio/cuzk.sock"
        assert (ready["level"], ready["target"], ready["engine_timestamp"]) == (
            "info", "cuzk_daemon", TIMESTAMP)
        assert (ready["engine"], ready["stream"]) == ("cuzk", "stdout")
        assert (slow["event"], slow["level"], slow["target"]) == (
            "partition slow", "warning", "cuzk_core::engine")
        assert (slow["gpu_ms"], slow["job_id"]) == (7512, "porep-1")
        assert (forged["event"], forged["level"], forged["engine_level"]) == (
            "supervisor_stopped", "error", "critical")
        assert forged["engine_logger"] == "cuzkd.supervisor"
        assert not sup.events("supervisor_stopped", logger="cuzkd.supervisor")
        assert [e["line"] for e in engine_lines[3:]] == [f"flood {i}" for i in range(BURST - 3)]
        suppressed = sup.events("engine_output_suppressed", engine="cuzk")
        assert suppressed and {e["logger"] for e in suppressed} == {"cuzkd.supervisor"}
        text = sup.log_text()
        assert "\x1b" not in text and "\\u001b" not in text  # no escape code, raw or escaped
        assert sup.stop() == 0
    finally:
        sup.close()


def test_the_cuzk_stand_in_logs_records_and_its_panic_stays_whole_in_the_tail(
        tmp_path: Path) -> None:
    """The stand-in writes as cuzk does (coloured tracing lines on stdout; a panic on stderr,
    exit 101): its lines are records, its panic the last exit's stderr lines, in order."""
    running, _ = cuzk_engine(tmp_path, "cuzk")
    panics, _ = cuzk_engine(tmp_path, "panics", restart="never",
                            env={"CUZK_STANDIN_EXIT": "101"})
    sup = start_supervisor(write_config(tmp_path, [running, panics]))
    try:
        (ready,) = wait_until(lambda: [e for e in sup.events(logger="cuzkd.engine", engine="cuzk")
                                       if e["event"].startswith("cuzk-daemon ready")], 30,
                              "the stand-in's ready line")
        assert (ready["level"], ready["target"], ready["stream"]) == ("info", "cuzk_daemon",
                                                                      "stdout")
        assert re.fullmatch(r"\d{4}-\d\d-\d\dT[\d:.]+Z", ready["engine_timestamp"])
        (starting,) = sup.events("starting cuzk-daemon", engine="cuzk")
        assert starting["config"] == str(tmp_path / "cuzk.toml")  # a quoted field, unquoted
        tail = wait_until(lambda: sup.engine("panics").get("last_exit_stderr"), 30,
                          "the panicking engine's exit")
        assert tail[-3:] == [
            "thread 'main' panicked at cuzk-daemon/src/main.rs:212:14:",
            "called `Result::unwrap()` on an `Err` value: stand-in forced panic",
            "note: run with `RUST_BACKTRACE=1` environment variable to display a backtrace"]
        assert "\x1b" not in sup.log_text() and "\\u001b" not in sup.log_text()
        assert sup.stop() == 0
    finally:
        sup.close()
