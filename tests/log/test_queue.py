"""The log queue's decisions on a virtual clock: what is kept (in order), what is dropped, and
the one report per gap that the writer writes once it has caught up."""

from __future__ import annotations

from cuzkd.log.queue import DropReport, LineQueue


def _offer_all(queue: LineQueue, lines: list[bytes], now: float) -> list[bool]:
    return [queue.offer(line, now) for line in lines]


def test_a_full_queue_drops_until_the_writer_caught_up_then_reports_the_gap_once() -> None:
    queue = LineQueue(max_bytes=10)
    assert _offer_all(queue, [b"aaaa", b"bbbb"], now=0.0) == [True, True]
    first = queue.take()  # the writer writes these; their bytes count until written
    assert _offer_all(queue, [b"cc", b"dddd", b"e"], now=1.0) == [True, False, False]
    # The first batch is written: there is room again, but "cc" still waits for the writer,
    # so the gap goes on (one gap, not a line here and there).
    assert queue.written(first, 0, now=2.0) == []
    assert not queue.offer(b"f", now=3.0)
    second = queue.take()
    assert second == [b"cc"]
    # Caught up: the gap is reported, how many lines and how long after its first.
    assert queue.written(second, 0, now=5.0) == [
        DropReport("queue_full", lines=3, since=1.0, seconds=4.0)]
    assert queue.offer(b"gggg", now=6.0)
    assert queue.written(queue.take(), 0, now=7.0) == []  # reported once
    assert queue.dropped_total == {"queue_full": 3, "write_error": 0, "upgrade": 0}


def test_lines_queued_after_a_batch_are_kept_and_wait_for_the_next_one() -> None:
    queue = LineQueue(max_bytes=100)
    _offer_all(queue, [b"1", b"2"], now=0.0)
    batch = queue.take()
    assert queue.offer(b"3", now=0.1)  # while the writer writes 1 and 2
    assert queue.written(batch, 0, now=0.2) == []
    assert queue.has_lines and queue.take() == [b"3"]


def test_a_line_larger_than_the_bound_is_taken_by_an_idle_writer_only() -> None:
    queue = LineQueue(max_bytes=4)
    assert queue.offer(b"0123456789", now=0.0)  # nothing queued: one long line is kept
    assert not queue.offer(b"x", now=0.0)
    batch = queue.take()
    assert queue.written(batch, 0, now=1.0) == [DropReport("queue_full", 1, 0.0, 1.0)]


def test_failed_writes_are_counted_and_reported_after_a_write_succeeds() -> None:
    queue = LineQueue()
    _offer_all(queue, [b"a", b"b", b"c"], now=0.0)
    batch = queue.take()
    # The write failed after "a": "b" and "c" are lost; the report is due at once ...
    (report,) = queue.written(batch, 2, now=1.0)
    assert report == DropReport("write_error", 2, since=1.0, seconds=0.0)
    # ... but it could not be written either: it is kept, with what is lost after it.
    queue.unreported([report])
    queue.offer(b"d", now=2.0)
    assert queue.written(queue.take(), 1, now=3.0) == [DropReport("write_error", 3, 1.0, 2.0)]
    # each line once
    assert queue.dropped_total == {"queue_full": 0, "write_error": 3, "upgrade": 0}
