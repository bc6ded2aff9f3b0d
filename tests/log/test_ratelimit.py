"""``cuzkd.log.ratelimit``: one line per key per interval, with the count of what it stands for."""

from __future__ import annotations

import errno

import structlog

from cuzkd.log.ratelimit import LimitedLog, RateLimiter, errno_name


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_first_occurrence_admitted_then_suppressed_within_interval() -> None:
    clock = Clock()
    limiter = RateLimiter(10.0, clock=clock)
    assert limiter.hit("k") == 1
    for _ in range(99_999):
        clock.now += 0.0001
        assert limiter.hit("k") is None
    clock.now = 1010.0
    # the next line stands for itself and the 99,999 suppressed since the last one
    assert limiter.hit("k") == 100_000
    assert limiter.hit("k") is None
    clock.now += 10.0
    assert limiter.hit("k") == 2


def test_keys_are_independent() -> None:
    clock = Clock()
    limiter = RateLimiter(10.0, clock=clock)
    assert limiter.hit(("accept", None, "EMFILE")) == 1
    assert limiter.hit(("accept", None, "ENFILE")) == 1
    assert limiter.hit(("spawn", "gpu0", "EMFILE")) == 1
    assert limiter.hit(("spawn", "gpu1", "EMFILE")) == 1
    assert limiter.hit(("spawn", "gpu0", "EMFILE")) is None


def test_a_quiet_key_is_admitted_again_after_the_interval() -> None:
    clock = Clock()
    limiter = RateLimiter(10.0, clock=clock)
    assert limiter.hit("k") == 1
    clock.now += 9.999
    assert limiter.hit("k") is None
    clock.now += 0.001
    assert limiter.hit("k") == 2


def test_keys_remembered_are_bounded() -> None:
    clock = Clock()
    limiter = RateLimiter(10.0, clock=clock, max_keys=3)
    for key in range(10):
        assert limiter.hit(key) == 1
    assert limiter.hit(9) is None  # the newest are kept
    assert limiter.hit(0) == 1  # the oldest were forgotten


def test_limited_log_writes_structured_lines_with_repeated() -> None:
    clock = Clock()
    limited = LimitedLog(RateLimiter(10.0, clock=clock))
    with structlog.testing.capture_logs() as lines:
        logger = structlog.get_logger("test").bind(engine="gpu0")
        for _ in range(1000):
            limited.log(logger, "warning", "accept_failed", key=("gpu0", "EMFILE"),
                        errno="EMFILE")
        clock.now += 10
        assert limited.log(logger, "warning", "accept_failed", key=("gpu0", "EMFILE"),
                           errno="EMFILE")
    assert [(rec["event"], rec["repeated"], rec["engine"], rec["log_level"])
            for rec in lines] == [
        ("accept_failed", 1, "gpu0", "warning"), ("accept_failed", 1000, "gpu0", "warning")]


def test_errno_name() -> None:
    assert errno_name(OSError(errno.EMFILE, "Too many open files")) == "EMFILE"
    assert errno_name(TimeoutError()) == "TimeoutError"
    assert errno_name(ValueError("x")) == "ValueError"
