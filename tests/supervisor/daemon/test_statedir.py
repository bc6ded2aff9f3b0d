"""The state-dir and control-socket locks: one owner each, and no symlink in the state dir can
redirect their writes."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

import pytest
from support.supervisor_harness import start_supervisor, write_config

from cuzkd.errors import StateDirBusy
from cuzkd.supervisor.daemon.statedir import StateDirLock


def test_second_owner_is_refused_naming_the_first(tmp_path: Path) -> None:
    first = StateDirLock(tmp_path / "state")
    first.acquire()
    try:
        with pytest.raises(StateDirBusy, match=f"pid {os.getpid()}"):
            StateDirLock(tmp_path / "state").acquire()
    finally:
        first.release()
    StateDirLock(tmp_path / "state").acquire()  # free again once released


def test_a_planted_pid_file_symlink_is_not_followed(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    state = tmp_path / "state"
    state.mkdir()
    (state / "cuzkd.pid").symlink_to(victim)
    with pytest.raises(OSError):
        StateDirLock(state).acquire()
    assert victim.read_text() == "precious\n"  # not truncated, not overwritten with our pid


def test_a_second_supervisor_on_the_same_control_socket_is_refused(tmp_path: Path) -> None:
    """Different state dirs, one control socket: the second must not unlink and take the
    first's socket over."""
    control = tmp_path / "run" / "cuzkd.sock"
    first_dir, second_dir = tmp_path / "one", tmp_path / "two"
    first_dir.mkdir()
    second_dir.mkdir()
    engines = [{"name": "a", "command": ["sleep", "600"], "stop_timeout": "2s"}]
    first = start_supervisor(write_config(first_dir, engines,
                                          supervisor={"control_socket": str(control)}))
    try:
        inode = control.stat().st_ino
        second = subprocess.run(
            [sys.executable, "-m", "cuzkd", "run", "--config",
             str(write_config(second_dir, engines, supervisor={"control_socket": str(control)}))],
            capture_output=True, text=True, timeout=60)
        assert second.returncode == 1
        assert f"another cuzkd (pid {first.proc.pid}) is running with control_socket " \
               f"{control}" in second.stdout + second.stderr
        assert control.stat().st_ino == inode
        assert first.about()["pid"] == first.proc.pid
    finally:
        assert first.stop() == 0


def _under_readonly_mount(mountpoint: Path, argv: list[str],
                          env: Mapping[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run ``argv`` in a mount namespace of its own where ``mountpoint`` is a read-only tmpfs
    (EROFS for every write, for root too; a user namespace when not root). Skips the test
    where the kernel or the container lends no mount namespace."""
    unshare = ["unshare", "--mount"] + ([] if os.geteuid() == 0 else ["--map-root-user"])
    mount = 'mount -t tmpfs -o ro tmpfs "$0" || exit 111; exec "$@"'
    done = subprocess.run([*unshare, "sh", "-c", mount, str(mountpoint), *argv],
                          capture_output=True, text=True, timeout=60, env=env)
    if done.returncode == 111 or "unshare:" in done.stderr:
        pytest.skip(f"no read-only mount here: {done.stderr.strip()}")
    return done


@pytest.mark.parametrize("set_in_file", [True, False])
def test_a_read_only_state_dir_is_a_config_error_naming_key_file_and_need(
        tmp_path: Path, set_in_file: bool) -> None:
    """Not ``[Errno 30] Read-only file system: '.../ro'`` and exit 1: the file, the key (or
    that the default was used), the directory, and what cuzkd needs; exit 78."""
    ro = tmp_path / "ro"
    ro.mkdir()
    state = ro if set_in_file else ro / "cuzkd"
    config = write_config(tmp_path, [{"name": "a", "command": ["sleep", "600"]}],
                          supervisor={"state_dir": str(state) if set_in_file else ""})
    env = {**os.environ, "STATE_DIRECTORY": str(state)}
    done = _under_readonly_mount(ro, [sys.executable, "-m", "cuzkd", "run", "--config",
                                      str(config)], env)
    out = done.stdout + done.stderr
    assert done.returncode == 78, out
    key = ("key `supervisor.state_dir`: " if set_in_file
           else f"key `supervisor.state_dir` (unset: the default state dir, {state}): ")
    assert f"{config}: {key}cannot write {state}: Read-only file system" in out, out
    assert "needs a writable directory owned by the user it runs as" in out
    assert "StateDirectory=" in out
