"""The NTT plans the bundled engine's GPU workers built, one per (device, log2 size), kept for
the engine's life and listed in ``/status`` as its ``allocations``."""

from __future__ import annotations

from dataclasses import dataclass, field

from cuzkd.bundled.field import ArrayModule
from cuzkd.bundled.ntt import NttPlan
from cuzkd.status.document import Allocation


@dataclass
class PlanUse:
    """NTT tables of one size on one device, and when each proof kind last used them."""

    plan: NttPlan
    last_used: dict[str, float] = field(default_factory=dict)


class PlanCache:
    """The plans by (device, log2 size); tables are built lazily, on the device."""

    def __init__(self, xp: ArrayModule) -> None:
        self._xp = xp
        self._uses: dict[tuple[int, int], PlanUse] = {}

    def for_partition(self, ordinal: int, log_n: int, proof_kind: str,
                      now: float) -> tuple[NttPlan, NttPlan]:
        """Plans of size n and 2n on ``ordinal``, marked used by ``proof_kind`` at ``now``."""
        plans = []
        for size in (log_n, log_n + 1):
            use = self._uses.get((ordinal, size))
            if use is None:
                use = self._uses[(ordinal, size)] = PlanUse(NttPlan(size, self._xp))
            use.last_used[proof_kind] = now
            plans.append(use.plan)
        return plans[0], plans[1]

    def allocations(self, now: float) -> tuple[list[Allocation], list[Allocation]]:
        """The plans' tables as ``/status`` lists them: (srs: bit-reversal and twiddles,
        pce: coset powers), one entry per plan and proof kind that used it."""
        srs: list[Allocation] = []
        pce: list[Allocation] = []
        for (ordinal, log_n), use in sorted(self._uses.items()):
            for kind, last in sorted(use.last_used.items()):
                circuit = f"{kind}-2^{log_n}@{ordinal}"
                ago = max(0.0, now - last)
                srs.append(Allocation(circuit_id=circuit, bytes=use.plan.table_bytes,
                                      last_used_secs_ago=ago, evictable=False))
                pce.append(Allocation(circuit_id=circuit, bytes=use.plan.coset_bytes,
                                      last_used_secs_ago=ago, evictable=False))
        return srs, pce
