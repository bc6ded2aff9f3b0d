"""Busy time derived from 1 s polls of a plain cuzk ``/status`` against the engine's own spans.

Runs the cuzk stand-in (tests/support/cuzk_standin.py) with 4 GPU workers twice at once: ``full``
(a worker takes the next partition the moment it ends one: it often moves from one partition to
the next between two polls) and ``gaps`` (a worker rests 0-2 s after each GPU run). GPU runs last
0.5-8 s; ``--in-flight`` PoRep C2 jobs are kept in flight over gRPC ``Prove``. Every second the
bench fetches ``/status`` and records the document with the time it arrived; the stand-in
records each GPU run it made (``CUZK_STANDIN_SPANS``). Then the documents go through
:class:`~cuzkd.status.derive.ExtensionDeriver` (the supervisor's deriver) on their recorded
times, and per worker the derived ``busy_seconds_total`` is set against the true busy time up
to the last poll, as a share of the window; and the GPU runs no document showed are counted.

    .venv/bin/python bench/busy_exact.py [--secs 600] [--out DIR]
    .venv/bin/python bench/busy_exact.py --replay DIR    # the recorded documents, again

``--replay`` runs the recorded documents through the deriver on their recorded times (with
``PYTHONPATH`` set to another checkout: that checkout's deriver, for before/after figures).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

from cuzkd.status.derive import ExtensionDeriver  # noqa: E402
from cuzkd.status.document import decode_status  # noqa: E402

SCENARIOS = {"full": "0", "gaps": "2"}  # scenario -> CUZK_STANDIN_GPU_REST_MAX


async def fetch_status(port: int) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"GET /status HTTP/1.1\r\nHost: x\r\n\r\n")
    raw = await reader.read()
    writer.close()
    return raw.partition(b"\r\n\r\n")[2]


class Clock:
    """The replay's virtual clock: each document's recorded time."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def derive(out: Path) -> tuple[dict[int, float], float, float]:
    """(derived busy seconds per worker, first poll, last poll) of the recorded documents."""
    clock = Clock()
    deriver = ExtensionDeriver(clock=clock)
    times = []
    for line in (out / "documents.jsonl").read_text().splitlines():
        record = json.loads(line)
        clock.now = record["t"]
        times.append(clock.now)
        deriver.observe(decode_status(record["doc"]))
    busy = {w.worker_id: w.busy_seconds_total for w in deriver.extensions().worker_busy}
    return busy, times[0], times[-1]


def unseen_spans(out: Path, last: float) -> tuple[int, int, float]:
    """(spans begun by the last poll, those no document showed, their seconds): the spans
    invisible to ``/status``."""
    shown: dict[int, list[float]] = {}  # worker -> span starts the documents imply
    for line in (out / "documents.jsonl").read_text().splitlines():
        record = json.loads(line)
        for worker in json.loads(record["doc"])["gpu_workers"]:
            if worker["busy_secs"] is not None:
                shown.setdefault(worker["worker_id"], []).append(record["t"] - worker["busy_secs"])
    spans = [span for span in map(json.loads, (out / "spans.jsonl").read_text().splitlines())
             if span["start"] <= last]
    unseen = [s for s in spans if not any(abs(start - s["start"]) < 0.25
                                          for start in shown.get(s["worker"], []))]
    return len(spans), len(unseen), sum(s["end"] - s["start"] for s in unseen)


def true_busy(out: Path, first: float, last: float) -> dict[int, float]:
    """The stand-in's recorded GPU runs clipped to the polled window."""
    busy: dict[int, float] = {}
    for line in (out / "spans.jsonl").read_text().splitlines():
        span = json.loads(line)
        seconds = max(0.0, min(span["end"], last) - max(span["start"], first))
        busy[span["worker"]] = busy.get(span["worker"], 0.0) + seconds
    return busy


def report(name: str, out: Path) -> None:
    derived, first, last = derive(out)
    truth = true_busy(out, first, last)
    window = last - first
    print(f"== {name}: window {window:.1f} s, {len(truth)} workers")
    worst = 0.0
    for worker in sorted(truth):
        error = derived.get(worker, 0.0) - truth[worker]
        worst = max(worst, abs(error) / window)
        print(f"worker {worker}: true {truth[worker]:.1f} s, derived "
              f"{derived.get(worker, 0.0):.1f} s, error {error:+.2f} s "
              f"({100 * error / window:+.2f} % of the window)")
    print(f"worst |error|: {100 * worst:.2f} % of the window")
    spans, unseen, unseen_secs = unseen_spans(out, last)
    print(f"GPU runs: {spans}; never shown by /status: {unseen} ({unseen_secs:.1f} s, "
          f"{100 * unseen_secs / sum(truth.values()):.2f} % of the busy time)")


def start_engine(name: str, rest_max: str, out: Path) -> tuple[subprocess.Popen[bytes], int,
                                                                str]:
    """The stand-in of one scenario: (process, /status port, gRPC address)."""
    sys.path.insert(0, str(REPO / "tests"))  # support: the stand-in and its load
    from support.cuzk_standin import SCRIPT, write_cuzk_toml
    from support.ports import free_port

    out.mkdir(parents=True, exist_ok=True)
    for stale in ("documents.jsonl", "spans.jsonl"):
        (out / stale).unlink(missing_ok=True)
    port = free_port()
    listen = f"unix://{out}/grpc.sock"
    config = write_cuzk_toml(out / "cuzk.toml", listen, f"127.0.0.1:{port}",
                             '[memory]\ntotal_budget = "2000GiB"\n'
                             "[gpus]\ndevices = [0, 1]\ngpu_workers_per_device = 2\n")
    env = {**os.environ, "CUZK_STANDIN_SYNTH_SECS": "0.5", "CUZK_STANDIN_GPU_SECS": "0.5",
           "CUZK_STANDIN_GPU_SECS_MAX": "8", "CUZK_STANDIN_GPU_REST_MAX": rest_max,
           "CUZK_STANDIN_SEED": name, "CUZK_STANDIN_SPANS": str(out / "spans.jsonl")}
    engine = subprocess.Popen([sys.executable, str(SCRIPT), "-c", str(config)], env=env,
                              stdout=subprocess.DEVNULL)
    return engine, port, listen


async def poll_scenario(port: int, listen: str, secs: float, in_flight: int,
                        documents: Path) -> None:
    """Poll ``/status`` every second for ``secs`` under a steady load, recording each document
    with the time it arrived."""
    from support.cuzk_load import Load

    while True:
        try:
            await fetch_status(port)
            break
        except OSError:
            await asyncio.sleep(0.1)
    load = Load(listen, ["porep-c2"])
    deadline = time.monotonic() + secs
    with documents.open("w") as sink:
        while True:
            body = await fetch_status(port)
            sink.write(json.dumps({"t": time.monotonic(), "doc": body.decode()}) + "\n")
            if not load.tasks:  # the first poll saw the engine idle
                load.steady(in_flight)
            if time.monotonic() >= deadline:
                break
            await asyncio.sleep(1.0)
    await load.stop()
    await asyncio.sleep(9)  # the GPU runs still going end and are recorded


async def run_live(args: argparse.Namespace) -> None:
    engines = {name: start_engine(name, rest, args.out / name)
               for name, rest in SCENARIOS.items()}
    try:
        await asyncio.gather(*(poll_scenario(port, listen, args.secs, args.in_flight,
                                             args.out / name / "documents.jsonl")
                               for name, (_, port, listen) in engines.items()))
    finally:
        for engine, _, _ in engines.values():
            engine.terminate()
            engine.wait(30)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--secs", type=float, default=600.0)
    parser.add_argument("--in-flight", type=int, default=3)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--replay", type=Path)
    args = parser.parse_args()
    if args.replay is not None:
        for name in SCENARIOS:
            report(name, args.replay / name)
        return
    with tempfile.TemporaryDirectory() as tmp:
        args.out = args.out or Path(tmp)
        asyncio.run(run_live(args))
        for name in SCENARIOS:
            report(name, args.out / name)


if __name__ == "__main__":
    main()
