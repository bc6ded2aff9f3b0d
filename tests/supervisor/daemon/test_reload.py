"""SIGHUP: added engines start, removed stop, changed restart, unchanged keep running;
an invalid new config is refused and the old one stays."""

from __future__ import annotations

import asyncio
import errno
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest
from support.supervisor_harness import (
    RunningSupervisor,
    pid_alive,
    scripted_engine,
    start_supervisor,
    to_toml,
    write_config,
)
from support.waiting import wait_until

from cuzkd.config import load_config
from cuzkd.errors import ConfigError
from cuzkd.supervisor.daemon import configread
from cuzkd.supervisor.daemon.configread import OffLoopReader, reload_config


def test_reload_applies_the_difference(tmp_path: Path) -> None:
    fast = {"health_interval": "50ms", "stop_timeout": "1s"}
    engines = [scripted_engine(tmp_path, n, **fast) for n in ("keep", "drop", "change")]
    config = write_config(tmp_path, engines)
    sup = start_supervisor(config)
    try:
        before = {n: sup.wait_engine(n, lambda e: e["state"] == "running")["pid"]
                  for n in ("keep", "drop", "change")}
        write_config(tmp_path, [engines[0],
                                {**engines[2], "env": {"CHANGED": "1"}},
                                scripted_engine(tmp_path, "new", **fast)])
        sup.proc.send_signal(signal.SIGHUP)
        wait_until(lambda: set(sup.engines()) == {"keep", "change", "new"}, 15, "new engine set")
        after = {n: sup.wait_engine(n, lambda e: e["state"] == "running")["pid"]
                 for n in ("keep", "change", "new")}
        assert after["keep"] == before["keep"]
        assert after["change"] != before["change"]
        assert not pid_alive(before["drop"]) and not pid_alive(before["change"])
        assert list(sup.engines()) == ["keep", "change", "new"]

        config.write_text(config.read_text() + "\n[[engine]]\nname = 'keep'\n")  # duplicate
        sup.proc.send_signal(signal.SIGHUP)
        [refused] = wait_until(lambda: sup.events("supervisor_reload_refused"), 10,
                               "supervisor_reload_refused")
        assert "duplicate engine name" in refused["error"] and "engine[3].name" in refused["error"]
        assert {n: e["pid"] for n, e in sup.engines().items()} == after
    finally:
        assert sup.stop() == 0


def _reload_cli(config: Path, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "cuzkd", "reload", "--config", str(config)],
                          capture_output=True, text=True, timeout=60, env={**os.environ, **env})


def test_cuzkd_reload_returns_once_applied_and_fails_on_a_refused_file(tmp_path: Path) -> None:
    """``cuzkd reload`` (the unit's ExecReload): when it exits 0 the new engine set already
    runs -- no waiting after it. A file that does not validate is still sent to the
    supervisor, which refuses it itself (its metric goes to 0): exit 78 with the reason,
    nothing changed; even a file that is not TOML at all."""
    fast = {"health_interval": "50ms", "stop_timeout": "1s"}
    engines = [scripted_engine(tmp_path, n, **fast) for n in ("keep", "drop")]
    config = write_config(tmp_path, engines)
    sup = start_supervisor(config)
    try:
        drop = sup.wait_engine("drop", lambda e: e["state"] == "running")["pid"]
        write_config(tmp_path, [engines[0], scripted_engine(tmp_path, "new", **fast)])
        done = _reload_cli(config)
        assert (done.returncode, done.stdout) == (0, "reloaded: 2 engine(s): keep, new\n")
        assert list(sup.engines()) == ["keep", "new"] and not pid_alive(drop)

        good = config.read_text()
        config.write_text(good + "\n[[engine]]\nname = 'keep'\n")  # duplicate
        done = _reload_cli(config)
        assert done.returncode == 78, done.stdout + done.stderr
        assert "reload refused:" in done.stderr and "engine[2].name" in done.stderr
        assert list(sup.engines()) == ["keep", "new"]
        assert _metric(sup, "cuzkd_config_last_reload_successful") == 0

        # Not TOML: the socket is not in the file any more; under systemd the default state
        # dir is StateDirectory='s, which it passes as $STATE_DIRECTORY.
        config.write_text(good.replace("[[engine]]", "[[engine]", 1))
        done = _reload_cli(config, STATE_DIRECTORY=str(sup.state_dir))
        assert done.returncode == 78 and "reload refused:" in done.stderr, done.stderr
        assert "invalid TOML" in done.stderr and list(sup.engines()) == ["keep", "new"]

        config.write_text(good)
        assert _reload_cli(config).returncode == 0
        assert _metric(sup, "cuzkd_config_last_reload_successful") == 1
    finally:
        assert sup.stop() == 0


def _metric(sup: RunningSupervisor, name: str) -> float:
    with urllib.request.urlopen(f"http://{sup.about()['metrics_listen']}/metrics",
                                timeout=10) as resp:
        text = resp.read().decode()
    [value] = [line.split()[-1] for line in text.splitlines() if line.startswith(name + " ")]
    return float(value)


def test_a_file_that_is_not_utf8_is_refused_and_exported(tmp_path: Path) -> None:
    engines = [scripted_engine(tmp_path, "a", health_interval="50ms", stop_timeout="1s")]
    config = write_config(tmp_path, engines)
    sup = start_supervisor(config)
    try:
        pid = sup.wait_engine("a", lambda e: e["state"] == "running")["pid"]
        assert _metric(sup, "cuzkd_config_last_reload_successful") == 1
        started = _metric(sup, "cuzkd_config_last_reload_success_timestamp_seconds")
        good = config.read_bytes()
        config.write_bytes(b"# caf\xe9\n" + good)
        sup.proc.send_signal(signal.SIGHUP)
        [refused] = wait_until(lambda: sup.events("supervisor_reload_refused"), 10,
                               "supervisor_reload_refused")
        assert f"{config}: not UTF-8" in refused["error"]
        assert _metric(sup, "cuzkd_config_last_reload_successful") == 0
        assert sup.engine("a")["pid"] == pid

        config.write_bytes(good)
        sup.proc.send_signal(signal.SIGHUP)
        wait_until(lambda: sup.events("supervisor_reloaded"), 10, "the reload")
        assert _metric(sup, "cuzkd_config_last_reload_successful") == 1
        assert _metric(sup, "cuzkd_config_last_reload_success_timestamp_seconds") > started
    finally:
        assert sup.stop() == 0


def test_a_fifo_config_does_not_freeze_metrics_or_the_control_socket(tmp_path: Path) -> None:
    """The read blocks in open() until a writer comes; meanwhile everything else answers."""
    engines = [scripted_engine(tmp_path, "a", health_interval="50ms", stop_timeout="1s")]
    config = write_config(tmp_path, engines)
    sup = start_supervisor(config)
    try:
        sup.wait_engine("a", lambda e: e["state"] == "running")
        good = config.read_text()
        config.unlink()
        os.mkfifo(config)
        sup.proc.send_signal(signal.SIGHUP)
        # Open as the writer once the supervisor has the FIFO open for reading (ENXIO before):
        # its read now blocks until data or EOF come.
        writer = wait_until(lambda: _open_writer(config), 10, "the supervisor's read")
        try:
            for _ in range(3):
                assert _metric(sup, "cuzkd_config_last_reload_successful") == 1
                assert sup.engine("a")["state"] == "running"
            assert not sup.events("supervisor_reloaded")
            assert not sup.events("supervisor_reload_refused")
            extra = to_toml({"engine": [scripted_engine(tmp_path, "b")]})
            os.write(writer, (good + "\n" + extra).encode())
        finally:
            os.close(writer)  # EOF: the read completes
        wait_until(lambda: sup.engines().get("b", {}).get("state") == "running", 15, "engine b")
        assert _metric(sup, "cuzkd_config_last_reload_successful") == 1
    finally:
        assert sup.stop() == 0


def _open_writer(fifo: Path) -> int | None:
    """A write descriptor on ``fifo`` once a reader has it open, else None."""
    try:
        return os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
    except OSError as exc:
        if exc.errno == errno.ENXIO:
            return None
        raise


def test_a_read_that_never_returns_times_out_and_is_not_repeated(tmp_path: Path) -> None:
    fifo = tmp_path / "cuzkd.toml"
    os.mkfifo(fifo)
    reader = OffLoopReader(load_config, timeout=0.2)

    async def main() -> None:
        with pytest.raises(ConfigError, match=r"not read within 0.2s"):
            await reader.read(str(fifo))
        with pytest.raises(ConfigError, match="still not returned"):
            await reader.read(str(fifo))
        # A writer releases the hung read (empty file: the embedded-default engines).
        fd = os.open(fifo, os.O_WRONLY)
        os.close(fd)
        await asyncio.to_thread(lambda: wait_until(lambda: not _thread_alive(), 10, "the read"))
        fifo.unlink()
        fifo.write_text('[[engine]]\nname = "x"\n')
        assert [e.name for e in (await reader.read(str(fifo))).engine] == ["x"]

    asyncio.run(main())


def test_a_fifo_no_writer_ever_opens_does_not_block_later_reloads(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A reload's read of a FIFO ends by itself: once the FIFO is replaced by a regular file
    (or gone), the next reload reads it, instead of being refused for good behind a read blocked
    on a FIFO that no writer can open any more."""
    monkeypatch.setattr(configread, "READ_TIMEOUT", 0.2)
    config = tmp_path / "cuzkd.toml"
    os.mkfifo(config)
    reader = OffLoopReader(reload_config, timeout=5)

    async def main() -> None:
        with pytest.raises(ConfigError, match=r"cuzkd.toml: no writer sent it within 0.2s"):
            await reader.read(str(config))
        await asyncio.to_thread(lambda: wait_until(lambda: not _thread_alive(), 10, "the read"))
        config.unlink()
        config.write_text('[[engine]]\nname = "x"\n')
        assert [e.name for e in (await reader.read(str(config))).engine] == ["x"]

    asyncio.run(main())


def test_a_fifo_a_writer_fills_is_read_whole_by_a_reload(tmp_path: Path) -> None:
    config = tmp_path / "cuzkd.toml"
    os.mkfifo(config)
    body = '[[engine]]\nname = "x"\n' + "# padding\n" * 20_000  # more than a pipe holds

    async def main() -> None:
        read = asyncio.ensure_future(OffLoopReader(reload_config).read(str(config)))
        writer = await asyncio.to_thread(
            lambda: wait_until(lambda: _open_writer(config), 10, "the reload's read"))
        os.set_blocking(writer, True)
        await asyncio.to_thread(lambda: (os.write(writer, body.encode()), os.close(writer)))
        assert [e.name for e in (await read).engine] == ["x"]

    asyncio.run(main())


def test_a_read_that_returned_never_refuses_the_next() -> None:
    """Reloads back to back (a SIGHUP storm refused one in 200): the reading thread may still
    be winding down after it handed over the config; that read is over all the same. Its
    thread-local data's clean-up stands for that wind-down here."""
    local = threading.local()

    class SlowCleanup:
        def __del__(self) -> None:
            time.sleep(0.3)

    def load(path: str) -> str:
        local.left = SlowCleanup()
        return path

    async def main() -> None:
        reader = OffLoopReader(load)
        assert await reader.read("a") == "a"
        assert await reader.read("b") == "b"

    asyncio.run(main())


def _thread_alive() -> bool:
    return any(t.name == "config-read" for t in threading.enumerate())
