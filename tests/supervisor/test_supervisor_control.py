"""The control socket and CLI: permissions, stale socket, single owner, start/stop/restart."""

from __future__ import annotations

import json
import socket
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

from aiohttp import web
from sv_harness import fake_engine, start_supervisor, unix_request, write_config

from cuzkd.supervisor.control import build_control_app


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
        fake_engine(tmp_path, "a", health_interval="50ms", stop_timeout="2s"),
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
        assert cli("start", "a", "--config", str(config)).returncode == 0
        assert sup.engine("a")["state"] in ("starting", "running")

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


def test_cli_without_a_supervisor_exits_69(tmp_path: Path) -> None:
    config = write_config(tmp_path, [fake_engine(tmp_path, "a")])
    out = cli("status", "--config", str(config))
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
    app = build_control_app(fake, [hook])
    assert seen == [app]
    assert any(r.resource is not None and r.resource.canonical == "/v1/swap"
               for r in app.router.routes())
