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
from pathlib import Path
from typing import Any

import pytest
from sv_harness import write_config

from cuzkd.config import parse_config
from cuzkd.logs import engine_line_fields
from cuzkd.supervisor.startup import startup_fields

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
    level, event, fields = engine_line_fields(json.dumps(ENGINE_JSON)) or ("", "", {})
    assert (level, event) == ("warning", "job_started")
    assert fields == {"job_id": "j-1", "partitions": 16, "engine_engine": "inner",
                      "engine_pid": 1}
    assert engine_line_fields('{"msg": "no event", "level": "LOUD", "self": 1}') == (
        "info", "engine_output", {"msg": "no event", "engine_self": 1})
    for text in ("plain words", "[1, 2]", '"a string"', "{not json", "", "  42"):
        assert engine_line_fields(text) is None


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
    assert relogged["logger"] == "cuzkd.supervisor" and "engine_logger" not in relogged
    (plain,) = [e for e in events if e["event"] == "engine_output"]
    assert plain["line"] == PLAIN and plain["stream"] == "stdout"


def _assert_console(text: str) -> None:
    lines = text.splitlines()
    assert not [ln for ln in lines if ln.lstrip().startswith("{")], text  # no JSON lines
    (started,) = [ln for ln in text.splitlines() if "supervisor_started" in ln]
    assert " metrics_url=http://127.0.0.1:" in started and " engines=talker" in started
    assert "[cuzkd.supervisor]" in started
    (relogged,) = [ln for ln in text.splitlines() if "job_started" in ln]
    assert "[warning" in relogged and "job_id=j-1" in relogged and "engine=talker" in relogged
    assert "{" not in relogged and "\\" not in relogged  # fields, not an escaped document


def test_console_on_a_terminal(tmp_path: Path) -> None:
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
