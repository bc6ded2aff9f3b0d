"""The metrics listener's auth decisions that need no event loop: who gets a place in the queue
for a bcrypt round (:mod:`cuzkd.supervisor.web.fairqueue`), what is remembered between
requests (:mod:`cuzkd.supervisor.web.authcache`), the dummy hash's cost and the unit of
fairness (:func:`cuzkd.supervisor.web.access.source_of`)."""

from __future__ import annotations

import time

import bcrypt
import pytest
from hypothesis import given
from hypothesis import strategies as st

from cuzkd.supervisor.web.access import source_of
from cuzkd.supervisor.web.authcache import Refused, Verified
from cuzkd.supervisor.web.basicauth import dummy_hash, hash_cost
from cuzkd.supervisor.web.fairqueue import REMEMBERED, FairQueue


def test_one_source_gets_its_share_and_no_more() -> None:
    queue: FairQueue[str] = FairQueue(capacity=8, per_source=2)
    assert [queue.admit("flood", f"w{i}").admitted for i in range(5)] \
        == [True, True, False, False, False]
    assert queue.admit("prometheus", "right").admitted
    assert (len(queue), queue.waiting("flood"), queue.waiting("prometheus")) == (3, 2, 1)


def test_busy_sources_are_served_in_turn_whatever_they_sent() -> None:
    """A request waits for at most one round per other source ahead of it."""
    queue: FairQueue[str] = FairQueue(capacity=8, per_source=4)
    for i in range(4):
        queue.admit("a", f"a{i}")
    for i in range(3):
        queue.admit("b", f"b{i}")
    queue.admit("c", "c0")
    order = [queue.take() for _ in range(len(queue))]
    assert order == ["a0", "b0", "c0", "a1", "b1", "a2", "b2", "a3"]
    assert queue.take() is None and len(queue) == 0


def test_a_source_with_nothing_waiting_goes_before_a_busy_sources_next() -> None:
    """The flood's round runs and two more of it wait: a right password arriving now is
    the next served; newcomers among themselves, first come first served."""
    queue: FairQueue[str] = FairQueue(capacity=8, per_source=2)
    queue.admit("flood", "w0")
    queue.admit("flood", "w1")
    assert queue.take() == "w0"  # its round runs
    queue.admit("flood", "w2")
    queue.admit("prometheus", "right")
    queue.admit("grafana", "other")
    assert [queue.take() for _ in range(4)] == ["right", "other", "w1", "w2"]


def test_ever_new_sources_do_not_grow_what_is_remembered() -> None:
    """A flood from a new address each time, each served at once: the tags of the sources
    served are forgotten, at the latest when REMEMBERED per place are kept."""
    queue: FairQueue[int] = FairQueue(capacity=8, per_source=2)
    queue.admit("busy", -1)
    for n in range(10_000):
        assert queue.admit(f"198.51.100.{n}", n).admitted
        assert queue.take() is not None
        assert queue.remembered <= REMEMBERED * 8


def test_a_full_queue_gives_a_new_source_the_newest_place_of_the_longest() -> None:
    queue: FairQueue[str] = FairQueue(capacity=4, per_source=2)
    for source in ("a", "b"):
        queue.admit(source, f"{source}0")
        queue.admit(source, f"{source}1")
    admission = queue.admit("prometheus", "right")
    assert admission.admitted and admission.evicted == "a1"  # the one that waited least
    assert queue.admit("c", "c0").evicted == "b1"
    # every place is now a different source's: one more is refused, nothing evicted
    for source in ("d", "a"):
        admission = queue.admit(source, "x")
        assert not admission.admitted and admission.evicted is None
    assert sorted(queue.take() or "" for _ in range(4)) == ["a0", "b0", "c0", "right"]


def test_an_item_whose_owner_went_frees_its_place() -> None:
    queue: FairQueue[str] = FairQueue(capacity=2, per_source=2)
    queue.admit("a", "a0")
    queue.admit("a", "a1")
    assert queue.discard("a", "a0") and not queue.discard("a", "a0")
    assert len(queue) == 1 and queue.admit("a", "a2").admitted
    assert queue.discard("a", "a1") and queue.discard("a", "a2")
    assert queue.waiting("a") == 0 and queue.take() is None


def test_bounds_that_cannot_hold_are_refused() -> None:
    with pytest.raises(ValueError, match="per_source"):
        FairQueue(capacity=2, per_source=3)


@given(st.lists(st.tuples(st.sampled_from(["take", "admit"]),
                          st.integers(min_value=0, max_value=5)), max_size=200))
def test_the_bounds_hold_and_nothing_is_lost(steps: list[tuple[str, int]]) -> None:
    """Every item admitted is taken or evicted exactly once; the bounds hold throughout; a
    source holding nothing is refused only when every place is a different source's."""
    queue: FairQueue[int] = FairQueue(capacity=4, per_source=2)
    live: dict[int, int] = {}
    gone: list[int] = []
    for n, (step, source) in enumerate(steps):
        if step == "take":
            item = queue.take()
            if item is not None:
                gone.append(item)
                del live[item]
            continue
        before = {s: queue.waiting(s) for s in range(6)}
        admission = queue.admit(source, n)
        if admission.admitted:
            live[n] = source
        elif before[source] == 0:
            assert len(queue) == 4 and all(w <= 1 for w in before.values())
        if admission.evicted is not None:
            gone.append(admission.evicted)
            del live[admission.evicted]
        assert len(queue) == len(live) <= 4
        assert all(queue.waiting(s) <= 2 for s in range(6))
        assert queue.remembered <= REMEMBERED * 4
    assert len(gone) == len(set(gone))


def test_a_verified_password_counts_for_its_user_and_hash_only() -> None:
    verified = Verified(limit=2)
    verified.remember("prometheus", b"h1", b"d1")
    assert verified.holds("prometheus", b"h1", b"d1")
    assert not verified.holds("prometheus", b"h1", b"d2")  # another password
    assert not verified.holds("prometheus", b"h2", b"d1")  # the hash changed
    assert not verified.holds("prometheus", None, b"d1")  # the user went
    assert not verified.holds("grafana", b"h1", b"d1")


def test_the_least_recently_used_is_forgotten_first() -> None:
    verified = Verified(limit=2)
    verified.remember("a", b"ha", b"da")
    verified.remember("b", b"hb", b"db")
    assert verified.holds("a", b"ha", b"da")  # a used: b is now the oldest
    verified.remember("c", b"hc", b"dc")
    assert len(verified) == 2
    assert verified.holds("a", b"ha", b"da") and verified.holds("c", b"hc", b"dc")
    assert not verified.holds("b", b"hb", b"db")


def test_a_re_read_file_forgets_changed_and_removed_users_only() -> None:
    verified = Verified()
    for user in ("kept", "changed", "removed"):
        verified.remember(user, f"h-{user}".encode(), b"d")
    verified.keep_only({"kept": b"h-kept", "changed": b"h-new"})
    assert len(verified) == 1 and verified.holds("kept", b"h-kept", b"d")


def test_refusals_are_forgotten_all_at_once_when_full() -> None:
    refused = Refused(limit=3)
    for digest in (b"1", b"2", b"3"):
        refused.add(digest)
    assert b"2" in refused and len(refused) == 3
    refused.add(b"4")
    assert len(refused) == 1 and b"4" in refused and b"2" not in refused


def test_the_dummy_hash_has_the_highest_configured_cost_and_matches_nothing() -> None:
    hashes = [bcrypt.hashpw(b"p", bcrypt.gensalt(cost)) for cost in (4, 6, 5)]
    assert [hash_cost(h) for h in hashes] == [4, 6, 5]
    assert hash_cost(b"$2y$12$" + b"." * 53) == 12
    started = time.perf_counter()
    dummy = dummy_hash(hashes)
    assert time.perf_counter() - started < 0.05  # made without hashing: fine on the loop
    assert hash_cost(dummy) == 6 and len(dummy) == 60
    assert dummy != dummy_hash(hashes)  # a fresh salt each time
    assert not bcrypt.checkpw(b"p", dummy) and not bcrypt.checkpw(b"", dummy)
    assert hash_cost(dummy_hash([])) == 4


@pytest.mark.parametrize(("remote", "source"), [
    ("192.0.2.7", "192.0.2.7"),
    ("2001:db8:1:2:3:4:5:6", "2001:db8:1:2::/64"),
    ("2001:db8:1:2:ffff::1", "2001:db8:1:2::/64"),  # one host's block is one source
    ("::ffff:192.0.2.7", "192.0.2.7"),  # a dual-stack listener's IPv4 client
    ("", ""),
    (None, ""),
    ("not-an-address", "not-an-address"),
])
def test_the_unit_of_fairness_is_an_address_or_an_ipv6_64(remote: str | None,
                                                          source: str) -> None:
    assert source_of(remote) == source
