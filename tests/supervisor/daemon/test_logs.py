"""Log format switch, the start-up line and engine output re-logging, on real supervisors.

Each run starts ``cuzkd run`` with one engine that prints a JSON log line and a plain line,
writes its stderr to a file or to a real pseudo-terminal, and stops it once both lines were
re-logged.
"""

from __future__ import annotations

import json
import os
import pty
import select
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from support.supervisor_harness import NotifyListener, read_until, start_supervisor, write_config
from support.waiting import wait_until

from cuzkd.config import parse_config
from cuzkd.log.engineline import MAX_FIELD_DEPTH, EngineRecord, engine_line
from cuzkd.supervisor.daemon.startup import startup_fields

#: What the talking engine prints: a structlog-style JSON line (with fields named like the
#: ones the supervisor adds) and a plain one.
ENGINE_JSON = {"event": "job_started", "level": "warning", "job_id": "j-1", "partitions": 16,
               "timestamp": "2026-01-01T00:00:00Z", "engine": "inner", "pid": 1}
PLAIN = "plain words"
#: The lines come from the environment so the logged argv does not contain them.
TALKER = ("import os, sys, time\n"
          "print(os.environ['TALK_JSON'], file=sys.stderr, flush=True)\n"
          "print(os.environ['TALK_PLAIN'], flush=True)\n"
          "time.sleep(3600)\n")


def _config(tmp: Path, **supervisor: Any) -> Path:
    return write_config(tmp, [{"name": "talker", "command": [sys.executable, "-c", TALKER],
                               "env": {"TALK_JSON": json.dumps(ENGINE_JSON),
                                       "TALK_PLAIN": PLAIN},
                               "stop_timeout": "2s"}], supervisor=supervisor)


def _run(config: Path, *args: str, tty: bool = False) -> str:
    """Run the supervisor until the talker's two lines are logged; its whole stderr+stdout."""
    if tty:
        master, out = pty.openpty()
    else:
        out_path = config.with_suffix(".out")
        out = os.open(out_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        proc = subprocess.Popen([sys.executable, "-m", "cuzkd", "run", "--config", str(config),
                                 *args], stdin=subprocess.DEVNULL, stdout=out, stderr=out)
    finally:
        os.close(out)
    text = ""
    deadline = time.monotonic() + 60
    try:
        while not (PLAIN in text and "j-1" in text):
            assert time.monotonic() < deadline, f"talker's lines not logged:\n{text}"
            assert proc.poll() is None, f"supervisor exited {proc.returncode}:\n{text}"
            if tty:
                if select.select([master], [], [], 0.5)[0]:
                    text += os.read(master, 65536).decode(errors="replace")
            else:
                time.sleep(0.05)  # polling a file: there is no event to wait on
                text = out_path.read_text()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if tty:
            while select.select([master], [], [], 0.2)[0]:
                try:
                    chunk = os.read(master, 65536)
                except OSError:  # EIO: the terminal's other side is closed
                    break
                if not chunk:
                    break
                text += chunk.decode(errors="replace")
            os.close(master)
    return text if tty else out_path.read_text()


def _json_events(text: str) -> list[dict[str, Any]]:
    lines = [line for line in text.splitlines() if line.strip()]
    return [json.loads(line) for line in lines]  # every line: one JSON object


def test_engine_line_fields() -> None:
    assert engine_line(json.dumps(ENGINE_JSON)) == EngineRecord("warning", "job_started", {
        "engine_timestamp": "2026-01-01T00:00:00Z", "job_id": "j-1", "partitions": 16,
        "engine_engine": "inner", "engine_pid": 1})
    assert engine_line('{"msg": "no event", "self": 1}') == EngineRecord(
        "info", "engine_output", {"msg": "no event", "engine_self": 1})
    for text in ("plain words", "[1, 2]", '"a string"', "{not json", "", "  42"):
        assert engine_line(text) == text


def _nested(depth: int) -> str:
    """A JSON object whose field nests arrays down to ``depth`` levels (the object is 1)."""
    return '{"a": ' + "[" * (depth - 1) + "]" * (depth - 1) + "}"


@pytest.mark.parametrize("depth", [MAX_FIELD_DEPTH + 1, 990, 1000, 100_000])
def test_a_line_nested_too_deep_is_a_plain_line(depth: int) -> None:
    """Too deep for the parser (1000: RecursionError) or the renderers (990): plain text."""
    assert isinstance(engine_line(_nested(depth)), str)


def test_what_the_renderers_can_write_is_kept_as_fields() -> None:
    assert isinstance(engine_line(_nested(MAX_FIELD_DEPTH)), EngineRecord)
    assert engine_line('{"x": "\\ud800", "y": "\\u0000\\u001b[31m!"}') == EngineRecord(
        "info", "engine_output", {"x": "\ud800", "y": "!"})
    # Instructions to our processors are the engine's data, not ours to act on.
    assert engine_line('{"exc_info": true, "stack_info": 1}') == EngineRecord(
        "info", "engine_output", {"engine_exc_info": True, "engine_stack_info": 1})


@pytest.mark.parametrize("text", [
    '{"x": 1e400}', '{"x": -1e400}', '{"x": NaN}', '{"x": Infinity}', '{"x": -Infinity}',
])
def test_a_number_no_json_log_can_carry_makes_a_plain_line(text: str) -> None:
    """``Infinity`` in the supervisor's JSON line would make it unreadable to every consumer."""
    assert engine_line(text) == text


@pytest.mark.parametrize(("host", "base"), [
    ("127.0.0.1", "http://127.0.0.1:9822"), ("0.0.0.0", "http://127.0.0.1:9822"),
    ("::", "http://[::1]:9822"), ("::1", "http://[::1]:9822"),
    ("10.1.2.3", "http://10.1.2.3:9822"),
])
def test_startup_urls_are_ones_a_person_can_open(host: str, base: str) -> None:
    config = parse_config({"engine": [{"name": "a"}]}, "x.toml")
    fields = startup_fields(config, host, 9822, None)
    assert (fields["metrics_url"], fields["status_url"]) == (f"{base}/metrics", f"{base}/status")


def test_startup_line_names_the_release_only_for_binary_engines() -> None:
    plain = parse_config({"engine": [{"name": "a"}]}, "x.toml")
    assert "release" not in startup_fields(plain, "127.0.0.1", 1, "r1")
    swapped = parse_config({"engine": [{"name": "a"}, {"name": "b", "command": ["{binary}"],
                                                      "status_url": "unix:/s"}]}, "x.toml")
    assert startup_fields(swapped, "127.0.0.1", 1, "r1")["release"] == "r1"
    assert "cuzkd swap" in startup_fields(swapped, "127.0.0.1", 1, None)["release"]
    assert startup_fields(plain, "127.0.0.1", 1, None)["config"].endswith("/x.toml")


def test_json_when_not_a_terminal_with_the_startup_line_and_engine_fields(
        tmp_path: Path) -> None:
    config = _config(tmp_path)
    events = _json_events(_run(config))
    (started,) = [e for e in events if e["event"] == "supervisor_started"]
    assert started["config"] == str(config)
    assert started["engines"] == "talker"
    assert started["logger"] == "cuzkd.supervisor"  # every line says which part wrote it
    assert started["control_socket"] == str(tmp_path / "state" / "control.sock")
    port = started["metrics_url"].removeprefix("http://127.0.0.1:").removesuffix("/metrics")
    assert port.isdigit() and started["status_url"] == f"http://127.0.0.1:{port}/status"
    # No engine runs {binary}: nothing about releases.
    assert "release" not in started
    assert not [e for e in events if "release" in e["event"]]
    # The engine's JSON line: its own event, level and fields, tagged with the engine's name.
    (relogged,) = [e for e in events if e["event"] == "job_started"]
    assert relogged["level"] == "warning" and relogged["engine"] == "talker"
    assert relogged["job_id"] == "j-1" and relogged["partitions"] == 16
    assert relogged["engine_engine"] == "inner" and relogged["stream"] == "stderr"
    assert relogged["timestamp"] != ENGINE_JSON["timestamp"]  # the supervisor's clock
    assert relogged["engine_timestamp"] == ENGINE_JSON["timestamp"]  # the engine's, kept
    assert relogged["logger"] == "cuzkd.engine" and "engine_logger" not in relogged
    (plain,) = [e for e in events if e["event"] == "engine_output"]
    assert plain["line"] == PLAIN and plain["stream"] == "stdout"


def _assert_console(text: str) -> None:
    lines = text.splitlines()
    assert not [ln for ln in lines if ln.lstrip().startswith("{")], text  # no JSON lines
    (started,) = [ln for ln in text.splitlines() if "supervisor_started" in ln]
    assert " metrics_url=http://127.0.0.1:" in started and " engines=talker" in started
    assert "[cuzkd.supervisor]" in started
    (relogged,) = [ln for ln in text.splitlines() if "job_started" in ln]
    assert "[warning" in relogged and "job_id=j-1" in relogged
    assert "{" not in relogged and "\\" not in relogged  # fields, not an escaped document
    # Each of the engine's lines is one line, led by the engine's name and its own event (a
    # plain line's text), the engine's fields after it and the bookkeeping left to JSON.
    (plain,) = [ln for ln in lines if PLAIN in ln]
    assert relogged.split("] ", 1)[1].startswith("talker | job_started job_id=j-1 ")
    assert plain.split("] ", 1)[1] == f"talker | {PLAIN}"
    for bookkeeping in (" engine=", " stream=", " pid=", "engine_timestamp=", "[cuzkd.engine]"):
        assert bookkeeping not in relogged
    assert "engine_engine=inner" in relogged and "engine_pid=1" in relogged  # the engine's own


def test_console_on_a_terminal(tmp_path: Path) -> None:
    """On a real pseudo-terminal: cuzkd's lines as structlog writes them, an engine's led by
    its name (:func:`_assert_console`)."""
    _assert_console(_run(_config(tmp_path), tty=True))


@pytest.mark.parametrize(("key", "flag", "expected"), [
    ("console", None, "console"),   # the config key alone
    ("console", "json", "json"),    # the flag overrides the key
    ("json", "console", "console"),
])
def test_log_format_key_and_flag(tmp_path: Path, key: str, flag: str | None,
                                 expected: str) -> None:
    args = () if flag is None else ("--log-format", flag)
    text = _run(_config(tmp_path, log_format=key), *args)
    if expected == "json":
        assert [e for e in _json_events(text) if e["event"] == "job_started"]
    else:
        _assert_console(text)


def test_bad_log_format_key_names_it(tmp_path: Path) -> None:
    out = subprocess.run([sys.executable, "-m", "cuzkd", "check-config",
                          str(_config(tmp_path, log_format="yaml"))],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 78 and "supervisor.log_format" in out.stderr


#: An engine that logs as fast as it can, with output limits that let it all through.
CHATTY = {"name": "chatty", "command": [sys.executable, "-c",
                                        "while True:\n    print('chatty ' + 'x' * 200)\n"],
          "stop_timeout": "2s", "output_lines_per_second": 1e9, "output_burst_lines": 10**9,
          "output_bytes_per_second": "1TiB", "output_burst_bytes": "1TiB"}


def _log_lines_dropped(metrics_address: str, reason: str = "queue_full") -> int:
    """``cuzkd_log_lines_dropped_total{reason=...}`` (0 while absent); a scrape must answer
    at once."""
    with urllib.request.urlopen(f"http://{metrics_address}/metrics", timeout=5) as resp:
        text = resp.read().decode()
    series = f'cuzkd_log_lines_dropped_total{{reason="{reason}"}} '
    return sum(int(float(ln.removeprefix(series))) for ln in text.splitlines()
               if ln.startswith(series))


def test_a_stalled_log_reader_stalls_neither_metrics_nor_the_engines(tmp_path: Path) -> None:
    """The supervisor's stderr is a pipe nobody reads (journald stalled): with a chatty engine
    the pipe fills at once, yet /metrics, the control socket and the watchdog pings go on,
    lines are dropped and counted; once the reader drains, the gap is reported and the last
    lines reach it."""
    config = write_config(tmp_path, [CHATTY], supervisor={"log_format": "json"})
    notify_socket = str(tmp_path / "notify.sock")
    notify = NotifyListener(notify_socket)
    r, w = os.pipe()
    try:
        sup = start_supervisor(config, output=w, env={"NOTIFY_SOCKET": notify_socket,
                                                      "WATCHDOG_USEC": "200000"})
    finally:
        os.close(w)
    try:
        address = sup.about()["metrics_listen"]
        # The listener is drained meanwhile: a full notify socket would block the supervisor's
        # sendto (max_dgram_qlen is 10 datagrams, one second of pings here).
        dropped = wait_until(lambda: notify.drain() and _log_lines_dropped(address), 60,
                             "log lines dropped")
        assert sup.engine("chatty")["restarts"] == 0
        pings = notify.drain().count("WATCHDOG=1")
        wait_until(lambda: notify.drain().count("WATCHDOG=1") >= pings + 3, 10,
                   "watchdog pings while the log is stalled")
        # The reader drains: the gap is reported, then the last lines come (it keeps reading).
        text = read_until(r, b'"log_lines_dropped"')
        sup.proc.send_signal(signal.SIGTERM)
        text += read_until(r, b'"supervisor_stopped"')
        assert sup.proc.wait(30) == 0
        (report,) = [json.loads(line) for line in text.decode(errors="replace").splitlines()
                     if '"log_lines_dropped"' in line]
        assert report["reason"] == "queue_full" and report["lines"] >= dropped
        assert report["level"] == "warning" and report["seconds"] > 0
    finally:
        sup.close()
        os.close(r)


def test_a_reader_that_closes_the_pipe_costs_log_lines_not_the_supervisor(
        tmp_path: Path) -> None:
    """``cuzkd run | head -3``: once the reader is gone every write fails with EPIPE; the
    supervisor and its engine go on, the lost lines counted."""
    config = write_config(tmp_path, [CHATTY], supervisor={"log_format": "json"})
    r, w = os.pipe()
    try:
        sup = start_supervisor(config, output=w)
    finally:
        os.close(w)
    try:
        os.close(r)
        address = sup.about()["metrics_listen"]
        # Before, the output reader died on the EPIPE, and the engine on its next write.
        wait_until(lambda: _log_lines_dropped(address, "write_error")
                   or sup.engine("chatty")["restarts"], 30, "failed writes or a restart")
        assert sup.engine("chatty")["restarts"] == 0
        assert _log_lines_dropped(address, "write_error") > 0
        assert sup.stop() == 0
    finally:
        sup.close()
