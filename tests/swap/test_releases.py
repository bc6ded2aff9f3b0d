"""The release store on real files: install, activate, rollback, refusals, pruning, recovery."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from cuzkd.errors import ReleaseError
from cuzkd.swap.releases import Release, ReleaseStore


def snapshot(root: Path) -> dict[str, object]:
    """Every entry under ``root`` with what identifies it (link text, bytes, mode, mtime)."""
    if not root.exists():
        return {}
    found: dict[str, object] = {}
    for path in sorted(root.rglob("*")):
        st = path.lstat()
        if path.is_symlink():
            found[str(path)] = ("link", str(path.readlink()))
        elif path.is_dir():
            found[str(path)] = ("dir", st.st_mode, st.st_mtime_ns)
        else:
            found[str(path)] = ("file", path.read_bytes(), st.st_mode, st.st_mtime_ns)
    return found


def run(binary: Path | str) -> str:
    return subprocess.run([binary], check=True, capture_output=True, text=True).stdout.strip()


def test_install_copies_into_a_content_addressed_release(store, make_script):
    source = make_script("v1")
    release = store.install(source)
    assert len(release.id) == 16
    assert release.binary == store.state_dir / "releases" / release.id / "cuzk"
    assert release.binary.is_absolute()
    assert release.binary.read_bytes() == source.read_bytes()
    assert release.binary.stat().st_mode & 0o777 == 0o755
    assert store.releases() == [release]
    assert store.active() is None
    assert run(release.binary) == "v1"


def test_install_same_content_twice_reuses_the_release(store, make_script, tmp_path):
    source = make_script("v1")
    first = store.install(source)
    twin = tmp_path / "elsewhere" / "cuzk"
    twin.parent.mkdir()
    twin.write_bytes(source.read_bytes())
    twin.chmod(0o700)
    assert store.install(twin) == first
    assert store.install(source) == first
    assert [p.name for p in (store.state_dir / "releases").iterdir()] == [first.id]


def test_release_is_a_copy_unaffected_by_later_writes_to_the_source(store, make_script):
    source = make_script("v1")
    release = store.install(source)
    source.write_text("#!/bin/sh\necho overwritten\n")
    assert run(release.binary) == "v1"
    assert store.install(source).id != release.id


def test_activate_flips_current_with_a_relative_link_and_remembers_previous(
    store, make_script
):
    one, two = store.install(make_script("v1")), store.install(make_script("v2"))
    assert store.activate(one) is None
    assert store.active() == one
    assert store.previous() is None
    assert store.activate(two) == one
    assert os.readlink(store.state_dir / "current") == f"releases/{two.id}"
    assert os.readlink(store.state_dir / "previous") == f"releases/{one.id}"
    assert (store.active(), store.previous()) == (two, one)
    assert run(store.active_binary()) == "v2"
    assert store.active_binary() == os.path.realpath(two.binary)


def test_activating_the_active_release_keeps_previous(store, make_script):
    one, two = store.install(make_script("v1")), store.install(make_script("v2"))
    store.activate(one)
    store.activate(two)
    assert store.activate(two) == two
    assert (store.active(), store.previous()) == (two, one)


def test_rollback_swaps_current_and_previous_and_survives_a_restart(store, make_script):
    one, two = store.install(make_script("v1")), store.install(make_script("v2"))
    store.activate(one)
    store.activate(two)
    restarted = ReleaseStore(store.state_dir)
    restarted.recover()
    assert restarted.rollback() == one
    assert (restarted.active(), restarted.previous()) == (one, two)
    assert run(restarted.active_binary()) == "v1"
    assert restarted.rollback() == two


def test_rollback_without_previous_is_refused(store, make_script):
    with pytest.raises(ReleaseError, match="no previous release"):
        store.rollback()
    store.activate(store.install(make_script("v1")))
    with pytest.raises(ReleaseError, match="no previous release"):
        store.rollback()


def test_active_binary_without_a_release_is_refused(store):
    with pytest.raises(ReleaseError, match="no active release"):
        store.active_binary()


def test_activating_a_release_that_is_not_installed_is_refused(store, make_script):
    store.activate(store.install(make_script("v1")))
    before = snapshot(store.state_dir)
    ghost = Release("0123456789abcdef", store.state_dir / "releases" / "0123456789abcdef" / "x")
    with pytest.raises(ReleaseError, match="not installed"):
        store.activate(ghost)
    assert snapshot(store.state_dir) == before


def _missing(tmp_path: Path) -> Path:
    return tmp_path / "no-such-binary"


def _empty(tmp_path: Path) -> Path:
    path = tmp_path / "empty"
    path.touch(mode=0o755)
    return path


def _not_executable(tmp_path: Path) -> Path:
    path = tmp_path / "plain"
    path.write_text("#!/bin/sh\necho hi\n")
    path.chmod(0o644)
    return path


def _directory(tmp_path: Path) -> Path:
    path = tmp_path / "a-directory"
    path.mkdir()
    return path


def _symlink_to_valid(tmp_path: Path) -> Path:
    target = tmp_path / "real-binary"
    target.write_text("#!/bin/sh\necho hi\n")
    target.chmod(0o755)
    link = tmp_path / "link-to-binary"
    link.symlink_to(target)
    return link


def _dangling_symlink(tmp_path: Path) -> Path:
    link = tmp_path / "dangling"
    link.symlink_to(tmp_path / "nowhere")
    return link


def _fifo(tmp_path: Path) -> Path:
    path = tmp_path / "fifo"
    os.mkfifo(path, 0o755)
    return path


@pytest.mark.parametrize(
    ("make_bad", "problem"),
    [
        (_missing, "no such file"),
        (_empty, "is empty"),
        (_not_executable, "not executable"),
        (_directory, "is a directory"),
        (_symlink_to_valid, "is a symlink"),
        (_dangling_symlink, "is a symlink"),
        (_fifo, "not a regular file"),
    ],
)
@pytest.mark.parametrize("populated", [False, True])
def test_refused_sources_name_the_problem_and_change_nothing(
    store, make_script, tmp_path, make_bad, problem, populated
):
    if populated:
        store.activate(store.install(make_script("v1")))
    bad = make_bad(tmp_path)
    before = snapshot(store.state_dir)
    with pytest.raises(ReleaseError) as refused:
        store.validate_source(bad)
    assert str(bad) in str(refused.value)
    assert problem in str(refused.value)
    with pytest.raises(ReleaseError, match=problem):
        store.install(bad)
    assert snapshot(store.state_dir) == before


def test_prune_keeps_the_newest_and_never_active_or_previous(store, make_script):
    a, b, c, d, e = (store.install(make_script(tag)) for tag in "abcde")
    store.activate(a)
    store.activate(b)  # active b, previous a: both the oldest installs
    assert store.releases()[:2] == [b, a]  # activation counts as recent
    assert store.prune(keep=3) == [d, c]
    assert store.releases() == [b, a, e]
    assert store.prune(keep=0) == [e]
    assert store.releases() == [b, a]
    assert not any(p.name.startswith(".tmp-") for p in (store.state_dir / "releases").iterdir())


def test_prune_order_survives_a_restart(store, make_script):
    sources = [make_script(tag) for tag in ("old", "mid", "new")]
    old, mid, new = (store.install(source) for source in sources)
    assert store.install(sources[0]) == old  # re-installing counts as recent
    restarted = ReleaseStore(store.state_dir)
    assert restarted.releases() == [old, new, mid]
    assert restarted.prune(keep=2) == [mid]


def test_negative_keep_is_refused(store, make_script):
    store.install(make_script("v1"))
    with pytest.raises(ValueError, match="keep"):
        store.prune(keep=-1)


def test_recover_on_a_fresh_directory_creates_the_layout(store):
    store.recover()
    assert (store.state_dir / "releases").is_dir()
    assert store.active() is None
    assert store.releases() == []


def test_recover_falls_back_to_previous_when_current_is_gone(store, make_script):
    one, two = store.install(make_script("v1")), store.install(make_script("v2"))
    store.activate(one)
    store.activate(two)
    (two.binary).unlink()  # an incomplete release directory
    with pytest.raises(ReleaseError, match="not a complete release"):
        store.active()
    store.recover()
    assert store.active() == one
    assert store.previous() is None


def test_recover_removes_current_when_nothing_is_usable(store, make_script):
    one, two = store.install(make_script("v1")), store.install(make_script("v2"))
    store.activate(one)
    store.activate(two)
    for release in (one, two):
        release.binary.chmod(0o644)
    store.recover()
    assert not (store.state_dir / "current").is_symlink()
    assert not (store.state_dir / "previous").is_symlink()
    assert store.active() is None


def test_recover_drops_an_unusable_previous_and_keeps_current(store, make_script):
    one, two = store.install(make_script("v1")), store.install(make_script("v2"))
    store.activate(one)
    store.activate(two)
    os.truncate(one.binary, 0)
    store.recover()
    assert store.active() == two
    assert store.previous() is None


def test_recover_removes_only_temporary_entries(store, make_script):
    store.activate(store.install(make_script("v1")))
    store.recover()  # the first recovery adds the active release to the history
    (store.state_dir / ".tmp-link").symlink_to("releases/0123456789abcdef")
    (store.state_dir / "releases" / ".tmp-staging").mkdir()
    (store.state_dir / "releases" / ".tmp-staging" / "cuzk").write_text("half")
    (store.state_dir / "operator-notes.txt").write_text("keep me")
    kept = snapshot(store.state_dir)
    store.recover()
    assert not (store.state_dir / ".tmp-link").is_symlink()
    assert not (store.state_dir / "releases" / ".tmp-staging").exists()
    after = snapshot(store.state_dir)
    releases_dir = str(store.state_dir / "releases")  # its mtime changes with the removal
    assert {k: v for k, v in kept.items() if ".tmp-" not in k and k != releases_dir} == {
        k: v for k, v in after.items() if k != releases_dir
    }


def test_a_current_that_is_not_a_symlink_is_reported_not_replaced(store):
    store.recover()
    (store.state_dir / "current").write_text("operator file")
    with pytest.raises(ReleaseError, match="not a symlink"):
        store.recover()
    assert (store.state_dir / "current").read_text() == "operator file"


def test_a_path_with_a_nul_byte_is_refused_not_raised(store):
    # It arrives from the control API's JSON; a ValueError would become a 500.
    with pytest.raises(ReleaseError, match="not a valid path"):
        store.validate_source(Path("/opt/cuzk\0x"))


def accepted(store: ReleaseStore, release: Release) -> None:
    """Activated and accepted, with the history records a swap writes."""
    store.put_in_service(release, "swap")
    store.activate(release)
    store.judge(release, "accepted", "healthy")


def test_recover_discards_the_releases_never_accepted_unless_pinned(store, make_elf):
    """What a refused or interrupted swap left in ``releases/`` (no history record: the
    supervisor died during the smoke test; ``rejected``: refused before its activation) goes
    at the next start; accepted releases, ``current``, ``previous`` and a release a process
    still executes stay."""
    old, prev, cur, smoked, orphan, running = (store.install(make_elf(tag)) for tag in (
        "old", "prev", "cur", "smoked", "orphan", "running"))
    for release in (old, prev, cur):
        accepted(store, release)
    for release in (smoked, running):
        store.put_in_service(release, "swap")
        store.judge(release, "rejected", "smoke test ended with exit_3")
    executing = subprocess.Popen([running.binary], stdin=subprocess.PIPE)  # cat: waits
    try:
        ReleaseStore(store.state_dir).recover()
        assert {r.id for r in store.releases()} == {old.id, prev.id, cur.id, running.id}
    finally:
        executing.communicate(b"")
    assert not smoked.binary.parent.exists() and not orphan.binary.parent.exists()
    assert (store.active(), store.previous()) == (cur, prev)
    assert not any(p.name.startswith(".tmp-") for p in (store.state_dir / "releases").iterdir())

    # A history set aside as unreadable knows no release: nothing goes on its word.
    kept = store.install(make_elf("kept"))
    (store.state_dir / "history.json").write_text("{not json")
    restarted = ReleaseStore(store.state_dir)
    restarted.recover()
    assert kept in restarted.releases()
