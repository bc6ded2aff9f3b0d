"""The pure rules of the release store and of /proc matching."""

from __future__ import annotations

import stat

import pytest

from cuzkd.swap import rules
from cuzkd.swap.inuse import Executable, FileIdentity, executes

RID = "0123456789abcdef"


def test_release_id_is_the_digest_prefix():
    digest = "ab" * 32
    assert rules.release_id(digest) == digest[:16]
    assert rules.is_release_id(rules.release_id(digest))


@pytest.mark.parametrize("name", [".tmp-x", "0123456789ABCDEF", "0123456789abcde", "current", ""])
def test_other_names_are_not_release_ids(name):
    assert not rules.is_release_id(name)


def test_link_targets_round_trip_and_nothing_else_is_adopted():
    assert rules.link_target(RID) == f"releases/{RID}"
    assert rules.parse_link_target(rules.link_target(RID)) == RID
    for foreign in (f"/abs/releases/{RID}", f"../releases/{RID}", "releases/.tmp-1", "releases/"):
        assert rules.parse_link_target(foreign) is None


@pytest.mark.parametrize(
    ("mode", "size", "problem"),
    [
        (stat.S_IFREG | 0o755, 10, None),
        (stat.S_IFREG | 0o700, 10, None),
        (stat.S_IFREG | 0o755, 0, "empty"),
        (stat.S_IFREG | 0o644, 10, "not executable"),
        (stat.S_IFDIR | 0o755, 10, "directory"),
        (stat.S_IFLNK | 0o777, 10, "symlink"),
        (stat.S_IFIFO | 0o755, 0, "not a regular file"),
    ],
)
def test_binary_problem(mode, size, problem):
    found = rules.binary_problem(mode, size)
    assert found is None if problem is None else problem in found


def test_select_prunable_keeps_the_newest_and_skips_protected():
    newest_first = ["e", "d", "c", "b", "a"]
    assert rules.select_prunable(newest_first, 2, set()) == ["c", "b", "a"]
    assert rules.select_prunable(newest_first, 2, {"b", "e"}) == ["c", "a"]
    assert rules.select_prunable(newest_first, 9, set()) == []
    assert rules.select_prunable(newest_first, 0, {"a"}) == ["e", "d", "c", "b"]
    with pytest.raises(ValueError, match="keep"):
        rules.select_prunable(newest_first, -1, set())


FILE = FileIdentity("/state/releases/x/cuzk", (1, 42))


@pytest.mark.parametrize(
    ("exe", "expected"),
    [
        (Executable(7, "/state/releases/x/cuzk", False, (1, 42)), True),
        (Executable(7, "/overlay/view/cuzk", False, (1, 42)), True),  # same inode, other path
        (Executable(7, "/state/releases/x/cuzk", False, (9, 9)), True),  # same path, other dev
        (Executable(7, "/state/releases/x/cuzk", False, None), True),
        (Executable(7, "/state/releases/x/cuzk", True, (1, 7)), False),  # deleted: not on disk
        (Executable(7, "/state/releases/x/cuzk", True, None), False),
        (Executable(7, "/usr/bin/cat", False, (1, 7)), False),
    ],
)
def test_executes_matches_by_inode_or_by_a_live_path(exe, expected):
    assert executes(exe, FILE) is expected
