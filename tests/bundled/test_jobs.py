"""A job request's checks, the test-only failure rate, and a phase's span."""

from __future__ import annotations

import pytest

from cuzkd.bundled.jobs import (
    MAX_PARTITIONS,
    JobRequestError,
    Span,
    checked_request,
    injected_failure,
)
from cuzkd.bundled.settings import MAX_SIZE_LOG2, PARTITIONS, ProverConfig


def test_a_request_leaving_fields_out_gets_the_kinds_defaults() -> None:
    config = ProverConfig(memory_budget_bytes=2**30)
    assert checked_request(config, "porep-c2", None, None) == (
        PARTITIONS["porep-c2"], config.size_log2("porep-c2"))
    assert checked_request(config, "porep-c2", 3, 12) == (3, 12)


@pytest.mark.parametrize(("kind", "partitions", "size", "field"), [
    ("nope", None, None, "proof_kind"),
    ("snap-update", 0, None, "partitions"),
    ("snap-update", MAX_PARTITIONS + 1, None, "partitions"),
    ("snap-update", None, MAX_SIZE_LOG2 + 1, "size_log2"),
])
def test_a_request_out_of_range_names_its_field(kind: str, partitions: int | None,
                                                size: int | None, field: str) -> None:
    with pytest.raises(JobRequestError, match=field):
        checked_request(ProverConfig(memory_budget_bytes=2**30), kind, partitions, size)


@pytest.mark.parametrize(("rate", "first_nine"), [
    (0.0, [False] * 9),
    (1 / 3, [False, False, True] * 3),
    (0.5, [False, True] * 4 + [False]),
    (1.0, [True] * 9),
])
def test_failure_rate_chooses_exactly_its_share(rate: float, first_nine: list[bool]) -> None:
    assert [injected_failure(n, rate) for n in range(1, 10)] == first_nine
    assert sum(injected_failure(n, rate) for n in range(1, 3001)) == int(3000 * rate + 1e-9)


def test_a_span_runs_from_the_first_start_to_the_last_end() -> None:
    span = Span()
    assert span.seconds == 0.0
    span.cover(5.0, 7.0)
    span.cover(4.0, 6.0)
    span.cover(6.0, 9.5)
    assert (span.start, span.end, span.seconds) == (4.0, 9.5, 5.5)
