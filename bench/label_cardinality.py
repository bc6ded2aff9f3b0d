"""Benchmark of one hostile engine's document: distinct label values against /metrics size.

Run by hand: ``.venv/bin/python bench/label_cardinality.py`` (the issue's reproduction: one
document naming 100,000 distinct proof kinds, and one naming 100,000 GPU workers). Each case
runs in a child process of its own, so its peak resident memory is its own: the child decodes
the document with the supervisor's :class:`~cuzkd.status.document.StatusDecoder`, folds it into
an :class:`~cuzkd.status.derive.ExtensionDeriver` when it is a plain cuzk document, and renders
``/metrics`` twice with :func:`cuzkd.metrics.http.render` (the second render is what every
later scrape of the same document costs). Printed per case: the document's size, the
exposition's size and series count, each render's wall time, the child's peak RSS.

Cases (``--case``): ``counted-kinds`` (a plain cuzk document counting each kind in
``completed_by_kind``/``failed_by_kind``: 3.6 MB for 100,000 kinds, within the supervisor's
16 MB body cap), ``kinds`` (each kind also in ``cuzkd_extensions``: phase transitions and three
histograms), ``plain-kinds`` (one listed job per kind in a plain cuzk document: the deriver
builds every kind's histograms), ``workers`` (``gpu_workers`` and ``worker_busy``), ``gpus``
(``gpu_devices``). The last four are over the body cap at 100,000 (a fetch would refuse them):
they show what the exporter and the deriver do with that many values.

``--supervisor`` runs the real thing: ``cuzkd run`` with two engines serving fixed documents
(``bench/scrape.py --serve-document``), one the ``counted-kinds`` document, one a sane one,
and times ``--scrapes`` scrapes of ``/metrics``: bytes, whether the body arrived whole, seconds;
then the supervisor's peak RSS and how often its freeze watch saw it not run.

Figures go to docs/benchmarks.md (section "Label cardinality: one hostile document").
"""

from __future__ import annotations

import argparse
import asyncio
import http.client
import json
import resource
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

import scrape  # bench/scrape.py: its document engine and readiness wait

from cuzkd.metrics.http import render
from cuzkd.metrics.sample import EngineSample, SupervisorSample
from cuzkd.status.derive import ExtensionDeriver
from cuzkd.status.document import DURATION_BUCKETS, JOB_DURATION_BUCKETS, StatusDecoder

CASES = ("counted-kinds", "kinds", "plain-kinds", "workers", "gpus")
#: the cases whose document is cuzk's plain one (no ``cuzkd_extensions``)
PLAIN = ("counted-kinds", "plain-kinds")
#: the cases whose kinds are counted in ``completed_by_kind``/``failed_by_kind``
COUNTED = ("counted-kinds", "kinds")


def _histogram(bounds: tuple[float, ...]) -> dict[str, Any]:
    return {"bounds": list(bounds), "bucket_counts": [1] * len(bounds), "count": 1, "sum": 0.5}


def document(case: str, n: int) -> bytes:
    """A cuzk document (with extensions unless plain) with ``n`` distinct values."""
    kinds = [f"kind-{i:06d}" for i in range(n)] if "kinds" in case else []
    workers = range(n) if case == "workers" else range(2)
    pipelines = [{"job_id": f"job-{i}", "proof_kind": kind, "started_secs_ago": 1.0,
                  "total_partitions": 1, "partitions_done": 0,
                  "partitions": [{"index": 0, "state": "synthesizing", "synth_ms": 5,
                                  "gpu_ms": None}]}
                 for i, kind in enumerate(kinds)] if case == "plain-kinds" else []
    doc: dict[str, Any] = {
        "uptime_secs": 100.0,
        "memory": {"total_bytes": 2**30, "used_bytes": 0, "available_bytes": 2**30},
        "synthesis": {"max_concurrent": 4, "active": 0},
        "pipelines": pipelines,
        "gpu_workers": [{"worker_id": w, "gpu_ordinal": w // 2, "state": "idle",
                         "current_job": None, "current_partition": None, "busy_secs": None}
                        for w in workers],
        "allocations": {"srs": [], "pce": []},
        "counters": {"total_completed": 0, "total_failed": 0,
                     "completed_by_kind": dict.fromkeys(kinds if case in COUNTED else (), 1),
                     "failed_by_kind": dict.fromkeys(kinds if case in COUNTED else (), 0),
                     "queue_depth": 0},
        "buffers": {"synth_in_flight": 0, "provers_in_flight": 0, "aux_in_flight": 0,
                    "shells_in_flight": 0, "pending_handles": 0},
    }
    if case not in PLAIN:
        phases = {"synthesizing": 1, "synth_done": 1, "gpu": 1, "done": 1, "failed": 0}
        doc["cuzkd_extensions"] = {
            "phase_transitions": dict.fromkeys(kinds, phases),
            "worker_busy": [{"worker_id": w, "gpu_ordinal": w // 2, "busy_seconds_total": 1.0}
                            for w in workers],
            "synth_duration_seconds": dict.fromkeys(kinds, _histogram(DURATION_BUCKETS)),
            "gpu_duration_seconds": dict.fromkeys(kinds, _histogram(DURATION_BUCKETS)),
            "job_duration_seconds": dict.fromkeys(kinds, _histogram(JOB_DURATION_BUCKETS)),
            "jobs_in_flight": 0,
            "gpu_devices": [{"gpu_ordinal": g, "name": "NVIDIA H100", "used_bytes": 0,
                             "total_bytes": 2**36, "pool_bytes": 0, "uuid": f"GPU-{g}"}
                            for g in range(n if case == "gpus" else 1)],
            "backend": "cuzk",
        }
    return json.dumps(doc).encode()


def run_case(case: str, n: int) -> dict[str, Any]:
    """Decode and render the document of one case in this process."""
    body = document(case, n)
    decoded = StatusDecoder().decode(body).document
    extensions = decoded.cuzkd_extensions
    if extensions is None:
        deriver = ExtensionDeriver()
        deriver.observe(decoded)
        extensions = deriver.extensions()
    engine = EngineSample(
        name="e0", state="running", restarts_total=0, exits_total={},
        start_time_seconds=1.7e9, resident_memory_bytes=None, cpu_seconds_total=None,
        status=decoded, extensions=extensions, fetch_duration_seconds=0.01,
        fetch_errors_total=0)
    sample = SupervisorSample(engines=[engine], zombies_reaped_total=0)
    seconds = []
    for _ in range(2):
        started = time.perf_counter()
        out = render(sample, accept="", accept_encoding="")
        seconds.append(time.perf_counter() - started)
    lines = out.body.count(b"\n") - 2 * out.body.count(b"\n# TYPE ")
    return {"case": case, "n": n, "document_mb": round(len(body) / 1e6, 2),
            "metrics_mb": round(len(out.body) / 1e6, 2), "series": lines,
            "render_s": [round(s, 3) for s in seconds],
            "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)}


def measure_supervisor(n: int, scrapes: int) -> None:
    """``--supervisor``: ``cuzkd run`` over a hostile engine and a sane one, scraped."""
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        lines = [f"[supervisor]\nstate_dir = {json.dumps(str(tmp / 'state'))}\n",
                 '[metrics]\nlisten = "127.0.0.1:0"\n']
        for name, body in (("bad", document("counted-kinds", n)), ("sane", document("gpus", 1))):
            (tmp / f"{name}.json").write_bytes(body)
            sock = tmp / f"{name}.sock"
            command = [sys.executable, scrape.__file__, "--serve-document",
                       str(tmp / f"{name}.json"), "--socket", str(sock)]
            lines.append(f'[[engine]]\nname = "{name}"\ncommand = {json.dumps(command)}\n'
                         f'status_url = "unix:{sock}"\ndrain = "none"\n')
        (tmp / "cuzkd.toml").write_text("\n".join(lines))
        with (tmp / "cuzkd.log").open("wb") as log:
            proc = subprocess.Popen([sys.executable, "-m", "cuzkd", "run", "--config",
                                     str(tmp / "cuzkd.toml")], stdout=log, stderr=subprocess.STDOUT)
        try:
            address = asyncio.run(scrape.wait_ready(proc, tmp / "state" / "control.sock", 2))
            for i in range(scrapes):
                started = time.perf_counter()
                try:
                    with urllib.request.urlopen(f"http://{address}/metrics", timeout=120) as resp:
                        size, whole = len(resp.read()), True
                except http.client.IncompleteRead as exc:  # the supervisor cut the body
                    size, whole = len(exc.partial), False
                print(json.dumps({"scrape": i, "bytes": size, "whole": whole,
                                  "seconds": round(time.perf_counter() - started, 3)}))
            status = Path(f"/proc/{proc.pid}/status").read_text()
            peak = next(line.split()[1] for line in status.splitlines()
                        if line.startswith("VmHWM"))
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(60)
        freezes = (tmp / "cuzkd.log").read_text().count('"supervisor_resumed"')
        print(json.dumps({"supervisor_peak_rss_mb": int(peak) // 1024, "freezes": freezes}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--case", choices=CASES, action="append",
                        help="a case to run (repeatable; default: all)")
    parser.add_argument("-n", type=int, default=100_000, help="distinct values (100000)")
    parser.add_argument("--supervisor", action="store_true",
                        help="scrape a real `cuzkd run` (the counted-kinds document)")
    parser.add_argument("--scrapes", type=int, default=3, help="with --supervisor (3)")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.supervisor:
        measure_supervisor(args.n, args.scrapes)
        return
    if args.child:
        print(json.dumps(run_case(args.case[0], args.n)))
        return
    for case in args.case or CASES:
        out = subprocess.run([sys.executable, __file__, "--child", "--case", case,
                              "-n", str(args.n)], capture_output=True, text=True, check=True)
        print(out.stdout.strip())


if __name__ == "__main__":
    main()
