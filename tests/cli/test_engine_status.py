"""``cuzkd status``: start-up cost of the client commands, human durations, the engine view."""

from __future__ import annotations

import asyncio
import json
import os
import pty
import select
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
import msgspec
import pytest
from support.supervisor_harness import start_supervisor, write_config

from cuzkd.cli.engine_status import render_engine
from cuzkd.status.document import (
    Allocations,
    Buffers,
    Counters,
    GpuWorker,
    Memory,
    Partition,
    Pipeline,
    StatusDocument,
    Synthesis,
)
from cuzkd.supervisor.engines.info import EngineInfo
from cuzkd.units import format_bytes, format_duration

#: cuzk's job ids are long; the view must never cut them.
LONG_JOB_ID = ("bafy2bzacea3wsdh6y3a36tb3skempjoxqpuyompjbmfeyf34fi3uy6uue42v4"
               "-porep-32GiB-s-t01000-1234")


def _imported_modules(*args: str) -> set[str]:
    """Modules ``python -X importtime -m cuzkd ARGS`` imports (its exit status is not ours)."""
    out = subprocess.run([sys.executable, "-X", "importtime", "-m", "cuzkd", *args],
                         capture_output=True, text=True, timeout=60)
    names = {line.rsplit("|", 1)[1].strip() for line in out.stderr.splitlines()
             if line.startswith("import time:") and "|" in line}
    assert "cuzkd.cli.dispatch" in names, out.stderr[-2000:]
    return names


def _heavy(names: set[str]) -> set[str]:
    return {n for n in names if n == "numpy" or n.startswith("numpy.")
            or n == "cuzkd.bundled" or n.startswith("cuzkd.bundled.")}


@pytest.mark.parametrize("args", [
    ("--version",),
    ("status", "--config", "{config}"),
    ("stop", "x", "--config", "{config}"),
    ("reload", "--config", "{config}"),
    ("swap", "/bin/true", "--config", "{config}"),
])
def test_client_commands_import_neither_numpy_nor_the_engine(tmp_path: Path,
                                                             args: tuple[str, ...]) -> None:
    """Every client call paid ~0.7 s of NumPy and engine imports; none of them needs either.
    (No supervisor runs here: status, stop, reload and swap fail to connect, after their
    imports.)"""
    config = write_config(tmp_path, [{"name": "a"}])
    names = _imported_modules(*(a.replace("{config}", str(config)) for a in args))
    assert _heavy(names) == set()


def test_engine_command_still_imports_the_engine(tmp_path: Path) -> None:
    """The check above can see the engine: `cuzkd bench` (failing to connect) imports it."""
    names = _imported_modules("bench", "--engine", f"unix:{tmp_path / 'none.sock'}")
    assert "cuzkd.bundled.handlers" in names and "numpy" in names


@pytest.mark.parametrize(("seconds", "text"), [
    (0, "0s"), (59.9, "59s"), (60, "1m"), (3599, "59m"), (3600, "1h00m"), (3720, "1h02m"),
    (86399, "23h59m"), (86400, "1d0h"), (3 * 86400 + 4 * 3600 + 59, "3d4h"), (-5, "0s"),
])
def test_format_duration(seconds: float, text: str) -> None:
    assert format_duration(seconds) == text


@pytest.mark.parametrize(("size", "text"), [
    (0, "0 B"), (1023, "1023 B"), (1024, "1.0 KiB"), (18 * 2**20 + 2**19, "18.5 MiB"),
    (2 * 2**30, "2.0 GiB"), (3 * 2**40, "3.0 TiB"), (5000 * 2**40, "5000.0 TiB"),
])
def test_format_bytes(size: int, text: str) -> None:
    assert format_bytes(size) == text


def _plain_cuzk_document() -> StatusDocument:
    """What a real cuzk serves: no cuzkd_extensions, long job ids."""
    states = ["done"] * 4 + ["gpu"] * 2 + ["synth_done"] + ["synthesizing"] * 2 + ["pending"]
    return StatusDocument(
        uptime_secs=3600.0,
        memory=Memory(total_bytes=64 * 2**30, used_bytes=16 * 2**30,
                      available_bytes=48 * 2**30),
        synthesis=Synthesis(max_concurrent=6, active=2),
        pipelines=[Pipeline(job_id=LONG_JOB_ID, proof_kind="porep-c2", started_secs_ago=95.5,
                            total_partitions=10, partitions_done=4,
                            partitions=[Partition(index=i, state=s, synth_ms=None, gpu_ms=None)
                                        for i, s in enumerate(states)])],
        gpu_workers=[
            GpuWorker(worker_id=0, gpu_ordinal=0, state="proving", current_job=LONG_JOB_ID,
                      current_partition=4, busy_secs=2.25),
            GpuWorker(worker_id=1, gpu_ordinal=0, state="idle", current_job=None,
                      current_partition=None, busy_secs=None),
        ],
        allocations=Allocations(srs=[], pce=[]),
        counters=Counters(total_completed=7, total_failed=0, completed_by_kind={},
                          failed_by_kind={}, queue_depth=3),
        buffers=Buffers(synth_in_flight=2, provers_in_flight=2, aux_in_flight=0,
                        shells_in_flight=1, pending_handles=1),
    )


def _entry(fields: dict[str, Any]) -> EngineInfo:
    """A control-API engine entry, decoded as the CLI decodes it."""
    return msgspec.convert(fields, EngineInfo)


def _row(text: str, first_cell: str) -> list[str]:
    (line,) = [ln for ln in text.splitlines() if ln.split() and ln.split()[0] == first_cell]
    return line.split()


def test_engine_view_of_a_plain_cuzk_document() -> None:
    info = {"name": "cuzk1", "state": "running", "pid": 4242, "started_at": 1000.0,
            "restarts": 2, "status_address": "http://127.0.0.1:9821/status"}
    text = render_engine(_entry(info), _plain_cuzk_document(), None, now=1000.0 + 3720)
    assert text.splitlines()[0] == ("cuzk1  running  pid 4242  up 1h02m  restarts 2  "
                                    "status http://127.0.0.1:9821/status")
    assert "budget 16.0 GiB / 64.0 GiB used (25%)   synthesis 2 / 6 active   queue 3" in text
    assert "jobs in flight" not in text  # a plain cuzk does not say
    assert _row(text, "0") == ["0", "0", "proving", "2.2s", "4", LONG_JOB_ID]
    assert _row(text, "1") == ["1", "0", "idle", "-", "-", "-"]
    header = _row(text, "JOB")
    assert header[4:] == ["PENDING", "SYNTHESIZING", "SYNTH_DONE", "GPU", "DONE", "FAILED"]
    assert _row(text, LONG_JOB_ID) == [LONG_JOB_ID, "porep-c2", "1m", "4/10",
                                       "1", "2", "1", "2", "4", "0"]


def test_engine_view_shows_stale_jobs_with_their_age_and_phantom_workers() -> None:
    """The supervisor's leftovers of failed work (a plain cuzk's) as the control API sends
    them: each stale job whole with its age, and a worker shown proving but not busy."""
    info = {"name": "cuzk1", "state": "running", "pid": 4242, "started_at": 1000.0,
            "restarts": 0, "status_address": "http://127.0.0.1:9821/status",
            "stale_jobs": [{"job_id": LONG_JOB_ID, "proof_kind": "porep-c2",
                            "age_secs": 5400.0, "idle_secs": 4800.0, "failed_partitions": 1}],
            "phantom_busy_workers": [0]}
    text = render_engine(_entry(info), _plain_cuzk_document(), None, now=1000.0 + 60)
    assert _row(text, "0") == ["0", "0", "phantom", "2.2s", "4", LONG_JOB_ID]
    assert "stale jobs (leftovers of failed work: not in flight, not busy):" in text
    assert text.splitlines()[-1].split() == [LONG_JOB_ID, "porep-c2", "1h30m", "1h20m", "1"]


def test_engine_view_of_a_document_with_values_left_out_names_them() -> None:
    """Unknown figures print as ``?`` (never ``None``, never a crash) and the view says which
    values were left out; the rest of the document is shown as ever."""
    doc = _plain_cuzk_document()
    doc = msgspec.structs.replace(
        doc, memory=Memory(total_bytes=64 * 2**30, used_bytes=None, available_bytes=None),
        synthesis=Synthesis(max_concurrent=None, active=2),
        counters=msgspec.structs.replace(doc.counters, queue_depth=None))
    left_out = ("left out: Expected `int` <= 9223372036854775807 - at "
                "`$.memory.used_bytes` (and 2 more)")
    info = {"name": "cuzk1", "state": "running", "pid": 4242, "started_at": 1000.0,
            "restarts": 0, "status_address": "http://127.0.0.1:9821/status",
            "status_field_errors": left_out}
    text = render_engine(_entry(info), doc, None, now=1000.0 + 60)
    assert f"status fields {left_out}" in text.splitlines()
    assert "budget ? / 64.0 GiB used   synthesis 2 / ? active   queue ?" in text
    assert _row(text, "0") == ["0", "0", "proving", "2.2s", "4", LONG_JOB_ID]
    assert "None" not in text


def test_engine_view_when_the_status_is_unavailable() -> None:
    info = {"name": "gpu0", "state": "backoff", "pid": None, "started_at": None, "restarts": 5,
            "status_address": "unix:/run/x.sock"}
    text = render_engine(_entry(info), None, None, now=0.0)
    assert "gpu0  backoff  pid -  up -  restarts 5" in text
    assert "status: unavailable (engine not running)" in text


def test_engine_view_without_a_status_url_never_prints_none() -> None:
    info = {"name": "plain", "state": "running", "pid": 7, "started_at": 0.0, "restarts": 0,
            "status_address": None}
    text = render_engine(_entry(info), None, "no status_url: supervised by its process alone",
                         now=1.0)
    assert text.splitlines()[0] == "plain  running  pid 7  up 1s  restarts 0  status -"
    assert "None" not in text


def test_engine_view_shows_exit_causes_stalls_the_gpu_gate_and_the_stderr_tail() -> None:
    info = {"name": "gpu0", "state": "backoff", "pid": None, "started_at": None, "restarts": 2,
            "status_address": "unix:/run/x.sock", "last_exit_cause": "oom_killed",
            "exits": {"oom_killed": 1, "stalled": 1}, "stalls_total": 1, "stalled": False,
            "waiting_for_gpu": True, "last_exit_stderr": ["allocating 40 GiB", "Killed"]}
    lines = render_engine(_entry(info), None, None, now=0.0).splitlines()
    assert lines[1] == ("last exit oom_killed   exits oom_killed 1, stalled 1   stalls 1   "
                        "waiting for GPU memory")
    assert lines[-3:] == ["stderr of the last exited process (last 2 lines):",
                          "  | allocating 40 GiB", "  | Killed"]
    quiet = render_engine(_entry({**info, "waiting_for_gpu": False, "last_exit_stderr": [],
                                  "stalled": True}), None, None, now=0.0)
    assert quiet.splitlines()[1].endswith("stalls 1   STALLED now")
    assert "stderr of the last" not in quiet
    assert "last error" not in quiet
    failing = render_engine(
        _entry({**info, "last_error": "HTTP 500 Internal Server Error: 'boom'"}),
        None, None, now=0.0)
    assert failing.splitlines()[2] == "last error: HTTP 500 Internal Server Error: 'boom'"


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "cuzkd", *args], capture_output=True,
                          text=True, timeout=60)


def _submit(socket_path: str, kind: str) -> str:
    """POST a job to a bundled engine's socket; its id."""
    async def post() -> str:
        connector = aiohttp.UnixConnector(path=socket_path)
        async with aiohttp.ClientSession(connector=connector) as session, \
                session.post("http://engine/v1/jobs", json={"proof_kind": kind}) as resp:
            assert resp.status < 300, await resp.text()
            return str((await resp.json())["job_id"])

    return asyncio.run(post())


def _read_pty_until(fd: int, predicate: Callable[[str], bool], timeout: float) -> str:
    text = ""
    deadline = time.monotonic() + timeout
    while not predicate(text):
        assert time.monotonic() < deadline, text[-2000:]
        if select.select([fd], [], [], 0.5)[0]:
            text += os.read(fd, 65536).decode(errors="replace")
    return text


def test_status_name_json_and_watch_on_a_bundled_engine(tmp_path: Path) -> None:
    """Against a real bundled engine with a job in it: the view with the job's full id,
    --json, --watch redrawing in place on a terminal and in frames when piped (Ctrl-C exits
    0 both ways), an unknown name; and a log without warnings."""
    config = write_config(tmp_path, [{"name": "b0", "health_interval": "100ms"}])
    sup = start_supervisor(config, timeout=60)
    try:
        engine = sup.wait_engine("b0", lambda e: e["state"] == "running", timeout=60)
        job_id = _submit(engine["status_address"].removeprefix("unix:"), "porep-c2")
        # A finished job stays listed for 30 s: the view shows it whatever its progress.
        text = _cli("status", "b0", "--config", str(config)).stdout
        assert text.startswith("b0  running  pid ")
        assert "budget " in text and "jobs in flight" in text
        assert _row(text, job_id)[:2] == [job_id, "porep-c2"]
        assert _row(text, job_id)[3].endswith("/10")
        assert {_row(text, w)[2] for w in ("0", "1")} <= {"idle", "proving"}

        body = json.loads(_cli("status", "b0", "--json", "--config", str(config)).stdout)
        assert body["engine"]["name"] == "b0" and body["error"] is None
        assert [p["job_id"] for p in body["status"]["pipelines"]] == [job_id]

        missing = _cli("status", "nope", "--config", str(config))
        assert missing.returncode == 1 and "no engine named 'nope'" in missing.stderr

        argv = [sys.executable, "-m", "cuzkd", "status", "b0", "--watch", "0.1", "--config",
                str(config)]
        # PYTHONFAULTHANDLER: should Ctrl-C not end it, SIGABRT prints where it is
        piped = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                 text=True, env={**os.environ, "PYTHONFAULTHANDLER": "1"})
        assert piped.stdout is not None
        headlines = 0
        while headlines < 2:
            line = piped.stdout.readline()
            assert line, piped.stderr.read() if piped.stderr else ""
            headlines += line.startswith("b0  running")
        piped.send_signal(signal.SIGINT)
        try:
            rest, err = piped.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            signals = {who: [line for line in Path(f"/proc/{pid}/status").read_text().splitlines()
                             if line.startswith(("State", "Sig", "ShdPnd"))]
                       for who, pid in (("watch", piped.pid), ("test", os.getpid()))}
            piped.send_signal(signal.SIGABRT)
            _, err = piped.communicate(timeout=30)
            pytest.fail(f"Ctrl-C did not end --watch within 30 s: {signals}\n{err}")
        assert piped.returncode == 0, err
        assert "\x1b" not in rest and "Traceback" not in err

        terminal, tty = pty.openpty()
        on_tty = subprocess.Popen(argv, stdout=tty, stderr=tty)
        os.close(tty)
        try:
            clear = "\x1b[H\x1b[2J"  # cursor home, clear screen: each frame replaces the last
            screen = _read_pty_until(terminal, lambda t: t.count(clear) >= 2, 30)
            assert screen.startswith(clear) and job_id in screen
            on_tty.send_signal(signal.SIGINT)
            assert on_tty.wait(30) == 0
        finally:
            if on_tty.poll() is None:
                on_tty.kill()
                on_tty.wait()
            os.close(terminal)
    finally:
        sup.stop()
    # An ordinary start and stop (polls failing until the engine binds, and while it goes
    # away) is nothing to warn a newcomer about.
    assert not sup.events("engine_status_failed")


def test_watch_needs_a_name(tmp_path: Path) -> None:
    config = write_config(tmp_path, [{"name": "a"}])
    out = _cli("status", "--watch", "--config", str(config))
    assert out.returncode == 2 and "needs an engine NAME" in out.stderr
    assert _cli("status", "a", "--watch", "0", "--config", str(config)).returncode == 2
