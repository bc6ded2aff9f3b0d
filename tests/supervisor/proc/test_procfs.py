"""The supervisor's ``/proc`` readers on a fixture tree (``proc_root``): what each returns.

The real-``/proc`` tests (test_leftover_records.py, test_orphans.py) show
the readers agree with the kernel; these show the cases the kernel will not produce on demand:
a command name with spaces and parentheses, a pid that is gone, a field that does not parse, a
zombie, a boot id missing or empty, a process tree across threads.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from support.proc_tree import FIRST_FAKE_PID, ProcTree

from cuzkd.supervisor.proc import pids
from cuzkd.supervisor.proc.leftovers import GroupRecord, leftovers
from cuzkd.supervisor.proc.pids import Proc, Stat
from cuzkd.supervisor.proc.tree import children, descendants

A, B, C, D = (FIRST_FAKE_PID + n for n in range(1, 5))


@pytest.fixture
def tree(tmp_path: Path) -> ProcTree:
    return ProcTree(tmp_path / "proc")


def test_a_command_name_with_spaces_and_parentheses_does_not_shift_the_fields(
        tree: ProcTree) -> None:
    tree.process(A, comm="a) (b c) d", state="R", ppid=B, pgrp=C, start=4242)
    assert pids.stat(A, proc_root=tree.root) == Stat(state="R", ppid=B, pgrp=C, start=4242)
    assert pids.identify(A, proc_root=tree.root) == Proc(A, 4242)
    assert pids.alive(Proc(A, 4242), proc_root=tree.root)
    assert not pids.alive(Proc(A, 4241), proc_root=tree.root)  # the pid names another process


def test_a_missing_pid_reads_as_gone(tree: ProcTree) -> None:
    assert pids.stat(A, proc_root=tree.root) is None
    assert pids.identify(A, proc_root=tree.root) is None
    assert not pids.alive(Proc(A, 1000), proc_root=tree.root)
    assert pids.engine_of(A, proc_root=tree.root) is None
    assert children(A, proc_root=tree.root) == []
    assert descendants(A, proc_root=tree.root) == []


@pytest.mark.parametrize("line", [
    f"{A} (engine) S 1 {A} {A} 0 -1 4194304 0 0 0 0 0 0 0 0 20 0 1 0 soon 12345",  # start
    f"{A} (engine) S one {A} {A}" + " 0" * 17,  # ppid
    f"{A} (engine) S 1 {A}",  # cut short
    "",
])
def test_an_unreadable_field_reads_as_gone(tree: ProcTree, line: str) -> None:
    tree.process(A)
    tree.write_stat(A, line)
    assert pids.stat(A, proc_root=tree.root) is None
    assert pids.identify(A, proc_root=tree.root) is None


@pytest.mark.parametrize("state", ["Z", "X"])
def test_a_dead_process_has_a_stat_but_no_identity(tree: ProcTree, state: str) -> None:
    tree.process(A, state=state, start=7)
    assert pids.stat(A, proc_root=tree.root) == Stat(state=state, ppid=1, pgrp=A, start=7)
    assert pids.identify(A, proc_root=tree.root) is None


def test_the_boot_id_is_stripped_and_absent_when_empty_or_missing(tree: ProcTree) -> None:
    assert pids.boot_id(proc_root=tree.root) is None
    tree.boot_id("\n")
    assert pids.boot_id(proc_root=tree.root) is None
    tree.boot_id("6d1c3f0e-0b4d-4f7e-9d2a-1f6c1c2b3a4d\n")
    assert pids.boot_id(proc_root=tree.root) == "6d1c3f0e-0b4d-4f7e-9d2a-1f6c1c2b3a4d"


def test_the_engine_mark_is_read_from_the_environment(tree: ProcTree) -> None:
    tree.process(A, environ={"PATH": "/bin", "CUZKD_ENGINE": "gpu0", "X": "CUZKD_ENGINE=no"})
    tree.process(B, environ={"PATH": "/bin"})
    tree.process(C)  # no environ file: unreadable
    assert pids.engine_of(A, proc_root=tree.root) == "gpu0"
    assert pids.engine_of(B, proc_root=tree.root) is None
    assert pids.engine_of(C, proc_root=tree.root) is None


def test_the_tree_walk_reads_every_threads_children(tree: ProcTree) -> None:
    tree.process(A, children={A: [B], A + 100: [C]})  # a child forked by a second thread
    tree.process(B, ppid=A, children={B: [D]})
    tree.process(C, ppid=A, children={C: []})
    tree.process(D, ppid=B, state="Z", children={D: []})
    assert sorted(children(A, proc_root=tree.root)) == [B, C]
    assert sorted(descendants(A, proc_root=tree.root)) == [B, C, D]
    # the zombie is a descendant but has no identity any more
    assert pids.with_descendants([Proc(A, 1000), Proc(C, 999)], proc_root=tree.root) == {
        Proc(A, 1000), Proc(B, 1000), Proc(C, 1000)}


def test_adopted_children_are_those_not_known_with_their_engine(tree: ProcTree) -> None:
    me = os.getpid()
    tree.process(me, children={me: [A, B, C]})
    tree.process(A, ppid=me, environ={"CUZKD_ENGINE": "gpu0"})  # an engine: known
    tree.process(B, ppid=me, environ={"CUZKD_ENGINE": "gpu1"})
    tree.process(C, ppid=me, state="Z")
    assert pids.adopted({A}, proc_root=tree.root) == {Proc(B, 1000): "gpu1"}


def test_leftovers_of_a_record_on_a_fixture_tree(tree: ProcTree) -> None:
    boot = "6d1c3f0e-0b4d-4f7e-9d2a-1f6c1c2b3a4d"
    # the leader A is gone; B stayed in its group, C too but was started for another engine,
    # D is a descendant the supervisor had noted
    tree.process(B, pgrp=A, start=1001, environ={"CUZKD_ENGINE": "gpu0"}, children={B: []})
    tree.process(C, pgrp=A, start=1002, environ={"CUZKD_ENGINE": "gpu1"}, children={C: []})
    tree.process(D, start=1003, children={D: []})
    record = GroupRecord("gpu0", boot, A, 1000, known=[(D, 1003)])
    assert leftovers(record, boot, proc_root=tree.root) == {Proc(B, 1001), Proc(D, 1003)}
    assert leftovers(record, "another boot", proc_root=tree.root) == set()
    tree.process(A, start=5000, children={A: []})  # the leader's pid now names another process
    assert leftovers(record, boot, proc_root=tree.root) == {Proc(D, 1003)}
