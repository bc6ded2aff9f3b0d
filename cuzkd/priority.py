"""cuzk's call priorities: the numbers and names of its gRPC ``Priority`` enum, kept once.

The door ranks held calls by a claimed priority, the bundled engine admits jobs by it, the
demo sets Curio's and the exporter labels calls with it: each reads this enum, so no module
spells the numbers alone. Its members are named and numbered as ``proving.proto`` names them
(tests/test_priority.py holds the two together), so a member's name is the proto's.

Dependency-free (only :mod:`enum`): every layer may import it.
"""

from __future__ import annotations

import enum


class Priority(enum.IntEnum):
    """cuzk's ``Priority``: a higher number is more urgent."""

    #: the caller claimed none (the door ranks the call by its kind alone, the engine as NORMAL)
    PRIORITY_UNSPECIFIED = 0
    LOW = 1
    NORMAL = 2
    HIGH = 3
    #: what Curio gives a WinningPoSt: a block reward is lost if it is late
    CRITICAL = 4
