"""Restart delays: immediate after a healthy run, exponential with jitter in a crash loop.

Pure arithmetic (the random source is injected) so the policy is unit-tested without clocks
or processes. The rule, from the issue: the first unexpected exit after a healthy run restarts
at once; each further failure without ``reset_after`` seconds of healthy running multiplies the
delay, capped at ``maximum``. Jitter only ever *shortens* a delay, by at most ``jitter`` of it,
so with a multiplier ≥ 1/(1-jitter) delays still grow monotonically until the cap and never
exceed it.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass
class Backoff:
    initial: float
    maximum: float
    multiplier: float
    reset_after: float
    jitter: float = 0.2
    rand: Callable[[], float] = field(default=random.random)
    #: consecutive failures since the last healthy run long enough to reset
    failures: int = 0

    def next_delay(self, healthy_for: float | None) -> float:
        """Delay before restarting after a failure.

        ``healthy_for`` is how long the process ran after its status first answered (None if it
        never answered).
        """
        if healthy_for is not None and healthy_for >= self.reset_after:
            self.failures = 0
        failures = self.failures
        self.failures += 1
        if failures == 0:
            return 0.0
        # Compare in log space so a long crash loop cannot overflow the power.
        grows_past_cap = (failures - 1) * math.log(self.multiplier) >= math.log(
            self.maximum / self.initial)
        base = self.maximum if grows_past_cap else self.initial * self.multiplier ** (failures - 1)
        return base * (1.0 - self.jitter * self.rand())
