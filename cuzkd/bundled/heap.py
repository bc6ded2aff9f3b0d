"""Make freed arrays leave the process, so resident memory follows the memory budget.

glibc serves allocations below its mmap threshold from heaps (one arena per thread); freed,
they stay resident for reuse by the same arena. Its threshold also rises on its own, up to
32 MiB, each time a large block is freed. The engine allocates arrays of megabytes on
synthesis, device and finalize threads in turn, so with the defaults the memory a partition
frees on one thread stays resident while the next partition allocates afresh on another:
the process grows well past what the budget holds (about +40 % measured at 2^19-element
partitions). A fixed threshold makes every array of 128 KiB or more its own mapping, returned
to the kernel when freed. Small objects are unaffected.
"""

from __future__ import annotations

import ctypes
import platform

#: mallopt parameter number of M_MMAP_THRESHOLD (malloc.h).
_M_MMAP_THRESHOLD = -3
#: Allocations this large are mapped (and unmapped when freed); fixing it stops the drift.
MMAP_THRESHOLD = 128 * 1024


def return_large_frees() -> bool:
    """Fix glibc's mmap threshold for this process; False where libc is not glibc."""
    if platform.libc_ver()[0] != "glibc":
        return False
    libc = ctypes.CDLL(None)
    return bool(libc.mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD))
