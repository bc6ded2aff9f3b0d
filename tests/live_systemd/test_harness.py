"""The harness leaves nothing behind: no process, no cgroup, on every way out of a test."""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

import pytest
from support import systemd as harness
from support.waiting import wait_until


@pytest.fixture(autouse=True)
def _namespaces() -> None:
    reason = harness.namespaces_unavailable()
    if reason is not None:
        print(f"\nlive systemd tests skipped: {reason}", file=sys.stderr)
        pytest.skip(reason)


def _start_sleeper(machine: harness.Machine) -> int:
    """A service of the machine's own: a process that would outlive a careless clean-up."""
    machine.run("systemd-run", "--unit=sleeper", "sleep", "infinity")
    main = wait_until(lambda: int(machine.show("sleeper.service", "MainPID")["MainPID"]), 10,
                      "the sleeper's main PID")
    return machine.host_pid(int(main))


def _assert_gone(pids: list[int], cgroups: list[Path]) -> None:
    assert not [pid for pid in pids if Path(f"/proc/{pid}").exists()]
    assert not [path for path in cgroups if path.exists()]


def test_a_normal_exit_leaves_nothing(tmp_path: Path) -> None:
    with harness.booted_systemd(tmp_path, harness.boot_payload()) as machine:
        pids = [machine.pid1, _start_sleeper(machine)]
        cgroups = list(machine.cgroups.dirs)
        assert all(path.exists() for path in cgroups)
    _assert_gone(pids, cgroups)


def test_a_failing_test_body_leaves_nothing(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError, match="test body failed"), \
            harness.booted_systemd(tmp_path, harness.boot_payload()) as machine:
        pids = [machine.pid1, _start_sleeper(machine)]
        cgroups = list(machine.cgroups.dirs)
        raise RuntimeError("test body failed")
    _assert_gone(pids, cgroups)


def test_a_pid1_that_does_not_power_off_is_killed(tmp_path: Path) -> None:
    with harness.booted_systemd(tmp_path, harness.boot_payload(),
                                poweroff_timeout=1) as machine:
        pids = [machine.pid1, _start_sleeper(machine)]
        cgroups = list(machine.cgroups.dirs)
        # A stopped PID 1 cannot act on SIGRTMIN+4; only the SIGKILL that follows ends it.
        os.kill(machine.pid1, signal.SIGSTOP)
    _assert_gone(pids, cgroups)
