"""Cost of the supervisor's descendant tracking: ``python bench/descendants.py [--threads N]``.

Starts a process with N threads (a busy cuzk runs hundreds: rayon and tokio pools) and times
what a health poll may do for its engine: the tree walk (``proctree.descendants``: one
``children`` file read per thread), and the scan of the supervisor's adopted children
(``pids.adopted``). Prints the median of each in milliseconds; the runner walks at most every
``DESCENDANT_WALK`` seconds and scans the adopted children at every poll.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from collections.abc import Callable

from cuzkd.supervisor.core.cadence import DESCENDANT_WALK
from cuzkd.supervisor.proc import pids
from cuzkd.supervisor.proc.tree import descendants

_THREADS = """
import sys, threading, time
for _ in range(int(sys.argv[1])):
    threading.Thread(target=time.sleep, args=(3600,), daemon=True).start()
print("ready", flush=True)
time.sleep(3600)
"""


def median_ms(fn: Callable[[], object], repeat: int = 200) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1000


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--threads", type=int, default=200)
    args = parser.parse_args()
    proc = subprocess.Popen([sys.executable, "-c", _THREADS, str(args.threads)],
                            stdout=subprocess.PIPE)
    try:
        assert proc.stdout is not None
        proc.stdout.readline()
        walk = median_ms(lambda: descendants(proc.pid))
        adopted = median_ms(lambda: pids.adopted([proc.pid]))
    finally:
        proc.kill()
        proc.wait()
    print(f"tree walk, {args.threads} threads: {walk:.2f} ms "
          f"(every {DESCENDANT_WALK:g} s: {walk / DESCENDANT_WALK / 10:.3f} % of a core)")
    print(f"adopted children scan: {adopted:.3f} ms per health poll")


if __name__ == "__main__":
    main()
