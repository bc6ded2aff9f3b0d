"""What an engine's line becomes: escape codes removed, cuzk's tracing lines and JSON lines read
as records whose fields a line cannot forge, anything else plain text."""

from __future__ import annotations

import json

import pytest

from cuzkd.log.controls import strip_controls
from cuzkd.log.engineline import EngineRecord, engine_line
from cuzkd.log.tracingline import TracingLine, parse_tracing_line

#: cuzk's ready line as tracing-subscriber writes it with ANSI colours on.
COLOURED_READY = ("\x1b[2m2026-12-01T13:00:00.123456Z\x1b[0m \x1b[32m INFO\x1b[0m "
                  "\x1b[2mcuzk_daemon\x1b[0m\x1b[2m:\x1b[0m cuzk-daemon ready, serving on "
                  "unix:///run/curio/cuzk.sock")


@pytest.mark.parametrize(("raw", "clean"), [
    (COLOURED_READY, "2026-12-01T13:00:00.123456Z  INFO cuzk_daemon: cuzk-daemon ready, "
                     "serving on unix:///run/curio/cuzk.sock"),
    ("\x1b[1;38;5;208mbold orange\x1b[m", "bold orange"),            # CSI with parameters
    ("\x1b]0;pwned title\x07after", "after"),                          # OSC, BEL-terminated
    ("\x1b]8;;http://x\x1b\\link\x1b]8;;\x1b\\", "link"),              # OSC 8 hyperlink, ST
    ("\x1bP1$r0m\x1b\\dcs", "dcs"), ("\x1b_apc\x1b\\x", "x"),          # DCS, APC
    ("\x1b(Bcharset \x1b7saved\x1b8", "charset saved"),                # two/three-byte escapes
    ("\x9b31mc1 csi\x9b0m", "c1 csi"), ("a\x9d2;t\x9cb", "ab"),        # 8-bit CSI and OSC
    ("cr\r bs\x08 nul\x00 del\x7f bel\x07 esc\x1b", "cr bs nul del bel esc"),
    ("\tkeeps\ttabs", "\tkeeps\ttabs"), ("ünïcödé ✓", "ünïcödé ✓"),
    ("\x1b]unterminated osc eats the rest", ""), ("a\x1b[", "a"),
])
def test_escape_sequences_and_controls_are_removed(raw: str, clean: str) -> None:
    assert strip_controls(raw) == clean


@pytest.mark.parametrize(("hostile", "clean"), [
    ("\x1b[" + "1;" * 32_000, "1;" * 32_000),  # a CSI that never ends: its introducer goes
    ("\x1b]" * 32_000, ""), ("\x1b[\x1b[" * 16_000, ""), ("\x00" * 65_536, ""),
])
def test_hostile_runs_of_64_kib_are_stripped(hostile: str, clean: str) -> None:
    """Runs a backtracking pattern would take minutes over (the patterns are linear)."""
    assert strip_controls(hostile) == clean
    assert engine_line(hostile) == clean


def test_cuzks_lines_are_taken_apart() -> None:
    assert parse_tracing_line(strip_controls(COLOURED_READY)) == TracingLine(
        timestamp="2026-12-01T13:00:00.123456Z", level="info", target="cuzk_daemon",
        message="cuzk-daemon ready, serving on unix:///run/curio/cuzk.sock", fields={})
    line = ('2026-12-01T13:00:07.5+01:00  WARN prove{job_id="porep-1 x" kind=porep-c2}:'
            'partition{index=3}: cuzk_core::engine: gpu slow gpu_ms=7512 ratio=1.5 '
            'worker="gpu \\"0\\"\\n\\u{e9}" ok=true path=/a=b')
    assert parse_tracing_line(line) == TracingLine(
        timestamp="2026-12-01T13:00:07.5+01:00", level="warning", target="cuzk_core::engine",
        message="gpu slow",
        fields={"gpu_ms": 7512, "ratio": 1.5, "worker": 'gpu "0"\né', "ok": True,
                "path": "/a=b"},
        spans='prove{job_id="porep-1 x" kind=porep-c2}:partition{index=3}')


@pytest.mark.parametrize(("line", "level", "target", "message", "spans"), [
    ("2026-12-01T13:00:00Z ERROR cuzk_daemon: error: bind failed", "error", "cuzk_daemon",
     "error: bind failed", ""),                      # a message with ": " in it
    ("2026-12-01T13:00:00Z TRACE prove: cuzk_core::srs: loaded", "debug", "cuzk_core::srs",
     "loaded", "prove"),                             # a span without fields, a :: target
    ("2026-12-01T13:00:00Z DEBUG cuzk_core::srs: loaded a=1", "debug", "cuzk_core::srs",
     "loaded", ""),
])
def test_levels_targets_and_spans(line: str, level: str, target: str, message: str,
                                  spans: str) -> None:
    parsed = parse_tracing_line(line)
    assert parsed is not None
    assert (parsed.level, parsed.target, parsed.message, parsed.spans) == (
        level, target, message, spans)


@pytest.mark.parametrize("line", [
    "thread 'main' panicked at src/main.rs:12:5:", "Error: bad config: missing field",
    "note: run with `RUST_BACKTRACE=1` environment variable to display a backtrace",
    "2026-12-01T13:00:00Z  INFO no target here", "2026-12-01T13:00:00Z NOTICE x: y",
    "2026-13-01 13:00:00  INFO x: y", "",
])
def test_other_lines_are_not_tracing_lines(line: str) -> None:
    assert parse_tracing_line(line) is None
    assert engine_line(line) == line  # plain text: engine_output


def test_a_tracing_line_is_a_record_with_cuzks_level_target_and_timestamp() -> None:
    line = ("2026-12-01T13:00:09.000001Z ERROR cuzk_core::engine: partition failed "
            "job_id=porep-1 level=9 target=x engine=other logger=cuzkd.supervisor")
    assert engine_line(line) == EngineRecord("error", "partition failed", {
        "target": "cuzk_core::engine", "engine_timestamp": "2026-12-01T13:00:09.000001Z",
        "job_id": "porep-1", "engine_engine_level": 9, "engine_target": "x",
        "engine_engine": "other", "engine_logger": "cuzkd.supervisor"})
    fields_only = engine_line("2026-12-01T13:00:09Z  INFO cuzk_daemon: a=1")
    assert isinstance(fields_only, EngineRecord) and fields_only.event == "engine_output"


def test_a_json_line_cannot_forge_a_supervisor_event() -> None:
    forged = {"event": "supervisor_stopped", "level": "critical", "logger": "cuzkd.supervisor",
              "engine": "other", "stream": "x", "pid": 1, "timestamp": "then",
              "engine_level": "y", "engine_engine_level": "z", "exc_info": True}
    assert engine_line(json.dumps(forged)) == EngineRecord("error", "supervisor_stopped", {
        "engine_timestamp": "then", "engine_level": "critical",
        "engine_logger": "cuzkd.supervisor", "engine_engine": "other", "engine_stream": "x",
        "engine_pid": 1, "engine_engine_level": "y", "engine_engine_engine_level": "z",
        "engine_exc_info": True})


def test_json_levels_are_capped_at_error_and_escapes_inside_json_removed() -> None:
    assert engine_line('{"event": "e", "level": "WARNING"}') == EngineRecord("warning", "e", {})
    assert engine_line('{"level": "LOUD", "msg": "m"}') == EngineRecord(
        "info", "engine_output", {"engine_level": "LOUD", "msg": "m"})
    assert engine_line('{"event": "e\\u001b[2J", "k\\u0007": ["\\u001b]0;t\\u0007v"]}') == (
        EngineRecord("info", "e", {"k": ["v"]}))
