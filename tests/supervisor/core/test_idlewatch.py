"""``supervisor/core/idlewatch.py``: when a metrics connection is idle (pure: ``now`` and the
bytes waiting for the client in, close or the next look out)."""

from __future__ import annotations

from cuzkd.supervisor.core.idlewatch import IDLE_CHECKS, Close, IdleWatch, LookAgain


def test_a_silent_connection_is_closed_at_the_idle_time() -> None:
    watch = IdleWatch(10.0)
    watch.moved(100.0)
    assert watch.look(104.0, (0, 0)) == LookAgain(6.0)  # looks again when it would be idle
    assert watch.look(109.5, (0, 0)) == LookAgain(0.5)
    assert watch.look(110.0, (0, 0)) == Close()


def test_a_byte_that_arrives_starts_the_silence_again() -> None:
    watch = IdleWatch(10.0)
    watch.moved(100.0)
    watch.moved(108.0)
    assert watch.look(110.0, (0, 0)) == LookAgain(8.0)
    assert watch.look(118.0, (0, 0)) == Close()


def test_bytes_that_wait_are_looked_at_often_and_moving_ones_keep_it_open() -> None:
    watch = IdleWatch(10.0)
    watch.moved(100.0)
    assert watch.look(105.0, (0, 500)) == LookAgain(10.0 / IDLE_CHECKS)  # the queue moved
    assert watch.look(112.0, (0, 300)) == LookAgain(10.0 / IDLE_CHECKS)  # read: moved again
    assert watch.look(121.9, (0, 300)) == LookAgain(10.0 / IDLE_CHECKS)  # unchanged: quiet
    assert watch.look(122.0, (0, 300)) == Close()  # a reader that stopped is idle too


def test_a_change_in_either_queue_is_a_move() -> None:
    watch = IdleWatch(10.0)
    watch.moved(0.0)
    assert watch.look(9.0, (16384, 0)) == LookAgain(10.0 / IDLE_CHECKS)
    assert watch.look(18.0, (0, 16384)) == LookAgain(10.0 / IDLE_CHECKS)  # left the buffer
    assert watch.look(27.0, (0, 0)) == LookAgain(10.0)  # all read now: a full idle time
    assert watch.look(37.0, (0, 0)) == Close()
