"""``cuzkd.supervisor.proc.leftovers``: which recorded processes may be signalled (real processes).

A group whose leader exited leaves a member behind, as a wrapper shell's engine does when the
supervisor is SIGKILLed; the identity rules must find it, and must refuse a record from another
boot, a pid now naming a different process, or a member started for another engine.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.supervisor_harness import pid_alive

from cuzkd.supervisor.proc import pids
from cuzkd.supervisor.proc.leftovers import GroupRecord, Records, leftovers
from cuzkd.supervisor.proc.pids import Proc

# A group leader that starts a member (a child in its group), reports the member's pid, exits.
_LEADER = """
import os, subprocess, sys
member = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
print(member.pid, flush=True)
"""


@pytest.fixture
def orphaned_group() -> Iterator[tuple[GroupRecord, Proc]]:
    """A record of a group whose leader is gone and whose member still runs."""
    leader = subprocess.Popen([sys.executable, "-c", _LEADER], stdout=subprocess.PIPE,
                              start_new_session=True, env={**os.environ, "CUZKD_ENGINE": "gpu0"})
    assert leader.stdout is not None
    member_pid = int(leader.stdout.readline())
    leader_stat = pids.stat(leader.pid)
    assert leader_stat is not None
    record = GroupRecord("gpu0", pids.boot_id(), leader.pid, leader_stat.start)
    leader.wait(10)
    member = pids.identify(member_pid)
    assert member is not None
    try:
        yield record, member
    finally:
        pids.send(member, signal.SIGKILL)


def test_member_of_an_orphaned_group_is_found(orphaned_group: tuple[GroupRecord, Proc]) -> None:
    record, member = orphaned_group
    assert leftovers(record, pids.boot_id()) == {member}


async def test_found_member_is_stopped(orphaned_group: tuple[GroupRecord, Proc]) -> None:
    record, member = orphaned_group
    assert await pids.stop(leftovers(record, pids.boot_id()), 5.0) == [member]
    assert not pid_alive(member.pid)


def test_record_from_another_boot_is_ignored(orphaned_group: tuple[GroupRecord, Proc]) -> None:
    record, _ = orphaned_group
    assert leftovers(record, "00000000-0000-0000-0000-000000000000") == set()


def test_member_started_for_another_engine_is_not_taken(
        orphaned_group: tuple[GroupRecord, Proc]) -> None:
    record, _ = orphaned_group
    other = GroupRecord("gpu1", record.boot_id, record.pgid, record.start)
    assert leftovers(other, record.boot_id) == set()


def test_reused_pid_is_never_signalled() -> None:
    stranger = subprocess.Popen(["sleep", "60"], start_new_session=True)
    try:
        st = pids.stat(stranger.pid)
        assert st is not None
        # the record's process started earlier: the pid now names another process
        reused = GroupRecord("gpu0", pids.boot_id(), stranger.pid, st.start - 1,
                             known=[(stranger.pid, st.start - 1)])
        assert leftovers(reused, pids.boot_id()) == set()
        assert not pids.send(Proc(stranger.pid, st.start - 1), signal.SIGKILL)
        assert stranger.poll() is None
    finally:
        stranger.kill()
        stranger.wait(10)


def test_records_round_trip_and_clear(tmp_path: Path) -> None:
    records = Records(tmp_path / "procs")
    rec = GroupRecord("gpu0", "boot", 123, 456, known=[(124, 457)])
    records.save(rec)
    records.save(GroupRecord("gpu1", "boot", 200, 1))
    (tmp_path / "procs" / "junk.json").write_bytes(b"\xff not json")
    assert sorted(records.load(), key=lambda r: r.engine) == [
        rec, GroupRecord("gpu1", "boot", 200, 1)]
    records.remove("gpu1", 200)
    assert records.load() == [rec]
    assert (tmp_path / "procs").stat().st_mode & 0o777 == 0o700
    records.clear()
    assert list((tmp_path / "procs").iterdir()) == []
