"""The control socket and CLI: permissions, stale socket, single owner, start/stop/restart."""

from __future__ import annotations

import asyncio
import json
import socket
import stat
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any

import msgspec
import pytest
from aiohttp import web
from support.supervisor_harness import scripted_engine, start_supervisor, unix_request, write_config

from cuzkd.httperrors import JsonErrorsRunner
from cuzkd.supervisor.engines.info import EngineInfo
from cuzkd.supervisor.web.control_routes import build_control_app


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "cuzkd", *args], capture_output=True,
                          text=True, timeout=60)


def test_control_api_and_cli(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir()
    stale = socket.socket(socket.AF_UNIX)  # a socket left behind by a crashed supervisor
    stale.bind(str(state / "control.sock"))
    stale.close()
    config = write_config(tmp_path, [
        scripted_engine(tmp_path, "a", health_interval="50ms", stop_timeout="2s"),
        {"name": "swapped", "command": ["{binary}"], "status_url": "http://127.0.0.1:1/status"},
    ])
    sup = start_supervisor(config)
    try:
        assert stat.S_IMODE(sup.control_socket.stat().st_mode) == 0o600
        assert stat.S_IMODE(sup.state_dir.stat().st_mode) == 0o700
        first = sup.wait_engine("a", lambda e: e["state"] == "running")
        swapped = sup.engine("swapped")
        assert swapped["state"] == "failed" and "{binary}" in swapped["last_error"]

        out = cli("status", "--config", str(config))
        assert out.returncode == 0, out.stderr
        assert "a " in out.stdout and "running" in out.stdout and "failed" in out.stdout
        data = json.loads(cli("status", "--json", "--config", str(config)).stdout)
        assert {e["name"] for e in data["engines"]} == {"a", "swapped"}

        out = cli("restart", "a", "--config", str(config))
        assert out.returncode == 0, out.stderr
        restarted = sup.engine("a")
        assert restarted["pid"] != first["pid"] and restarted["restarts"] == 1

        assert cli("stop", "a", "--config", str(config)).returncode == 0
        assert sup.engine("a")["state"] == "stopped"
        out = cli("start", "a", "--config", str(config))
        assert out.returncode == 0, out.stderr
        assert "a: running" in out.stdout and sup.engine("a")["state"] == "running"
        # An engine that cannot start: exit 1 with the reason, not its "failed" state and 0.
        out = cli("start", "swapped", "--config", str(config))
        assert out.returncode == 1, out.stdout
        assert "did not start: engine is failed" in out.stderr and "{binary}" in out.stderr

        out = cli("restart", "nope", "--config", str(config))
        assert out.returncode == 1 and "no engine named 'nope'" in out.stderr
        out = cli("stop", "a?x", "--config", str(config))  # quoted: not the path `/v1/engines/a`
        assert out.returncode == 1 and "no engine named 'a?x'" in out.stderr
        status, body = unix_request(sup.control_socket, "POST", "/v1/engines/a/explode")
        assert status == 404 and "unknown action" in body["error"]
        status, body = unix_request(sup.control_socket, "DELETE", "/v1/engines")
        assert status == 405 and "error" in body

        second = subprocess.run([sys.executable, "-m", "cuzkd", "run", "--config", str(config)],
                                capture_output=True, text=True, timeout=60)
        assert second.returncode == 1
        assert "another cuzkd" in second.stderr and str(sup.state_dir) in second.stderr
    finally:
        assert sup.stop() == 0
    assert not sup.control_socket.exists()


@pytest.mark.parametrize("command", [["status"], ["upgrade"], ["upgrade", "--check"]])
def test_cli_without_a_supervisor_exits_69(tmp_path: Path, command: list[str]) -> None:
    config = write_config(tmp_path, [scripted_engine(tmp_path, "a")])
    out = cli(*command, "--config", str(config))
    assert out.returncode == 69
    assert "cannot reach the supervisor" in out.stderr and "control.sock" in out.stderr


def test_control_routes_hooks_extend_the_app() -> None:
    seen: list[web.Application] = []

    def hook(app: web.Application) -> None:
        seen.append(app)

        async def swap(request: web.Request) -> web.Response:
            return web.json_response({})

        app.router.add_post("/v1/swap", swap)

    fake: Any = object()
    app = build_control_app(fake, dict, dict, [hook])
    assert seen == [app]
    assert any(r.resource is not None and r.resource.canonical == "/v1/swap"
               for r in app.router.routes())


def test_start_and_restart_wait_for_running_and_say_why_not(tmp_path: Path) -> None:
    """Engines without status_url are supervised by their process alone: ``running`` once
    alive through the settle time, ``cuzkd_engine_up`` 1 while so, and no ``cuzk_*`` series."""
    config = write_config(tmp_path, [
        {"name": "sleeper", "command": ["sleep", "600"], "stop_timeout": "5s"},
        {"name": "crasher", "command": ["false"], "backoff_initial": "30s",
         "backoff_max": "30s"},
        scripted_engine(tmp_path, "silent", "silent", start_timeout="300ms", backoff_initial="30s",
                    backoff_max="30s"),
    ])
    sup = start_supervisor(config)
    try:
        sleeper = sup.wait_engine("sleeper", lambda e: e["state"] == "running")
        assert sleeper["status_address"] is None
        for verb in ("restart", "start"):
            out = cli(verb, "crasher", "--config", str(config))
            assert out.returncode == 1, out.stdout
            assert "did not start: engine is backoff" in out.stderr, out.stderr
            assert "exit_1" in out.stderr
        out = cli("restart", "silent", "--config", str(config))
        assert out.returncode == 1 and "start_timeout" in out.stderr, out.stderr

        out = cli("restart", "sleeper", "--config", str(config))
        assert out.returncode == 0, out.stderr
        assert "sleeper: running" in out.stdout
        restarted = sup.engine("sleeper")
        assert restarted["state"] == "running" and restarted["pid"] != sleeper["pid"]

        with urllib.request.urlopen(f"http://{sup.about()['metrics_listen']}/metrics",
                                    timeout=10) as resp:
            metrics = resp.read().decode()
        assert 'cuzkd_engine_up{engine="sleeper"} 1.0' in metrics
        assert 'cuzkd_engine_up{engine="crasher"} 0.0' in metrics
        assert not [line for line in metrics.splitlines()
                    if line.startswith("cuzk_") and 'engine="sleeper"' in line]
        assert not sup.events("engine_status_failed", engine="sleeper")
        out = cli("status", "sleeper", "--config", str(config))
        assert out.returncode == 0, out.stderr
        assert "supervised by its process alone" in out.stdout

        out = cli("stop", "sleeper", "--config", str(config))
        assert out.returncode == 0 and sup.engine("sleeper")["state"] == "stopped"
    finally:
        assert sup.stop() == 0


def test_a_failed_stop_answers_409_and_the_cli_exits_1(tmp_path: Path) -> None:
    """The supervisor's reason for a stop that did not end the engine reaches the operator."""

    class StuckSupervisor:
        stopping = False

        def has_engine(self, name: str) -> bool:
            return True

        async def stop_engine(self, name: str) -> str:
            return "not stopped 35s after the stop request: engine is stopping"

        def engine_info(self, name: str) -> EngineInfo:
            return EngineInfo(name=name, state="stopping", pid=42)

    async def serve_and_stop() -> subprocess.CompletedProcess[str]:
        runner = web.AppRunner(build_control_app(StuckSupervisor(), dict, dict, []))  # type: ignore[arg-type]
        await runner.setup()
        sock = tmp_path / "control.sock"
        await web.UnixSite(runner, str(sock)).start()
        config = tmp_path / "c.toml"
        config.write_text(f'[supervisor]\ncontrol_socket = "{sock}"\n[[engine]]\nname = "a"\n')
        try:
            proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "cuzkd", "stop", "a", "--config", str(config),
                stdout=subprocess.PIPE, stderr=subprocess.PIPE)
            out, err = await proc.communicate()
        finally:
            await runner.cleanup()
        assert proc.returncode is not None
        return subprocess.CompletedProcess([], proc.returncode, out.decode(), err.decode())

    out = asyncio.run(serve_and_stop())
    assert out.returncode == 1
    assert "stop a: not stopped 35s after the stop request" in out.stderr


def test_protocol_errors_on_the_control_socket_are_json(tmp_path: Path) -> None:
    """A request line longer than aiohttp's limit never reaches a middleware; still JSON."""

    async def exchange() -> bytes:
        runner = JsonErrorsRunner(build_control_app(object(), dict, dict, []))  # type: ignore[arg-type]
        await runner.setup()
        sock = tmp_path / "control.sock"
        await web.UnixSite(runner, str(sock)).start()
        try:
            reader, writer = await asyncio.open_unix_connection(str(sock))
            writer.write(b"GET /v1/" + b"e" * 9000 + b" HTTP/1.1\r\nHost: x\r\n\r\n")
            raw = await asyncio.wait_for(reader.read(), 10)
            writer.close()
        finally:
            await runner.cleanup()
        return raw

    head, _, body = asyncio.run(exchange()).partition(b"\r\n\r\n")
    assert head.split()[1] == b"400" and b"Content-Type: application/json" in head
    assert json.loads(body)["error"].startswith("Bad Request: Got more than")


def test_client_commands_do_not_need_the_metrics_host_to_resolve(tmp_path: Path) -> None:
    """DNS down must not take `cuzkd status` with it: only `run` and `check-config` resolve."""
    config = tmp_path / "c.toml"
    config.write_text(f'[supervisor]\nstate_dir = "{tmp_path / "state"}"\n'
                      '[metrics]\nlisten = "no-such-host.invalid:9822"\n[[engine]]\nname = "a"\n')
    out = cli("status", "--config", str(config))
    assert out.returncode == 69 and "cannot reach the supervisor" in out.stderr, out.stderr
    out = cli("check-config", str(config))
    assert out.returncode == 78 and "does not resolve" in out.stderr, out.stderr


#: The keys of an engine entry on the control API, in the order they have always had.
ENTRY_KEYS = ["name", "state", "pid", "started_at", "restarts", "last_exit_cause", "exits",
              "next_restart_at", "last_error", "waiting_for_gpu", "stalled", "stalls_total",
              "last_exit_stderr", "status_address", "command", "release",
              "status_field_errors", "stale_jobs", "phantom_busy_workers"]


def test_an_engine_entry_goes_from_the_supervisor_to_the_cli_unchanged(tmp_path: Path) -> None:
    """One typed entry (:class:`EngineInfo`) on both sides of the socket: the control API
    serves it with the keys it always had, and ``cuzkd status`` decodes it back into the same
    value and prints it (``--json``: the very JSON the API served)."""
    info = EngineInfo(
        name="gpu0", state="backoff", pid=None, started_at=None, restarts=3,
        last_exit_cause="oom_killed", exits={"oom_killed": 2, "exit_1": 1},
        next_restart_at=1e12, last_error="status silent", waiting_for_gpu=True, stalled=True,
        stalls_total=4, last_exit_stderr=["allocating", "Killed"], status_address=None,
        command=["{binary}", "--gpu", "0"], release="r-abc", status_field_errors="left out")

    class OneEngine:
        stopping = False

        def engines_info(self) -> list[EngineInfo]:
            return [info]

    async def serve_and_ask() -> tuple[Any, list[subprocess.CompletedProcess[str]]]:
        runner = web.AppRunner(build_control_app(
            OneEngine(), dict, lambda: {"id": None}, []))  # type: ignore[arg-type]
        await runner.setup()
        sock = tmp_path / "control.sock"
        await web.UnixSite(runner, str(sock)).start()
        config = tmp_path / "c.toml"
        config.write_text(f'[supervisor]\ncontrol_socket = "{sock}"\n[[engine]]\nname = "a"\n')
        outs = []
        try:
            served = await asyncio.to_thread(unix_request, sock, "GET", "/v1/engines")
            for args in (["--json"], [], ["gpu0", "--json"]):
                proc = await asyncio.create_subprocess_exec(
                    sys.executable, "-m", "cuzkd", "status", *args, "--config", str(config),
                    stdout=subprocess.PIPE, stderr=subprocess.PIPE)
                out, err = await proc.communicate()
                assert proc.returncode is not None
                outs.append(subprocess.CompletedProcess(args, proc.returncode, out.decode(),
                                                        err.decode()))
        finally:
            await runner.cleanup()
        return served, outs

    (status, body), (as_json, table, one) = asyncio.run(serve_and_ask())
    assert status == 200
    [entry] = body["engines"]
    assert list(entry) == ENTRY_KEYS
    assert msgspec.convert(entry, EngineInfo) == info
    assert as_json.returncode == 0 and json.loads(as_json.stdout) == body
    assert table.returncode == 0, table.stderr
    row = next(line for line in table.stdout.splitlines() if line.startswith("gpu0"))
    assert row.split()[:5] == ["gpu0", "backoff", "-", "-", "3"] and "r-abc" in row
    assert "oom_killed" in row and "error: status silent" in row
    assert one.returncode == 0, one.stderr
    shown = json.loads(one.stdout)
    assert shown["engine"] == entry and list(shown["engine"]) == ENTRY_KEYS
    assert shown["error"] == "no status_url: supervised by its process alone"
