"""``supervisor/core/replycache.py``: which replies answer a monitoring read no engine gives
now, and which engines a shared door's reads do not wait on (pure: methods, names, bytes)."""

from __future__ import annotations

from cuzkd.supervisor.core.replycache import READING_TIMEOUT, ReplyCache, read_timeout


def test_a_read_waits_at_most_the_reading_timeout_other_calls_their_caller_s_time() -> None:
    assert read_timeout("GetStatus", None) == READING_TIMEOUT
    assert read_timeout("GetMetrics", 30.0) == READING_TIMEOUT
    assert read_timeout("GetStatus", 0.5) == 0.5
    assert read_timeout("Prove", None) is None
    assert read_timeout("PreloadSRS", 30.0) == 30.0


def test_each_engine_s_last_good_reply_stands_in_in_the_door_s_order() -> None:
    cache = ReplyCache(["a", "b", "c"])
    assert cache.stand_ins("GetStatus") == []  # none answered yet
    cache.replied("GetStatus", "c", b"c1")
    cache.replied("GetStatus", "a", b"a1")
    cache.replied("GetStatus", "a", None)  # garbage: the good one stays
    cache.replied("GetStatus", "c", b"c2")
    assert cache.stand_ins("GetStatus") == [("a", b"a1"), ("c", b"c2")]
    assert cache.stand_ins("GetMetrics") == []  # kept per method


def test_only_reads_answered_from_cache_have_stand_ins() -> None:
    cache = ReplyCache(["a", "b"])
    cache.replied("PreloadSRS", "a", b"loaded")
    cache.replied("PreloadSRS", "b", b"loaded", behind=True)
    assert cache.stand_ins("PreloadSRS") == []


def test_an_engine_that_ran_out_its_time_is_read_behind_until_it_answers() -> None:
    cache = ReplyCache(["a", "b"])
    cache.timed_out("GetStatus", "b")
    assert cache.behind("GetStatus", ["a", "b"]) == ["b"]
    assert cache.behind("GetMetrics", ["a", "b"]) == []  # lags per method
    cache.replied("GetStatus", "b", None)  # garbage is an answer too: the lag ends
    assert cache.behind("GetStatus", ["a", "b"]) == []
    cache.timed_out("GetStatus", "b")
    cache.replied("GetStatus", "b", b"b1", behind=True)
    assert cache.behind("GetStatus", ["a", "b"]) == []
    assert cache.stand_ins("GetStatus") == [("b", b"b1")]


def test_when_all_lag_they_are_waited_on_unless_one_has_a_reply_to_stand_in() -> None:
    cache = ReplyCache(["a", "b"])
    cache.timed_out("GetStatus", "a")
    cache.timed_out("GetStatus", "b")
    assert cache.behind("GetStatus", ["a", "b"]) == []  # nothing else to answer with
    cache.replied("GetStatus", "a", b"a1")
    cache.timed_out("GetStatus", "a")
    assert cache.behind("GetStatus", ["a", "b"]) == ["a", "b"]
    assert cache.behind("GetStatus", ["b"]) == []  # b alone: none kept for it


def test_a_preload_read_behind_counts_as_kept_one_answered_by_all_does_not() -> None:
    cache = ReplyCache(["a", "b"])
    cache.replied("PreloadSRS", "a", b"loaded")
    cache.timed_out("PreloadSRS", "a")
    cache.timed_out("PreloadSRS", "b")
    assert cache.behind("PreloadSRS", ["a", "b"]) == []
    cache.replied("PreloadSRS", "a", b"loaded", behind=True)
    cache.timed_out("PreloadSRS", "a")
    assert cache.behind("PreloadSRS", ["a", "b"]) == ["a", "b"]
