"""The release history: its rules (pure), its file (durable, hostile content) and the store.

The scenario the history exists for: a swap to a crashing release is rolled back, after which
``previous`` names the crashing release. A rollback must go to the last *accepted* release.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from cuzkd.errors import HistoryError, ReleaseError
from cuzkd.swap import history
from cuzkd.swap.history import Record, ReleaseVerdict
from cuzkd.swap.historyfile import HistoryFile
from cuzkd.swap.releases import ReleaseStore


def rec(release: str, verdict: ReleaseVerdict = ReleaseVerdict.ACCEPTED, **fields) -> Record:
    return Record(release=release, binary="cuzk", origin="swap", activated_at=1.0,
                  verdict=verdict, **fields)


# -- rules ---------------------------------------------------------------------------------


def test_rollback_skips_the_rejected_release_a_failed_swap_left_behind():
    # v1 accepted, v2 accepted, v3 crashed (rejected) and the swap flipped back to v2.
    records = [rec("v1"), rec("v2"), rec("v3", "rejected")]
    assert history.rollback_target(records, "v2", {"v1", "v2", "v3"}) == "v1"
    # Only v1, then a crashing v2 rolled back to v1: there is nothing good before v1.
    assert history.rollback_target([rec("v1"), rec("v2", "rejected")], "v1", {"v1", "v2"}) is None


def test_rollback_target_skips_pending_and_uninstalled_releases():
    records = [rec("v0"), rec("v1"), rec("v2", "pending"), rec("v3")]
    assert history.rollback_target(records, "v3", {"v0", "v1", "v2", "v3"}) == "v1"
    assert history.rollback_target(records, "v3", {"v0", "v2", "v3"}) == "v0"


def test_a_rollback_steps_further_back_instead_of_toggling():
    records = [rec("v1"), rec("v2"), rec("v3")]
    # After rolling back from v3 to v2, v3 is rejected; the next rollback goes to v1.
    records = history.decide(records, "v3", "rejected", "rolled back", now=5.0)
    assert history.rollback_target(records, "v2", {"v1", "v2", "v3"}) == "v1"


def test_swapping_a_release_in_again_moves_it_to_the_end_on_trial():
    records = history.put_in_service([rec("v1"), rec("v2")], "v1", "cuzk", "swap", now=9.0)
    assert [(r.release, r.verdict, r.activated_at) for r in records] == [
        ("v2", "accepted", 1.0), ("v1", "pending", 9.0)]
    assert history.rollback_target(records, "v1", {"v1", "v2"}) == "v2"


def test_an_active_release_without_a_record_has_every_record_before_it():
    assert history.rollback_target([rec("v1"), rec("v2")], "v9", {"v1", "v2", "v9"}) == "v2"


def test_pruning_protects_the_two_newest_accepted_and_the_rollback_target():
    records = [rec("v1"), rec("v2"), rec("v3", "rejected"), rec("v4"), rec("v5", "rejected")]
    assert history.protected(records, "v4", {"v1", "v2", "v3", "v4", "v5"}) == {"v2", "v4"}
    # Rolled back to v2 (v4 rejected): v1 is where the next rollback goes.
    records = history.decide(records, "v4", "rejected", "rolled back", now=2.0)
    assert history.protected(records, "v2", {"v1", "v2", "v4"}) == {"v1", "v2"}


def test_reconcile_rejects_interrupted_trials_and_records_an_unknown_active_release():
    records = [rec("v1"), rec("v2", "pending")]
    after = history.reconcile(records, "v1", "cuzk", now=7.0)
    assert after[1].verdict == "rejected" and "interrupted" in (after[1].reason or "")
    assert history.reconcile(records, "v2", "cuzk", now=7.0) == records  # still on trial
    fresh = history.reconcile([], "v9", "cuzk", now=7.0)
    assert [(r.release, r.origin, r.verdict) for r in fresh] == [("v9", "recovered", "pending")]


def test_trim_drops_the_oldest_records_of_removed_releases_first():
    records = [rec(f"r{i}") for i in range(6)]
    kept = history.trim(records, installed={"r0", "r5"}, limit=3)
    assert [r.release for r in kept] == ["r0", "r4", "r5"]
    assert len(history.trim(records, installed={f"r{i}" for i in range(6)}, limit=3)) == 3


def test_encoding_round_trips_names_that_are_not_utf8_and_keeps_analysis():
    odd = os.fsdecode(b"cuzk-\xff\xfe")  # a file name that is not UTF-8 (surrogate escapes)
    records = [Record(release="v1", binary=odd, origin="initial_binary", activated_at=1.5,
                      verdict="rejected", decided_at=2.5,
                      reason="engine gpu0: exit_1 \u2013 \udcff",
                      analysis={"canary": {"score": 0.97, "verdict": "pass"}})]
    data = history.encode(records)
    data.decode("ascii")  # plain ASCII on disk
    assert history.decode(data) == records


@pytest.mark.parametrize(("data", "problem"), [
    (b'{"format": 1, "records": [{"release": "v1", "bin', "truncated or damaged"),
    (b"", "truncated or damaged"),
    (b'{"format": 1, "records": [{"release": "v\xff"}]}', "not UTF-8 (byte 0xff at offset 40)"),
    (b'{"format": 2, "records": []}', "unknown format 2"),
    (b'{"format": 1, "records": [{"release": 5}]}', "not a release history"),
    (b'[1, 2]', "not a release history"),
])
def test_damaged_history_bytes_are_a_clear_error(data, problem):
    with pytest.raises(HistoryError, match=re.escape(problem)):
        history.decode(data)


# -- the file ------------------------------------------------------------------------------


def test_a_save_replaces_the_file_whole_and_leaves_no_temporary(tmp_path):
    file = HistoryFile(tmp_path / "history.json")
    assert file.records() == []
    file.save([rec("v1")])
    file.save([rec("v1"), rec("v2")])
    assert [p.name for p in tmp_path.iterdir()] == ["history.json"]
    assert HistoryFile(tmp_path / "history.json").records() == [rec("v1"), rec("v2")]


def test_a_history_that_is_a_symlink_or_a_fifo_is_refused_without_blocking(tmp_path):
    real = tmp_path / "elsewhere.json"
    real.write_bytes(history.encode([rec("v1")]))
    (tmp_path / "link.json").symlink_to(real)
    with pytest.raises(HistoryError, match=re.escape("link.json: is a symlink")):
        HistoryFile(tmp_path / "link.json").records()
    os.mkfifo(tmp_path / "fifo.json")
    with pytest.raises(HistoryError, match=re.escape("fifo.json: not a regular file")):
        HistoryFile(tmp_path / "fifo.json").records()


def test_an_oversized_history_is_refused(tmp_path):
    path = tmp_path / "history.json"
    with path.open("wb") as out:
        out.truncate(5 << 20)
    with pytest.raises(HistoryError, match="larger than"):
        HistoryFile(path).records()


# -- the store -----------------------------------------------------------------------------


def seeded(store: ReleaseStore, make, *tags: str) -> dict[str, object]:
    """Releases put into service and accepted in order, the last one active."""
    releases = {}
    for tag in tags:
        release = store.install(make(tag))
        store.put_in_service(release, "swap")
        store.activate(release)
        store.judge(release, "accepted", "healthy")
        releases[tag] = release
    return releases


def test_recovery_sets_a_torn_history_aside_and_the_store_stays_usable(store, make_script):
    rel = seeded(store, make_script, "v1", "v2")
    path = store.state_dir / "history.json"
    torn = path.read_bytes()[:40]  # as a failing disk or a hand edit could leave it
    path.write_bytes(torn)

    restarted = ReleaseStore(store.state_dir)
    with pytest.raises(ReleaseError, match=re.escape("history.json: not valid JSON")):
        restarted.history()
    restarted.recover()

    [aside] = [p for p in store.state_dir.iterdir() if ".unreadable-" in p.name]
    assert aside.read_bytes() == torn  # kept for the operator
    assert [(r.release, r.origin, r.verdict) for r in restarted.history()] == [
        (rel["v2"].id, "recovered", "pending")]
    assert restarted.active() == rel["v2"]
    assert restarted.rollback_target() is None  # no guessing: v1 is not known to be good


def test_recovery_tolerates_a_history_that_is_not_utf8(store, make_script):
    seeded(store, make_script, "v1")
    (store.state_dir / "history.json").write_bytes(b"\xff\xfe{\x00")
    restarted = ReleaseStore(store.state_dir)
    restarted.recover()
    assert [r.verdict for r in restarted.history()] == ["pending"]


def test_prune_keeps_the_rollback_target_even_when_previous_names_another(store, make_script):
    rel = seeded(store, make_script, "v1", "v2", "v3")
    store.judge(rel["v2"], "rejected", "rolled back")  # previous is v2, the target is v1
    assert store.previous() == rel["v2"] and store.rollback_target() == rel["v1"]
    store.prune(keep=0)
    assert {r.id for r in store.releases()} == {rel[t].id for t in ("v1", "v2", "v3")}


def test_prune_keeps_the_accepted_release_before_the_newest(store, make_script):
    rel = seeded(store, make_script, "v1", "v2")
    bad = store.install(make_script("v3"))
    store.put_in_service(bad, "swap")
    store.activate(bad)  # on trial: active, previous v2; the accepted ones are v1 and v2
    store.judge(bad, "rejected", "crashed")
    store.prune(keep=0)
    assert {r.id for r in store.releases()} == {rel["v1"].id, rel["v2"].id, bad.id}


def test_history_survives_a_restart_of_the_store(store, make_script):
    rel = seeded(store, make_script, "v1", "v2")
    again = ReleaseStore(store.state_dir)
    again.recover()
    assert [(r.release, r.verdict) for r in again.history()] == [
        (rel["v1"].id, "accepted"), (rel["v2"].id, "accepted")]
    assert again.rollback_target() == rel["v1"]


def test_a_crash_while_saving_leaves_the_old_history_or_the_new(store, make_script):
    rel = seeded(store, make_script, "v1")
    v2 = store.install(make_script("v2"))
    store.put_in_service(v2, "swap")
    store.activate(v2)
    child = Path(__file__).with_name("swap_crash_child.py")
    for step, verdict in (("history_written", "pending"), ("history_replaced", "accepted")):
        done = subprocess.run([sys.executable, child, store.state_dir, "judge", v2.id, step],
                              capture_output=True, text=True, timeout=60)
        assert done.returncode == -9, done.stderr
        restarted = ReleaseStore(store.state_dir)
        restarted.recover()
        assert not [p for p in store.state_dir.iterdir() if p.name.startswith(".tmp-")]
        assert [(r.release, r.verdict) for r in restarted.history()] == [
            (rel["v1"].id, "accepted"), (v2.id, verdict)], step
