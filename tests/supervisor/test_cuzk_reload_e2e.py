"""A reload re-reads each cuzk engine's own TOML: a changed file restarts that engine on the
new addresses (a wildcard polled over loopback, and warned about), an unchanged one keeps it
running, a broken one is refused (exit 78) and the engine runs on. Through ``cuzkd run`` with
the cuzk stand-in."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from support.cuzk_standin import SCRIPT, write_cuzk_toml
from support.ports import free_port
from support.supervisor_harness import pid_alive, start_supervisor, write_config


def _reload(config: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "cuzkd", "reload", "--config", str(config)],
                          capture_output=True, text=True, timeout=60, env=dict(os.environ))


def test_a_changed_cuzk_file_restarts_its_engine_on_the_new_address(tmp_path: Path) -> None:
    cuzk = tmp_path / "cuzk.toml"
    listen = f"unix://{tmp_path}/cuzk.sock"
    first_port, second_port = free_port(), free_port()
    write_cuzk_toml(cuzk, listen, f"127.0.0.1:{first_port}")
    config = write_config(tmp_path, [{
        "name": "cuzk0", "type": "cuzk", "door": "off",  # the cuzk file's reload, no door
        "command": [sys.executable, str(SCRIPT), "--config", str(cuzk)],
        "health_interval": "50ms", "stop_timeout": "2s",
    }, {"name": "other", "command": [sys.executable, "-c", "import time; time.sleep(600)"],
        "stop_timeout": "2s"}])
    sup = start_supervisor(config)
    try:
        running = sup.wait_engine("cuzk0", lambda e: e["state"] == "running")
        assert running["status_address"] == f"http://127.0.0.1:{first_port}/status"
        other = sup.wait_engine("other", lambda e: e["state"] == "running")["pid"]

        done = _reload(config)  # nothing changed: cuzk keeps proving
        assert done.returncode == 0, done.stderr
        assert sup.engine("cuzk0")["pid"] == running["pid"]

        assert not sup.events("config_warning")
        write_cuzk_toml(cuzk, listen, f"0.0.0.0:{second_port}")  # a wildcard: warned about
        done = _reload(config)
        assert done.returncode == 0, done.stderr
        moved = sup.wait_engine("cuzk0", lambda e: e["state"] == "running"
                                and e["pid"] != running["pid"])
        assert moved["status_address"] == f"http://127.0.0.1:{second_port}/status"  # loopback
        [warning] = sup.events("config_warning")
        assert "job ids" in warning["detail"] and str(cuzk) in warning["detail"]
        assert not pid_alive(running["pid"])
        assert sup.engine("other")["pid"] == other  # its spec did not change

        write_cuzk_toml(cuzk, listen, "")  # /status off: refused, the engine runs on
        done = _reload(config)
        assert done.returncode == 78, done.stdout + done.stderr
        assert f"{cuzk}: key `daemon.status_listen`" in done.stderr
        assert sup.engine("cuzk0")["pid"] == moved["pid"]
    finally:
        assert sup.stop() == 0
