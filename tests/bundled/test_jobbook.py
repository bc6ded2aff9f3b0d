"""The job book on its own: jobs counted down to their end, open jobs counted, finished ones
retained up to a bound."""

from __future__ import annotations

from cuzkd.bundled.budget import MemoryBudget
from cuzkd.bundled.jobbook import JobBook
from cuzkd.bundled.jobs import Job
from cuzkd.priority import Priority
from cuzkd.status.tracker import StatusTracker


def book_of(retain_jobs: int = 10) -> tuple[JobBook, list[float]]:
    """A book on a clock the test sets: (the book, the clock's one value)."""
    now = [100.0]
    budget = MemoryBudget(2**20)
    book = JobBook(StatusTracker(budget=budget), budget, clock=lambda: now[0],
                   publish=lambda: None, retain_jobs=retain_jobs)
    return book, now


def accept(book: JobBook, partitions: int = 1, request_id: str = "") -> Job:
    return book.accept("winning-post", partitions, 10, request_id, Priority.NORMAL, 0.0)


def test_a_job_ends_when_its_last_partition_does() -> None:
    book, now = book_of()
    job = accept(book, partitions=2)
    assert (book.open_jobs, job.submitted_at) == (1, 100.0)
    job.admitted = 2
    book.partition_ended(job)
    assert job.finished_at is None and not job.finished.is_set()
    now[0] = 103.0
    book.partition_failed(job, 1, "boom")
    assert (job.state, job.error, job.finished_at) == ("failed", "partition 1: boom", 103.0)
    assert job.finished.is_set() and book.open_jobs == 0


def test_unadmitted_partitions_fail_with_the_jobs_first_error() -> None:
    book, _ = book_of()
    job = accept(book, partitions=4)
    job.admitted = 1
    book.fail_unadmitted(job, "too big")
    assert (job.admitted, job.remaining, job.finished_at) == (4, 1, None)
    book.partition_ended(job)
    assert (job.state, job.error) == ("failed", "too big")


def test_fail_open_ends_every_unfinished_job_and_leaves_finished_ones() -> None:
    book, _ = book_of()
    done, open_ = accept(book), accept(book, partitions=3)
    done.admitted = 1
    book.partition_ended(done)
    book.fail_open("drain timeout")
    assert (done.state, done.error) == ("done", None)
    assert (open_.state, open_.error) == ("failed", "drain timeout")
    assert book.open_jobs == 0


def test_only_the_last_finished_jobs_are_retained_a_reused_request_id_with_the_latest() -> None:
    book, _ = book_of(retain_jobs=1)
    first = accept(book, request_id="r")
    retry = accept(book, request_id="r")
    other = accept(book)
    assert book.requests["r"] is retry
    for job in (first, retry, other):
        job.admitted = 1
        book.partition_ended(job)
    assert list(book.jobs) == [other.job_id]
    assert "r" not in book.requests and other.request_id in book.requests
