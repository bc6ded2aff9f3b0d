"""Releases that real processes execute: the "Text file busy" case and /proc/PID/exe scanning."""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from cuzkd.swap import inuse
from cuzkd.swap.releases import ReleaseStore, release_of_pid


@contextmanager
def running(binary: Path | str) -> Iterator[subprocess.Popen[bytes]]:
    """Run ``binary`` (a copy of cat) until the block ends; it waits on its stdin.

    Popen returns only after exec succeeded, so /proc/PID/exe already names ``binary``.
    """
    proc = subprocess.Popen([binary], stdin=subprocess.PIPE, stdout=subprocess.DEVNULL)
    try:
        yield proc
    finally:
        assert proc.stdin is not None
        proc.stdin.close()
        proc.wait(timeout=10)


def test_a_release_in_use_survives_prune_until_its_process_exits(store, make_elf):
    old = store.install(make_elf("old"))
    store.activate(old)
    with running(store.active_binary()) as proc:
        assert release_of_pid(proc.pid, store) == old.id
        with pytest.raises(OSError) as busy:  # what copying over it would hit
            old.binary.open("r+b")
        assert busy.value.errno == errno.ETXTBSY
        mid, new = store.install(make_elf("mid")), store.install(make_elf("new"))
        store.activate(mid)
        store.activate(new)  # old is now neither active nor previous
        assert store.prune(keep=1) == []
        assert old.binary.is_file()
        assert release_of_pid(proc.pid, store) == old.id
    assert release_of_pid(proc.pid, store) is None
    assert store.prune(keep=1) == [old]
    assert not old.binary.parent.exists()
    assert {r.id for r in store.releases()} == {mid.id, new.id}


def test_spawning_through_current_is_recognised_as_the_release(store, make_elf):
    release = store.install(make_elf("v1"))
    store.activate(release)
    with running(store.state_dir / "current" / "cuzk") as proc:
        assert release_of_pid(proc.pid, store) == release.id


def test_processes_outside_the_store_map_to_no_release(store, make_elf):
    store.install(make_elf("v1"))
    with running(shutil.which("cat") or "cat") as proc:
        assert release_of_pid(proc.pid, store) is None


def test_a_deleted_executable_protects_nothing_and_does_not_break_the_scan(
    store: ReleaseStore, make_elf
):
    source = make_elf("v1")
    first = store.install(source)
    with running(first.binary) as proc:
        shutil.rmtree(first.binary.parent)  # someone removed it behind the store's back
        again = store.install(source)  # same path again, but a new file
        assert again.binary == first.binary
        exe = inuse.executable_of(proc.pid)
        assert exe is not None
        assert exe.deleted
        assert exe.path == str(first.binary)
        assert release_of_pid(proc.pid, store) is None
        assert store.prune(keep=0) == [again]


def test_a_pid_that_does_not_exist_maps_to_no_release(store, make_elf):
    store.install(make_elf("v1"))
    proc = subprocess.Popen(["true"])
    proc.wait()  # reaped: the pid is free
    assert release_of_pid(proc.pid, store) is None
    assert inuse.executable_of(proc.pid) is None


def test_the_scan_sees_this_process_and_its_children(make_elf):
    binary = make_elf("scan")
    with running(binary) as proc:
        found = {exe.pid: exe for exe in inuse.running_executables()}
    assert found[proc.pid].path == str(binary)
    assert not found[proc.pid].deleted
    assert found[os.getpid()].key == inuse.identify(Path(sys.executable)).key


def test_a_zombie_pins_nothing_and_does_not_break_the_scan(store, make_elf):
    release = store.install(make_elf("v1"))
    proc = subprocess.Popen([release.binary], stdin=subprocess.DEVNULL)
    try:
        os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOWAIT)  # exited, not reaped: a zombie
        assert inuse.executable_of(proc.pid) is None
        assert release_of_pid(proc.pid, store) is None
        assert store.prune(keep=0) == [release]
    finally:
        proc.wait()
