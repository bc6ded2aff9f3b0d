"""NTT plans built once per (device, size) and listed with each proof kind's last use."""

from __future__ import annotations

import numpy as np

from cuzkd.bundled.plans import PlanCache


def test_plans_are_shared_per_device_and_size_and_listed_per_kind() -> None:
    cache = PlanCache(np)
    small, large = cache.for_partition(0, 4, "porep-c2", now=10.0)
    assert (small.log_n, large.log_n) == (4, 5)
    again, _ = cache.for_partition(0, 4, "snap-update", now=12.0)
    assert again is small
    srs, pce = cache.allocations(now=15.0)
    assert [(a.circuit_id, a.last_used_secs_ago) for a in srs] == [
        ("porep-c2-2^4@0", 5.0), ("snap-update-2^4@0", 3.0),
        ("porep-c2-2^5@0", 5.0), ("snap-update-2^5@0", 3.0)]
    assert [a.bytes for a in srs] == [small.table_bytes] * 2 + [large.table_bytes] * 2
    assert [a.bytes for a in pce] == [small.coset_bytes] * 2 + [large.coset_bytes] * 2
