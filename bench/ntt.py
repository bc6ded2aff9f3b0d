"""NTT throughput per backend: ``python bench/ntt.py [--min-log2 12] [--max-log2 20]``.

For every backend present (NumPy always, CuPy when it imports and sees a device) and every
n = 2^k, times the forward NTT of one vector and the full device phase of one partition
(the quotient: inverse NTT of 3 vectors, coset NTT and inverse coset NTT of size 2n), and prints
elements per second (median of the repetitions). The NTT code is the engine's own
(``cuzkd.bundled.ntt``): the CuPy figures are the same code with ``xp = cupy``.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from cuzkd.bundled import field
from cuzkd.bundled.backend import Backend, select_backend
from cuzkd.bundled.ntt import NttPlan
from cuzkd.bundled.prover import quotient
from cuzkd.errors import BackendError


def backends(which: str) -> list[Backend]:
    found = [select_backend("numpy")] if which in ("all", "numpy") else []
    if which in ("all", "cupy"):
        try:
            found.append(select_backend("cupy"))
        except BackendError:
            print("cupy: not available (no CuPy or no CUDA device)")
    return found


def timed(fn: Callable[..., Any], fn_args: tuple[Any, ...], sync: Callable[[], None],
          repeat: int) -> float:
    fn(*fn_args)
    sync()  # warm-up: tables built, kernels compiled
    samples = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn(*fn_args)
        sync()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--min-log2", type=int, default=12)
    parser.add_argument("--max-log2", type=int, default=20)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--backend", choices=("all", "numpy", "cupy"), default="all",
                        help="cupy alone keeps large sizes quick on a GPU machine")
    args = parser.parse_args()
    print(f"{'backend':8} {'log2 n':>6} {'ntt ms':>9} {'ntt Melem/s':>12} "
          f"{'quotient ms':>12} {'quotient Melem/s':>17}")
    for backend in backends(args.backend):
        xp = backend.xp
        sync: Callable[[], None] = (
            xp.cuda.Stream.null.synchronize if backend.name == "cupy" else lambda: None)
        rng = np.random.default_rng(0)
        for log_n in range(args.min_log2, args.max_log2 + 1):
            n = 1 << log_n
            small, large = NttPlan(log_n, xp), NttPlan(log_n + 1, xp)
            vec = xp.asarray(rng.integers(0, field.P, size=n, dtype=np.uint64))
            abc = xp.asarray(rng.integers(0, field.P, size=(3, n), dtype=np.uint64))
            ntt = timed(small.forward, (vec,), sync, args.repeat)
            quo = timed(quotient, (abc, small, large), sync, args.repeat)
            print(f"{backend.name:8} {log_n:>6} {ntt * 1e3:>9.2f} {n / ntt / 1e6:>12.2f} "
                  f"{quo * 1e3:>12.2f} {n / quo / 1e6:>17.2f}")


if __name__ == "__main__":
    main()
