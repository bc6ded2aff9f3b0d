"""Spawn latency, and spawns hung, while other threads churn: ``EngineProcess`` of ``true``.

Each spawn is timed from the call to its return (the time the event loop is blocked); the
child is then collected with ``waitpid`` as the reaper would. With ``--churn`` four threads
run meanwhile, the kinds the supervisor has (config reads, ``asyncio.to_thread`` jobs) and
the kinds that make a ``preexec_fn`` spawn risky (docs/supervisor.md, "preexec_fn while
threads run"):

- ``logging``: new loggers (logging's module lock) and records through a handler (its lock);
- ``alloc``: allocations and frees of 1 KiB to 8 MiB (malloc arenas, mmap);
- ``imports``: imports of freshly written modules (the import locks) and dlopen/dlclose of a
  shared library (the dynamic loader's lock);
- ``config``: ``logging.config.dictConfig`` whose handler factory takes 20 ms, holding
  logging's module lock all that time, in a loop.

With ``--held-lock`` one more thread holds logging's module lock (a logger class whose
constructor waits, as a handler opening a file on a hung mount would) until the watchdog sees
a spawn hang, then takes it again at once.

A spawn that has not returned after ``--hang-after`` seconds counts as hung; the watchdog then
SIGKILLs the supervisor's children that are not engines yet and lets the held lock go, so the
run goes on. Runs against whichever cuzkd is first on the path
(``PYTHONPATH=/path/to/other/checkout`` to compare).

    .venv/bin/python bench/spawn_latency.py [--spawns 500] [--churn] [--held-lock]
                                            [--hang-after 10]
"""

from __future__ import annotations

import argparse
import ctypes
import importlib
import logging
import logging.config
import os
import random
import signal
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

import cuzkd
from cuzkd.supervisor.proc.spawn import EngineProcess

_DLOPEN_TARGET = "libm.so.6"


def _logging(stop: threading.Event, counts: dict[str, int]) -> None:
    handler = logging.StreamHandler(open(os.devnull, "w"))  # noqa: SIM115 -- lives as long
    n = 0
    while not stop.is_set():
        log = logging.getLogger(f"churn.{n % 5000}")
        if not log.handlers:
            log.addHandler(handler)
        log.warning("churn %d", n)
        n += 1
    counts["logging"] = n


def _alloc(stop: threading.Event, counts: dict[str, int]) -> None:
    n = 0
    while not stop.is_set():
        block = bytearray(random.randint(1 << 10, 8 << 20))
        block[::4096] = b"x" * len(block[::4096])
        del block
        n += 1
    counts["alloc"] = n


def _imports(stop: threading.Event, counts: dict[str, int], where: Path) -> None:
    sys.path.insert(0, str(where))
    n = 0
    while not stop.is_set():
        name = f"churn_mod_{n}"
        (where / f"{name}.py").write_text(f"VALUE = {n}\n")
        importlib.invalidate_caches()
        importlib.import_module(name)
        lib = ctypes.CDLL(_DLOPEN_TARGET)
        import _ctypes
        _ctypes.dlclose(lib._handle)
        n += 1
    counts["imports"] = n


def _config(stop: threading.Event, counts: dict[str, int]) -> None:
    def slow_handler() -> logging.Handler:
        time.sleep(0.02)  # an operator's handler opening a file on a slow mount, say
        return logging.NullHandler()

    n = 0
    while not stop.is_set():
        logging.config.dictConfig({"version": 1, "disable_existing_loggers": False,
                                   "handlers": {"h": {"()": slow_handler}},
                                   "loggers": {"churn.config": {"handlers": ["h"]}}})
        n += 1
    counts["config"] = n


def _held_lock(stop: threading.Event, counts: dict[str, int], release: threading.Event
               ) -> None:
    class WaitingLogger(logging.Logger):
        def __init__(self, name: str) -> None:  # called under logging's module lock
            release.wait()
            release.clear()
            super().__init__(name)

    manager = logging.Manager(logging.RootLogger(logging.WARNING))
    manager.setLoggerClass(WaitingLogger)
    n = 0
    while not stop.is_set():
        manager.getLogger(f"held.{n}")
        n += 1
    counts["held_lock"] = n


def _children() -> set[int]:
    found: set[int] = set()
    for task in Path("/proc/self/task").iterdir():
        found.update(int(pid) for pid in (task / "children").read_text().split())
    return found


def run(spawns: int, churn: bool, held_lock: bool, hang_after: float) -> dict[str, object]:
    stop, release = threading.Event(), threading.Event()
    counts: dict[str, int] = {}
    workers: list[threading.Thread] = []
    with tempfile.TemporaryDirectory() as tmp:
        if churn:
            targets: list[Callable[..., None]] = [_logging, _alloc, _config]
            workers = [threading.Thread(target=t, args=(stop, counts), daemon=True)
                       for t in targets]
            workers.append(threading.Thread(target=_imports, args=(stop, counts, Path(tmp)),
                                            daemon=True))
        if held_lock:
            workers.append(threading.Thread(target=_held_lock, args=(stop, counts, release),
                                            daemon=True))
        for worker in workers:
            worker.start()
        in_spawn: list[tuple[int, float] | None] = [None]  # (which spawn, since when)
        engines: set[int] = set()
        hung: set[int] = set()

        def watchdog() -> None:
            while not stop.wait(0.5):
                current = in_spawn[0]
                if current is not None and time.monotonic() - current[1] > hang_after:
                    hung.add(current[0])
                    for pid in _children() - engines:
                        os.kill(pid, signal.SIGKILL)
                    release.set()
                    in_spawn[0] = (current[0], time.monotonic())  # and watch it again

        threading.Thread(target=watchdog, daemon=True).start()
        times = []
        for index in range(spawns):
            in_spawn[0] = (index, time.monotonic())
            start = time.perf_counter()
            proc = EngineProcess(["true"], {"PATH": os.defpath})
            times.append(time.perf_counter() - start)
            in_spawn[0] = None
            engines.add(proc.pid)
            proc.stdout.close()
            proc.stderr.close()
            proc.reaped(os.waitpid(proc.pid, 0)[1])
            engines.discard(proc.pid)
        stop.set()
        release.set()
        for worker in workers:
            worker.join()
    times.sort()
    return {"cuzkd": str(Path(cuzkd.__file__).parent.parent), "spawns": spawns,
            "churn": counts, "hung": len(hung),
            "p50_ms": round(statistics.median(times) * 1e3, 1),
            "p90_ms": round(times[int(len(times) * 0.9)] * 1e3, 1),
            "p99_ms": round(times[int(len(times) * 0.99)] * 1e3, 1),
            "max_ms": round(times[-1] * 1e3, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spawns", type=int, default=500)
    parser.add_argument("--churn", action="store_true")
    parser.add_argument("--held-lock", action="store_true")
    parser.add_argument("--hang-after", type=float, default=10.0)
    args = parser.parse_args()
    print(run(args.spawns, args.churn, args.held_lock, args.hang_after))


if __name__ == "__main__":
    main()
