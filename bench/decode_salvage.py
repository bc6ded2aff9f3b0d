"""Cost of salvaging a status document with odd values: ``python bench/decode_salvage.py``.

Decodes a busy engine's 1 MB pretty-printed plain cuzk document (``tests/support/big_status``)
through :class:`~cuzkd.status.document.StatusDecoder`, as the supervisor does at each poll:

* ``clean``: the strict fast path;
* ``wrapped``: ``buffers.synth_in_flight`` = 2**64 - 1, as a real cuzk proving PoSt serves it:
  the strict decode fails and the document is salvaged;
* ``every partition odd``: every partition's ``gpu_ms`` wrapped -- the worst a document of this
  size makes the salvage do (each record taken apart field by field).

Each is timed warm (the same decoder, the same document again: the partition reuse applies, as
between two polls of an engine whose jobs did not move) and cold (a fresh decoder each time:
every partition decoded). Prints the median of ``--repeat`` runs in milliseconds.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))  # support.big_status

from support.big_status import big_document  # noqa: E402

from cuzkd.status.document import StatusDecoder  # noqa: E402

WRAPPED = 2**64 - 1


def documents() -> dict[str, bytes]:
    clean = big_document(2**20, extensions=False)
    wrapped = json.loads(clean)
    wrapped["buffers"]["synth_in_flight"] = WRAPPED
    odd = json.loads(clean)
    for pipeline in odd["pipelines"]:
        for partition in pipeline["partitions"]:
            partition["gpu_ms"] = WRAPPED
    return {"clean": clean,
            "wrapped": json.dumps(wrapped, indent=2).encode(),
            "every partition odd": json.dumps(odd, indent=2).encode()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--repeat", type=int, default=50)
    args = parser.parse_args()
    bodies = documents()
    runs: dict[tuple[str, str], Callable[[], object]] = {}
    for name, body in bodies.items():
        warm = StatusDecoder()
        warm.decode(body)
        runs[name, "warm"] = partial(warm.decode, body)
        runs[name, "cold"] = partial(cold, body)
    times: dict[tuple[str, str], list[float]] = {key: [] for key in runs}
    for _ in range(args.repeat):  # interleaved: a load that varies shifts all of them alike
        for key, run in runs.items():
            started = time.perf_counter()
            run()
            times[key].append(time.perf_counter() - started)
    ms = {key: statistics.median(t) * 1000 for key, t in times.items()}
    for name, body in bodies.items():
        errors = sum(StatusDecoder().decode(body).field_error_counts.values())
        print(f"{name:<20} {len(body) / 2**20:.2f} MB, {errors:>4} field error(s): "
              + ", ".join(f"{how} {ms[name, how]:.2f} ms ({ms[name, how] / ms['clean', how]:.1f}x)"
                          for how in ("warm", "cold")))


def cold(body: bytes) -> object:
    return StatusDecoder().decode(body)


if __name__ == "__main__":
    main()
