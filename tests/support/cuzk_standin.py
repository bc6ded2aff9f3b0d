"""A faithful stand-in for cuzk's daemon (``cuzk-daemon``), written from the reference facts.

    python tests/support/cuzk_standin.py [-c/--config PATH] [-l/--listen ADDR] [--log-level L]

What it does as the real one does:

- **Command line**: only ``-c/--config`` (default ``/data/zk/cuzk.toml``; a missing file means
  all defaults), ``-l/--listen`` and ``--log-level``. Anything else (``--version``, ``run``) is
  a usage error: clap's message on stderr, exit 2.
- **Its TOML**: ``[daemon] listen`` (gRPC: ``unix:///path`` or ``host:port``; default
  ``unix:///run/curio/cuzk.sock``; a stale socket file is removed at start, never at exit),
  ``[daemon] status_listen`` (TCP ``host:port`` of ``GET /status``; ``""``, the default, means
  none; a bind failure is logged as an ERROR and the daemon runs on without it), ``[gpus]
  devices`` (default ``[0]``: the stand-in runs no ``nvidia-smi``) and ``gpu_workers_per_device``
  (default 2; worker ids are global), ``[memory] total_budget`` (``"auto"`` = MemTotal -
  ``safety_margin``, or a whole number of GiB/MiB/GB/MB or bytes; any other spelling
  silently becomes 50 GiB, an unreadable number of MiB/MB 0), ``[pipeline]
  max_parallel_synthesis`` (18; 0 also means 18), ``[logging] level``.
  An unparseable file, a bad address or a gRPC bind failure: ``Error: ...`` on stderr, exit 1.
- **Logs**: tracing-subscriber's default text format with ANSI colours on stdout, one line per
  event (``<ts>Z  INFO cuzk_daemon: cuzk-daemon ready, serving on <listen>`` once gRPC is bound;
  job and partition events from ``cuzk_core::engine`` with ``key=value`` fields; an ERROR line
  for each failed partition).
- **Signals**: the first SIGINT stops dispatching (queued jobs and undispatched partitions stay
  where they are, dispatched partitions finish), logs ``received SIGINT, shutting down`` and
  never exits; later SIGINTs are ignored. SIGTERM and SIGHUP have no handler: death at once.
- **Work**: PoRep C2 jobs have 10 partitions, SnapDeals 16; each partition synthesizes (at most
  max(2, min(budget / 14 GiB, max_parallel_synthesis)) at once), then is pushed to the GPU work
  queue. WindowPoSt and WinningPoSt are synthesized whole, then pushed to that queue too; they
  are proved whole on a GPU worker and never appear in ``/status`` (the worker shows ``idle``
  there; ``GetStatus`` names the job).
- **GetStatus counts what cuzk's service counts** (``cuzk-server/src/service.rs``): per kind,
  ``pending`` is the jobs waiting in the scheduler's queue (not yet dispatched) and
  ``in_progress`` the GPU workers whose current job is of that kind; each GPU entry names the
  job its worker is proving, if any. A worker has a current job only while it proves an item,
  and loses it when that GPU run ends, failed or not. So a job whose pipeline has started but
  that is synthesizing, or waits in the GPU work queue, or was lost there (below), or was
  stranded by SIGINT, is counted in neither: ``GetStatus`` shows nothing of it (``/status``
  still lists a partitioned one). ``GetMetrics``' ``cuzk_running_jobs`` is the number of GPU
  workers with a current job (the sum of the ``in_progress`` counts), ``cuzk_queue_depth`` the
  scheduler's queue.
- **The GPU work queue loses work**: it is cuzk's ``PriorityWorkQueue``, a map keyed
  ``(job_seq, partition_idx)``; each GPU worker, when free, pops the lowest key. A partitioned
  job's ``job_seq`` comes from a per-process counter starting at 0, taken when its pipeline
  starts; a PoSt is always pushed under ``(0, 0)``. ``push`` is a map insert, so an item pushed
  under a key that still waits in the queue replaces the one there, silently: a second PoSt, or
  partition 0 of the process's first partitioned job, pushed while a PoSt waits (no worker free)
  loses that PoSt, and a PoSt pushed while that partition 0 waits loses the partition. The lost
  item's job never completes nor fails: its ``Prove``/``AwaitProof`` never returns. It is in
  neither of ``GetStatus``'s counts and on no GPU worker there, so ``GetStatus`` shows nothing
  of it; ``/status`` lists a lost partition's job in ``pipelines`` for good (a PoSt is never
  there). Nothing is logged. An item a worker has popped is safe.
- **Failed work is left behind**: a failed synthesis leaves the partition ``failed``, the job in
  ``pipelines`` for good and ``synthesis.active`` one too high; a failed GPU run leaves the
  partition ``done`` and its worker ``proving`` in ``/status`` until it starts another
  partition (``GetStatus`` shows that worker free); neither counts in ``total_failed``. The
  job's ``Prove`` answers FAILED.
- **/status**: a raw responder (one ``read()`` of at most 4096 bytes; a first line starting
  ``GET /status`` matches, anything else is a 404 ``text/plain``), compact JSON in cuzk's field
  order, completed jobs pruned 30 s after they finished when someone asks.
- **gRPC** ``cuzk.v1.ProvingEngine``: ``SubmitProof``, ``AwaitProof``, ``Prove``, ``GetStatus``
  (one entry per GPU worker, per-kind queues spelled ``porep_c2`` ... counted as above, totals
  of every kind),
  ``GetMetrics`` (Prometheus text), ``PreloadSRS``; ``CancelProof`` and ``EvictSRS`` answer
  ``false`` as the real ones do.

Stand-in-only knobs (environment variables; seconds may be fractions):

- ``CUZK_STANDIN_SYNTH_SECS`` (0.3): synthesis time of one partition;
  ``CUZK_STANDIN_GPU_SECS`` (0.05): GPU time of one partition;
  ``CUZK_STANDIN_POST_SYNTH_SECS`` (0.05): synthesis of a whole WindowPoSt or WinningPoSt,
  before it is pushed to the GPU work queue; ``CUZK_STANDIN_POST_SECS`` (0.2): its GPU time.
- ``CUZK_STANDIN_NVIDIA_SMI_SECS`` (0.03): CPU seconds each ``GetStatus`` burns, as the real
  one's ``nvidia-smi`` run does.
- ``CUZK_STANDIN_GPU_SECS_MAX`` (unset): each GPU run lasts a random time between
  ``GPU_SECS`` and this; ``CUZK_STANDIN_GPU_REST_MAX`` (0): after each GPU run of a partition
  its worker rests (idle) a random 0 to this many seconds before it pops the next item;
  ``CUZK_STANDIN_SEED``: the seed of both (default: random).
- ``CUZK_STANDIN_SPANS`` (unset): a file to which each GPU run of a partition is appended as it
  ends, one JSON line ``{"worker": ID, "start": S, "end": E}`` in ``CLOCK_MONOTONIC`` seconds
  (the host's clock, shared with a bench on the same host): the engine's true busy spans.
- ``CUZK_STANDIN_START_DELAY`` (0): seconds between start and binding the listeners (SRS
  preload, say); nothing answers meanwhile.
- ``CUZK_STANDIN_EXIT`` (unset) = 1, 2 or 101, after ``CUZK_STANDIN_EXIT_AFTER`` seconds
  (default 0: before the listeners): exit as cuzk does (``Error: ...``; clap's usage error; a
  panic ``thread 'main' panicked at ...`` with its location).
- ``CUZK_STANDIN_FAIL``: comma-separated ``JOB_ID:PARTITION`` (fails its synthesis) or
  ``JOB_ID:PARTITION:gpu`` (fails its GPU run).
- ``CUZK_STANDIN_CRASH_ON``: comma-separated request ids of poison requests: when such a job
  starts being proved (a PoSt's synthesis begins; a partitioned job's partition 0 begins
  synthesizing), the process dies by SIGSEGV, with no message and no core file, every time it
  is sent; ``CUZK_STANDIN_CRASH_AFTER`` (0) seconds after that start. A job only queued (not
  dispatched) does not crash it.
- ``CUZK_STANDIN_UNAVAILABLE``: comma-separated request ids whose ``Prove`` and ``SubmitProof``
  the engine itself answers with status UNAVAILABLE (``proving engine busy``), recording nothing
  and staying up and healthy. (cuzk's own service has no such answer today: this is for tests of
  what a caller does with one.)
- ``CUZK_STANDIN_NEVER_ANSWER``: comma-separated request ids that are accepted and dropped at
  once: ``SubmitProof`` answers as usual, but the job is never queued nor dispatched, never in
  ``/status`` nor in ``GetStatus``'s queues, and its ``Prove``/``AwaitProof`` never returns: a
  deterministic form of work cuzk will never answer.
- ``CUZK_STANDIN_IGNORE_SIGNALS=1``: ignore SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1/2 (only
  SIGKILL ends it: the engine of the issue's "Bad input").
- ``CUZK_STANDIN_MEMTOTAL``: MemTotal in bytes for ``total_budget = "auto"`` (default: the
  host's).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import re
import resource
import signal
import sys
import time
import tomllib
import uuid
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# grpc's C core writes its own errors on stderr; cuzk's stderr has only `Error: ...` and panics
os.environ.setdefault("GRPC_VERBOSITY", "NONE")
import grpc

from cuzkd.cuzk import proving_pb2 as pb

SCRIPT = Path(__file__).resolve()
GIB = 1 << 30
MIB = 1 << 20
DEFAULT_CONFIG = "/data/zk/cuzk.toml"
DEFAULT_LISTEN = "unix:///run/curio/cuzk.sock"
MESSAGE_LIMIT = 128 * MIB
COMPLETED_KEPT_SECS = 30.0

#: proof kind per gRPC enum value: (status kind, gRPC spelling, partitions or 0 = proved whole)
KINDS: dict[int, tuple[str, str, int]] = {
    pb.POREP_SEAL_COMMIT: ("porep-c2", "porep_c2", 10),
    pb.SNAP_DEALS_UPDATE: ("snap-update", "snap_update", 16),
    pb.WINDOW_POST_PARTITION: ("window-post", "window_post", 0),
    pb.WINNING_POST: ("winning-post", "winning_post", 0),
}
#: synthesis working set of one partition (the memory budget's unit)
PARTITION_BYTES = {"porep-c2": 14 * GIB, "snap-update": 9 * GIB,
                   "window-post": 14 * GIB, "winning-post": GIB // 2}
#: resident SRS / PCE once a kind has been proved
SRS = {"porep-c2": ("porep-32g", 44 * GIB, 26 * GIB),
       "snap-update": ("snap-32g", 33 * GIB, 17 * GIB),
       "window-post": ("wpost-32g", 57 * GIB, 26 * GIB),
       "winning-post": ("winning-32g", GIB // 5, 2 * GIB // 5)}
LEVELS = {"trace": 0, "debug": 1, "info": 2, "warn": 3, "error": 4}
LEVEL_COLOURS = {"TRACE": "35", "DEBUG": "34", "INFO": "32", "WARN": "33", "ERROR": "31"}


def write_cuzk_toml(path: Path, listen: str, status_listen: str, extra: str = "") -> Path:
    """A cuzk TOML for tests: its two addresses, then ``extra`` (more sections, verbatim)."""
    path.write_text(f"[daemon]\nlisten = {json.dumps(listen)}\n"
                    f"status_listen = {json.dumps(status_listen)}\n{extra}")
    return path


def knob(name: str, default: float) -> float:
    return float(os.environ.get(f"CUZK_STANDIN_{name}", default))


class Log:
    """tracing-subscriber's default format, ANSI colours on, flushed line by line to stdout."""

    def __init__(self, level: str) -> None:
        self.threshold = LEVELS.get(level.lower(), LEVELS["info"])

    def __call__(self, level: str, target: str, message: str, **fields: object) -> None:
        if LEVELS[level.lower()] < self.threshold:
            return
        now = time.time()
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(now)) + f".{int(now % 1 * 1e6):06d}Z"
        tail = "".join(
            f" \x1b[3m{key}\x1b[0m\x1b[2m=\x1b[0m{json.dumps(v) if isinstance(v, str) else v}"
            for key, v in fields.items()
        )
        sys.stdout.write(
            f"\x1b[2m{stamp}\x1b[0m \x1b[{LEVEL_COLOURS[level]}m{level:>5}\x1b[0m "
            f"\x1b[2m{target}\x1b[0m\x1b[2m:\x1b[0m {message}{tail}\n"
        )
        sys.stdout.flush()


def fail(message: str) -> None:
    """cuzk's ``main`` returning an error: anyhow's ``Error: ...``, exit 1."""
    sys.stderr.write(f"Error: {message}\n")
    sys.stderr.flush()
    os._exit(1)


def panic(message: str) -> None:
    """A Rust panic on the main thread: the message with its location, exit 101."""
    sys.stderr.write(
        f"\nthread 'main' panicked at cuzk-daemon/src/main.rs:212:14:\n{message}\n"
        "note: run with `RUST_BACKTRACE=1` environment variable to display a backtrace\n"
    )
    sys.stderr.flush()
    os._exit(101)


def usage(argument: str) -> None:
    """clap's error for an argument it does not know, exit 2."""
    sys.stderr.write(
        f"error: unexpected argument '{argument}' found\n\n"
        "Usage: cuzk-daemon [OPTIONS]\n\nFor more information, try '--help'.\n"
    )
    sys.stderr.flush()
    os._exit(2)


def parse_args(argv: list[str]) -> dict[str, str]:
    """``-c/--config``, ``-l/--listen``, ``--log-level`` in clap's spellings; nothing else."""
    names = {"-c": "config", "--config": "config", "-l": "listen", "--listen": "listen",
             "--log-level": "log_level"}
    out: dict[str, str] = {}
    rest = list(argv)
    while rest:
        arg = rest.pop(0)
        flag, eq, inline = arg.partition("=")
        if arg.startswith("-c") and len(arg) > 2 and not arg.startswith("--"):
            flag, eq, inline = "-c", "=", arg[2:]
        if flag not in names:
            usage(arg)
        if eq:
            out[names[flag]] = inline
        elif rest:
            out[names[flag]] = rest.pop(0)
        else:
            usage(arg)
    return out


def parse_budget(value: object, memtotal: int, margin: object) -> int:
    """``[memory] total_budget`` as cuzk reads it: trimmed, then a case-sensitive ``GiB``,
    ``MiB``, ``GB`` or ``MB`` suffix on a whole number, or whole bytes. A number it cannot read
    becomes 0 after ``MiB``/``MB`` and 50 GiB otherwise (``"256G"``, ``"1TiB"``, ``"1.5GiB"``)."""
    if value == "auto":
        return max(memtotal - parse_budget(margin, memtotal, "5GiB"), 0)
    text = str(value).strip()
    for suffix, unit, unreadable in (("GiB", GIB, 50 * GIB), ("MiB", MIB, 0),
                                     ("GB", 10**9, 50 * GIB), ("MB", 10**6, 0)):
        if text.endswith(suffix):
            number = text.removesuffix(suffix).strip()
            return int(number) * unit if re.fullmatch(r"\+?[0-9]+", number) else unreadable
    return int(text) if re.fullmatch(r"\+?[0-9]+", text) else 50 * GIB


def host_memtotal() -> int:
    if "CUZK_STANDIN_MEMTOTAL" in os.environ:
        return int(os.environ["CUZK_STANDIN_MEMTOTAL"])
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            return int(line.split()[1]) * 1024
    return 64 * GIB


@dataclass
class Partition:
    index: int
    state: str = "pending"
    synth_start: float | None = None
    synth_end: float | None = None
    gpu_start: float | None = None
    gpu_end: float | None = None

    def document(self, now: float) -> dict[str, Any]:
        return {"index": self.index, "state": self.state,
                "synth_ms": span_ms(self.synth_start, self.synth_end, now),
                "gpu_ms": span_ms(self.gpu_start, self.gpu_end, now)}


def span_ms(start: float | None, end: float | None, now: float) -> int | None:
    return None if start is None else int(((end or now) - start) * 1000)


@dataclass
class Job:
    job_id: str
    kind: str
    grpc_kind: str
    priority: int
    seq: int
    submitted: float
    partitions: list[Partition]
    done: asyncio.Event = field(default_factory=asyncio.Event)
    started: float | None = None
    finished: float | None = None
    failed: str = ""
    next_partition: int = 0
    synth_ms: int = 0
    gpu_ms: int = 0
    #: a partitioned job's ``job_seq`` (its partitions' keys in the GPU work queue are
    #: ``(job_seq, index)``), taken when its pipeline starts
    job_seq: int | None = None

    @property
    def partitioned(self) -> bool:
        return bool(self.partitions)

    def document(self, now: float) -> dict[str, Any]:
        return {"job_id": self.job_id, "proof_kind": self.kind,
                "started_secs_ago": round(now - (self.started or now), 3),
                "total_partitions": len(self.partitions),
                "partitions_done": sum(p.state == "done" for p in self.partitions),
                "partitions": [p.document(now) for p in self.partitions]}


@dataclass
class GpuWork:
    """One item of the GPU work queue: a synthesized partition, or a whole PoSt (no partition)."""

    job: Job
    partition: Partition | None = None


@dataclass
class Worker:
    worker_id: int
    gpu_ordinal: int
    busy: bool = False
    current_job: str | None = None
    current_partition: int | None = None
    busy_since: float | None = None
    #: the job cuzk's job tracker has on this worker, partitioned or PoSt: GetStatus names it
    #: and counts it ``in_progress`` (/status names only a partition, in the fields above). Set
    #: for the length of one GPU run and cleared when it ends, whatever the outcome.
    running: Job | None = None


class Engine:
    """cuzk's scheduler, synthesis limiter and GPU workers, with its status tracker's quirks."""

    def __init__(self, config: dict[str, Any], log: Log) -> None:
        self.log = log
        self.start = time.monotonic()
        gpus = config.get("gpus", {})
        devices = gpus.get("devices") or [0]
        per_device = int(gpus.get("gpu_workers_per_device", 2))
        ordinals = [device for device in devices for _ in range(per_device)]
        self.workers = [Worker(worker_id, ordinal) for worker_id, ordinal in enumerate(ordinals)]
        memory = config.get("memory", {})
        self.budget = parse_budget(memory.get("total_budget", "auto"), host_memtotal(),
                                   memory.get("safety_margin", "5GiB"))
        parallel = int(config.get("pipeline", {}).get("max_parallel_synthesis", 18)) or 18
        self.synth_cap = max(2, min(self.budget // (14 * GIB), parallel))
        self.synth_secs = knob("SYNTH_SECS", 0.3)
        self.gpu_secs = knob("GPU_SECS", 0.05)
        self.post_synth_secs = knob("POST_SYNTH_SECS", 0.05)
        self.post_secs = knob("POST_SECS", 0.2)
        self.gpu_secs_max = knob("GPU_SECS_MAX", self.gpu_secs)
        self.gpu_rest_max = knob("GPU_REST_MAX", 0)
        self.random = random.Random(os.environ.get("CUZK_STANDIN_SEED"))
        self.spans_path = os.environ.get("CUZK_STANDIN_SPANS", "")
        self.failures = parse_failures(os.environ.get("CUZK_STANDIN_FAIL", ""))
        self.crash_on = request_ids("CRASH_ON")
        self.crash_after = knob("CRASH_AFTER", 0)
        self.unavailable = request_ids("UNAVAILABLE")
        self.never_answer = request_ids("NEVER_ANSWER")
        #: jobs accepted and dropped at once (NEVER_ANSWER): AwaitProof finds them, nothing else
        self.dropped: dict[str, Job] = {}
        self.jobs: dict[str, Job] = {}
        self.queue: list[Job] = []
        self.dispatched: list[Job] = []
        self.synth_active = 0
        self.synth_leaked = 0
        self.in_gpu = 0
        self.aux_in_flight = 0
        self.shells_in_flight = 0
        #: cuzk's GPU work queue: (job_seq, partition_idx) -> item; workers pop the lowest key
        self.gpu_queue: dict[tuple[int, int], GpuWork] = {}
        #: the free GPU workers, longest free first, each waiting for its next item
        self.free_workers: deque[asyncio.Future[GpuWork]] = deque()
        self.dispatching = True
        self.seq = 0
        #: the next partitioned job's job_seq (per process, from 0, as cuzk's ``next_job_seq``)
        self.next_job_seq = 0
        self.total_completed = 0
        self.total_failed = 0
        self.completed_by_kind: dict[str, int] = {}
        self.all_completed = 0
        self.all_failed = 0
        #: gRPC kind spelling -> proofs of every kind completed / failed (GetMetrics)
        self.grpc_completed: dict[str, int] = {}
        self.grpc_failed: dict[str, int] = {}
        self.durations: list[float] = []
        self.srs_used: dict[str, float] = {}
        self.wake = asyncio.Event()
        self.tasks: set[asyncio.Task[None]] = set()

    def now(self) -> float:
        return time.monotonic()

    # --- submission -------------------------------------------------------------------------
    def submit(self, request: pb.SubmitProofRequest) -> Job:
        kind, grpc_kind, partitions = KINDS[request.proof_kind]
        job_id = request.request_id or str(uuid.uuid4())
        self.seq += 1
        job = Job(job_id, kind, grpc_kind, request.priority, self.seq, self.now(),
                  [Partition(i) for i in range(partitions)])
        if job_id in self.never_answer:  # accepted, then dropped: nothing will ever answer it
            self.dropped[job_id] = job
            self.log("INFO", "cuzk_core::engine", "proof request queued", job_id=job_id,
                     proof_kind=kind, queue_depth=len(self.queue))
            return job
        self.jobs[job_id] = job  # a retry reuses the id: the new job replaces the old entry
        self.queue.append(job)
        self.queue.sort(key=lambda j: (-j.priority, j.seq))
        self.log("INFO", "cuzk_core::engine", "proof request queued", job_id=job_id,
                 proof_kind=kind, queue_depth=len(self.queue))
        self.wake.set()
        return job

    # --- dispatch ---------------------------------------------------------------------------
    async def dispatcher(self) -> None:
        while True:
            await self.wake.wait()
            self.wake.clear()
            if self.dispatching:
                self.dispatch()

    def dispatch(self) -> None:
        for job in [j for j in self.queue if not j.partitioned]:
            self.queue.remove(job)
            job.started = self.now()
            self.log("INFO", "cuzk_core::engine", "proof job started", job_id=job.job_id,
                     proof_kind=job.kind)
            self.spawn(self.prove_whole(job))
        while self.synth_active < self.synth_cap:
            job = next((j for j in self.dispatched
                        if not j.failed and j.next_partition < len(j.partitions)), None)
            if job is None:
                job = next((j for j in self.queue if j.partitioned), None)
                if job is None:
                    return
                self.queue.remove(job)
                self.dispatched.append(job)
                job.started = self.now()
                job.job_seq, self.next_job_seq = self.next_job_seq, self.next_job_seq + 1
                self.log("INFO", "cuzk_core::engine", "proof job started", job_id=job.job_id,
                         proof_kind=job.kind, partitions=len(job.partitions))
            partition = job.partitions[job.next_partition]
            job.next_partition += 1
            self.synth_active += 1
            self.aux_in_flight += 1
            self.shells_in_flight += 1
            self.spawn(self.prove_partition(job, partition))

    def spawn(self, coroutine: Any) -> None:
        task = asyncio.get_running_loop().create_task(coroutine)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def prove_partition(self, job: Job, partition: Partition) -> None:
        """Synthesis of one partition, then its push to the GPU work queue."""
        if partition.index == 0:
            self.crash_if_poison(job)
        self.srs_used[job.kind] = self.now()
        partition.state, partition.synth_start = "synthesizing", self.now()
        await asyncio.sleep(self.synth_secs)
        partition.synth_end = self.now()
        job.synth_ms += int(self.synth_secs * 1000)
        if self.failures.get((job.job_id, partition.index)) == "synth":
            partition.state = "failed"
            self.synth_leaked += 1  # the tracker never decrements a failed synthesis
            self.synth_active -= 1
            self.wake.set()
            self.finish(job, f"synthesis of partition {partition.index} failed")
            return
        partition.state = "synth_done"
        self.synth_active -= 1
        self.wake.set()
        assert job.job_seq is not None
        self.push((job.job_seq, partition.index), GpuWork(job, partition))

    async def prove_whole(self, job: Job) -> None:
        """A PoSt: synthesized whole, then pushed under cuzk's fixed monolithic key ``(0, 0)``."""
        self.crash_if_poison(job)
        self.srs_used[job.kind] = self.now()
        await asyncio.sleep(self.post_synth_secs)
        job.synth_ms = int(self.post_synth_secs * 1000)
        self.push((0, 0), GpuWork(job))

    def push(self, key: tuple[int, int], work: GpuWork) -> None:
        """cuzk's ``PriorityWorkQueue::push`` is a map insert: an item still waiting under
        ``key`` is replaced and gone, without a word. Its job never finishes (see the module's
        docstring): the overwrite is the real engine's, so the stand-in has no way round it.

        A free worker pops at once, here, rather than when the loop next runs it: in cuzk the
        window between a push and a free worker's pop is a thread wake-up, and two pushes in
        one turn of this loop (timers that came due together) must not lose work that cuzk's
        free workers would have taken."""
        self.gpu_queue[key] = work
        while self.gpu_queue and self.free_workers:
            waiting = self.free_workers.popleft()
            if not waiting.done():
                waiting.set_result(self.gpu_queue.pop(min(self.gpu_queue)))

    async def next_work(self) -> GpuWork:
        """A free worker's pop: the lowest key, or the next item pushed."""
        if self.gpu_queue:
            return self.gpu_queue.pop(min(self.gpu_queue))
        waiting: asyncio.Future[GpuWork] = asyncio.get_running_loop().create_future()
        self.free_workers.append(waiting)
        return await waiting

    async def gpu_worker(self, worker: Worker) -> None:
        """One GPU worker's loop: when free, it pops the lowest key and proves that item."""
        while True:
            work = await self.next_work()
            if work.partition is None:
                await self.prove_post_gpu(worker, work.job)
            else:
                await self.prove_partition_gpu(worker, work.job, work.partition)
                rest = self.random.uniform(0, self.gpu_rest_max)
                if rest > 0:
                    await asyncio.sleep(rest)

    async def prove_partition_gpu(self, worker: Worker, job: Job, partition: Partition) -> None:
        self.in_gpu += 1
        picked_up = self.now()
        partition.state, partition.gpu_start = "gpu", picked_up
        worker.busy, worker.busy_since = True, picked_up
        worker.current_job, worker.current_partition = job.job_id, partition.index
        worker.running = job
        gpu_secs = self.random.uniform(self.gpu_secs, self.gpu_secs_max)
        await asyncio.sleep(gpu_secs)
        worker.running = None  # the job tracker's worker is freed even when the run failed
        self.in_gpu -= 1
        partition.gpu_end = self.now()
        partition.state = "done"
        job.gpu_ms += int(gpu_secs * 1000)
        self.record_span(worker, picked_up, partition.gpu_end)
        if self.failures.get((job.job_id, partition.index)) == "gpu":
            # the worker is left showing `proving` this partition until it starts another
            self.finish(job, f"GPU proving of partition {partition.index} failed")
            return
        if worker.current_job == job.job_id and worker.current_partition == partition.index:
            worker.busy, worker.current_job, worker.current_partition = False, None, None
            worker.busy_since = None
        if not job.failed and all(p.state == "done" for p in job.partitions):
            self.finish(job, "")

    async def prove_post_gpu(self, worker: Worker, job: Job) -> None:
        worker.running = job
        await asyncio.sleep(self.post_secs)
        worker.running = None
        job.gpu_ms = int(self.post_secs * 1000)
        self.finish(job, "")

    def record_span(self, worker: Worker, start: float, end: float) -> None:
        if self.spans_path:
            with open(self.spans_path, "a") as spans:
                spans.write(json.dumps({"worker": worker.worker_id, "start": start,
                                        "end": end}) + "\n")

    def crash_if_poison(self, job: Job) -> None:
        """A poison request (``CRASH_ON``) kills the engine each time it starts being proved."""
        if job.job_id not in self.crash_on:
            return
        if self.crash_after <= 0:
            segfault()
        asyncio.get_running_loop().call_later(self.crash_after, segfault)

    def finish(self, job: Job, error: str) -> None:
        job.finished = self.now()
        job.failed = error
        outcomes = self.grpc_failed if error else self.grpc_completed
        outcomes[job.grpc_kind] = outcomes.get(job.grpc_kind, 0) + 1
        if error:
            self.all_failed += 1
            self.log("ERROR", "cuzk_core::engine", "proof failed", job_id=job.job_id,
                     proof_kind=job.kind, error=error)
        else:
            self.all_completed += 1
            self.durations = [*self.durations[-999:], job.finished - job.submitted]
            if job.partitioned:
                self.total_completed += 1
                self.completed_by_kind[job.kind] = self.completed_by_kind.get(job.kind, 0) + 1
            self.log("INFO", "cuzk_core::engine", "proof completed", job_id=job.job_id,
                     proof_kind=job.kind, total_ms=int((job.finished - job.submitted) * 1000))
        if job in self.dispatched and job.next_partition == len(job.partitions):
            self.dispatched.remove(job)
        job.done.set()

    # --- /status ----------------------------------------------------------------------------
    def status_document(self) -> dict[str, Any]:
        now = self.now()
        for job_id, job in list(self.jobs.items()):
            if job.finished and not job.failed and now - job.finished > COMPLETED_KEPT_SECS:
                del self.jobs[job_id]
        shown = [j for j in self.jobs.values() if j.partitioned and j.started is not None]
        working = sum(PARTITION_BYTES[j.kind] for j in shown for p in j.partitions
                      if p.state == "synthesizing")
        resident = sum(SRS[k][1] + SRS[k][2] for k in self.srs_used)
        used = working + resident
        in_use = {j.kind for j in shown if j.finished is None}
        return {
            "uptime_secs": round(now - self.start, 3),
            "memory": {"total_bytes": self.budget, "used_bytes": used,
                       "available_bytes": max(self.budget - used, 0)},
            "synthesis": {"max_concurrent": self.budget // (9 * GIB),
                          "active": self.synth_active + self.synth_leaked},
            "pipelines": [j.document(now) for j in shown],
            "gpu_workers": [{
                "worker_id": w.worker_id, "gpu_ordinal": w.gpu_ordinal,
                "state": "proving" if w.busy else "idle", "current_job": w.current_job,
                "current_partition": w.current_partition,
                "busy_secs": None if w.busy_since is None else round(now - w.busy_since, 3),
            } for w in self.workers],
            "allocations": {
                "srs": [{"circuit_id": SRS[k][0], "bytes": SRS[k][1],
                         "last_used_secs_ago": round(now - t, 3), "evictable": k not in in_use}
                        for k, t in self.srs_used.items()],
                "pce": [{"circuit_id": SRS[k][0], "bytes": SRS[k][2],
                         "last_used_secs_ago": round(now - t, 3), "evictable": True}
                        for k, t in self.srs_used.items() if k not in in_use],
            },
            "counters": {"total_completed": self.total_completed, "total_failed": 0,
                         "completed_by_kind": dict(self.completed_by_kind),
                         "failed_by_kind": {}, "queue_depth": len(self.queue)},
            "buffers": {"synth_in_flight": self.synth_active, "provers_in_flight": self.in_gpu,
                        "aux_in_flight": self.aux_in_flight,
                        "shells_in_flight": self.shells_in_flight,
                        "pending_handles": sum(not j.done.is_set() for j in self.jobs.values())},
        }

    # --- gRPC answers ----------------------------------------------------------------------
    def grpc_status(self) -> pb.GetStatusResponse:
        reply = pb.GetStatusResponse(
            total_proofs_completed=self.all_completed, total_proofs_failed=self.all_failed,
            uptime_seconds=int(self.now() - self.start))
        running: dict[str, int] = {}
        for w in self.workers:
            current, kind = (w.running.job_id, w.running.grpc_kind) if w.running else ("", "")
            reply.gpus.add(ordinal=w.gpu_ordinal, name="NVIDIA Stand-in GPU",
                           vram_total_bytes=24 * GIB, vram_free_bytes=20 * GIB,
                           current_job_id=current, current_proof_kind=kind)
            if kind:
                running[kind] = running.get(kind, 0) + 1
        # as cuzk's service counts them: pending is the scheduler's queue, in_progress the GPU
        # workers on a job of the kind -- a job synthesizing, or waiting in the GPU work queue
        # (or lost there), is neither
        for kind, grpc_kind, _ in KINDS.values():
            reply.queues.add(proof_kind=grpc_kind,
                             pending=sum(j.kind == kind for j in self.queue),
                             in_progress=running.get(grpc_kind, 0))
        for kind in self.srs_used:
            reply.loaded_srs.add(circuit_id=SRS[kind][0], tier=pb.SRSStatus.HOT,
                                 size_bytes=SRS[kind][1])
        return reply

    def metrics_text(self) -> str:
        lines = [
            "# TYPE cuzk_proofs_completed_total counter",
            f"cuzk_proofs_completed_total {self.all_completed}",
            "# TYPE cuzk_proofs_failed_total counter",
            f"cuzk_proofs_failed_total {self.all_failed}",
            "# TYPE cuzk_uptime_seconds gauge",
            f"cuzk_uptime_seconds {int(self.now() - self.start)}",
            "# TYPE cuzk_queue_depth gauge",
            f"cuzk_queue_depth {len(self.queue)}",
            "# TYPE cuzk_running_jobs gauge",  # cuzk: its job tracker's workers with a job
            f"cuzk_running_jobs {sum(w.running is not None for w in self.workers)}",
            "# TYPE cuzk_gpu_workers gauge",
            f"cuzk_gpu_workers {len(self.workers)}",
            "# TYPE cuzk_proof_duration_seconds summary",
            f"cuzk_proof_duration_seconds_sum {sum(self.durations):.3f}",
            f"cuzk_proof_duration_seconds_count {len(self.durations)}",
        ]
        for name, counts in (("cuzk_proofs_completed", self.grpc_completed),
                             ("cuzk_proofs_failed", self.grpc_failed)):
            lines.append(f"# TYPE {name} counter")
            lines.extend(f'{name}{{proof_kind="{kind}"}} {n}' for kind, n in counts.items())
        return "\n".join(lines) + "\n"


#: CPU seconds the real engine spends per GetStatus running nvidia-smi ("tens of milliseconds")
NVIDIA_SMI_SECS = 0.03


def nvidia_smi(cpu_seconds: float) -> None:
    """What one GetStatus costs the real engine: ``nvidia-smi``'s CPU time, burnt here (a busy
    loop on the process's CPU clock, so a measurement of the engine's CPU sees it)."""
    until = time.process_time() + cpu_seconds
    while time.process_time() < until:
        pass


def request_ids(name: str) -> frozenset[str]:
    """A knob naming request ids, comma-separated (Curio's ids have spaces, never commas)."""
    spec = os.environ.get(f"CUZK_STANDIN_{name}", "")
    return frozenset(filter(None, (s.strip() for s in spec.split(","))))


def segfault() -> None:
    """Die as a crash in cuzk's native code does: killed by SIGSEGV, nothing on stderr. The
    default action is restored first (a faulthandler, PYTHONFAULTHANDLER, would print a Python
    traceback), and core dumps are off so that no core file lands in the working directory."""
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    signal.signal(signal.SIGSEGV, signal.SIG_DFL)
    os.kill(os.getpid(), signal.SIGSEGV)
    while True:  # the signal may be taken by another thread: the process is going all the same
        signal.pause()


def parse_failures(spec: str) -> dict[tuple[str, int], str]:
    failures: dict[tuple[str, int], str] = {}
    for item in filter(None, (s.strip() for s in spec.split(","))):
        phase = "gpu" if item.endswith(":gpu") else "synth"
        job_id, _, index = item.removesuffix(":gpu").rpartition(":")
        failures[(job_id, int(index))] = phase
    return failures


# --- the two listeners ---------------------------------------------------------------------
def http_response(status: str, content_type: str, body: bytes, cors: bool) -> bytes:
    head = f"HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {len(body)}\r\n"
    if cors:
        head += "Access-Control-Allow-Origin: *\r\n"
    return (head + "Connection: close\r\n\r\n").encode() + body


async def serve_status(engine: Engine, reader: asyncio.StreamReader,
                       writer: asyncio.StreamWriter) -> None:
    """cuzk's hand-written responder: one read, a prefix match, then close."""
    with contextlib.suppress(OSError):
        request = await reader.read(4096)
        if request.startswith(b"GET /status"):
            body = json.dumps(engine.status_document(), separators=(",", ":")).encode()
            writer.write(http_response("200 OK", "application/json", body, cors=True))
        else:
            writer.write(http_response("404 Not Found", "text/plain", b"404 Not Found\n",
                                       cors=False))
        await writer.drain()
    writer.close()


class ProvingEngine:
    """The gRPC methods, as the real service answers them."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    async def SubmitProof(self, request: pb.SubmitProofRequest,
                          context: grpc.aio.ServicerContext) -> pb.SubmitProofResponse:
        if request.proof_kind not in KINDS:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "unknown proof kind")
        await self.refuse_if_unavailable(request, context)
        job = self.engine.submit(request)
        return pb.SubmitProofResponse(job_id=job.job_id, queue_position=len(self.engine.queue))

    async def AwaitProof(self, request: pb.AwaitProofRequest,
                         context: grpc.aio.ServicerContext) -> pb.AwaitProofResponse:
        job = self.engine.jobs.get(request.job_id) or self.engine.dropped.get(request.job_id)
        if job is None:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"job {request.job_id} not found")
        assert job is not None
        await job.done.wait()
        return result_of(job)

    async def Prove(self, request: pb.ProveRequest,
                    context: grpc.aio.ServicerContext) -> pb.ProveResponse:
        if request.submit.proof_kind not in KINDS:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "unknown proof kind")
        await self.refuse_if_unavailable(request.submit, context)
        job = self.engine.submit(request.submit)
        await job.done.wait()
        return pb.ProveResponse(result=result_of(job))

    async def refuse_if_unavailable(self, request: pb.SubmitProofRequest,
                                    context: grpc.aio.ServicerContext) -> None:
        """``UNAVAILABLE`` ids: the engine's own refusal, the process up and well."""
        if request.request_id in self.engine.unavailable:
            await context.abort(grpc.StatusCode.UNAVAILABLE, "proving engine busy")

    async def CancelProof(self, request: pb.CancelProofRequest,
                          context: grpc.aio.ServicerContext) -> pb.CancelProofResponse:
        return pb.CancelProofResponse(was_running=False)

    async def GetStatus(self, request: pb.GetStatusRequest,
                        context: grpc.aio.ServicerContext) -> pb.GetStatusResponse:
        nvidia_smi(knob("NVIDIA_SMI_SECS", NVIDIA_SMI_SECS))
        return self.engine.grpc_status()

    async def GetMetrics(self, request: pb.GetMetricsRequest,
                         context: grpc.aio.ServicerContext) -> pb.GetMetricsResponse:
        return pb.GetMetricsResponse(prometheus_text=self.engine.metrics_text())

    async def PreloadSRS(self, request: pb.PreloadSrsRequest,
                         context: grpc.aio.ServicerContext) -> pb.PreloadSrsResponse:
        kind = next((k for k, v in SRS.items() if v[0] == request.circuit_id), None)
        loaded = kind in self.engine.srs_used
        if kind is not None:
            self.engine.srs_used[kind] = self.engine.now()
        return pb.PreloadSrsResponse(already_loaded=loaded)

    async def EvictSRS(self, request: pb.EvictSrsRequest,
                       context: grpc.aio.ServicerContext) -> pb.EvictSrsResponse:
        return pb.EvictSrsResponse(was_loaded=False, freed_bytes=0)


def result_of(job: Job) -> pb.AwaitProofResponse:
    status = pb.AwaitProofResponse.FAILED if job.failed else pb.AwaitProofResponse.COMPLETED
    total = int(((job.finished or job.submitted) - job.submitted) * 1000)
    queued = int(((job.started or job.submitted) - job.submitted) * 1000)
    return pb.AwaitProofResponse(
        job_id=job.job_id, status=status, error_message=job.failed,
        proof=b"" if job.failed else b"\x00" * 192 * max(len(job.partitions), 1),
        queue_wait_ms=queued, synthesis_ms=job.synth_ms, gpu_compute_ms=job.gpu_ms,
        total_ms=total)


def grpc_handlers(service: ProvingEngine) -> grpc.GenericRpcHandler:
    requests = {"SubmitProof": pb.SubmitProofRequest, "AwaitProof": pb.AwaitProofRequest,
                "Prove": pb.ProveRequest, "CancelProof": pb.CancelProofRequest,
                "GetStatus": pb.GetStatusRequest, "GetMetrics": pb.GetMetricsRequest,
                "PreloadSRS": pb.PreloadSrsRequest, "EvictSRS": pb.EvictSrsRequest}
    methods = {
        name: grpc.unary_unary_rpc_method_handler(
            getattr(service, name), request_deserializer=message.FromString,
            response_serializer=lambda reply: reply.SerializeToString())
        for name, message in requests.items()
    }
    return grpc.method_handlers_generic_handler("cuzk.v1.ProvingEngine", methods)


def tcp_address(address: str) -> tuple[str, int]:
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit():
        fail(f"invalid listen address {address!r}")
    return host.strip("[]") or "0.0.0.0", int(port)


def remove_stale_socket(path: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        path.unlink()


async def start_grpc(engine: Engine, listen: str) -> grpc.aio.Server:
    options = [("grpc.max_receive_message_length", MESSAGE_LIMIT),
               ("grpc.max_send_message_length", MESSAGE_LIMIT)]
    server = grpc.aio.server(options=options)
    server.add_generic_rpc_handlers((grpc_handlers(ProvingEngine(engine)),))
    if listen.startswith("unix://"):
        path = Path(listen.removeprefix("unix://"))
        remove_stale_socket(path)  # from an earlier run: cuzk removes it at start, never at exit
        target = f"unix:{path}"
    else:
        host, port = tcp_address(listen)
        target = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    try:
        server.add_insecure_port(target)
    except RuntimeError as exc:
        fail(f"failed to bind gRPC listener on {listen}: {exc}")
    await server.start()
    return server


def read_config(path: str) -> dict[str, Any]:
    try:
        text = Path(path).read_text()
    except FileNotFoundError:
        return {}
    except OSError as exc:
        fail(f"failed to read config file {path}: {exc}")
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        fail(f"failed to parse config file {path}: TOML parse error: {exc}")
    return {}


def install_signals(loop: asyncio.AbstractEventLoop, engine: Engine, log: Log) -> None:
    if os.environ.get("CUZK_STANDIN_IGNORE_SIGNALS") == "1":
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT,
                    signal.SIGUSR1, signal.SIGUSR2):
            signal.signal(sig, signal.SIG_IGN)
        return

    def first_sigint() -> None:
        log("INFO", "cuzk_daemon", "received SIGINT, shutting down")
        engine.dispatching = False
        loop.remove_signal_handler(signal.SIGINT)
        signal.signal(signal.SIGINT, signal.SIG_IGN)

    loop.add_signal_handler(signal.SIGINT, first_sigint)


def forced_exit() -> Callable[[], None] | None:
    code = os.environ.get("CUZK_STANDIN_EXIT")
    if code == "1":
        return lambda: fail("stand-in: forced error (CUZK_STANDIN_EXIT=1)")
    if code == "2":
        return lambda: usage("--stand-in-forced")
    if code == "101":
        return lambda: panic("called `Result::unwrap()` on an `Err` value: stand-in forced panic")
    return None


async def main(argv: list[str]) -> None:
    args = parse_args(argv)
    config = read_config(args.get("config", DEFAULT_CONFIG))
    daemon = config.get("daemon", {})
    level = args.get("log_level") or os.environ.get("RUST_LOG") or config.get(
        "logging", {}).get("level", "info")
    log = Log(level)
    loop = asyncio.get_running_loop()
    engine = Engine(config, log)
    install_signals(loop, engine, log)
    exit_now = forced_exit()
    exit_after = knob("EXIT_AFTER", 0)
    if exit_now and exit_after <= 0:
        exit_now()
    if exit_now:
        loop.call_later(exit_after, exit_now)
    listen = args.get("listen") or daemon.get("listen", DEFAULT_LISTEN)
    log("INFO", "cuzk_daemon", "starting cuzk-daemon", config=args.get("config", DEFAULT_CONFIG),
        gpu_workers=len(engine.workers), synthesis_cap=engine.synth_cap)
    await asyncio.sleep(knob("START_DELAY", 0))
    server = await start_grpc(engine, listen)
    log("INFO", "cuzk_daemon", f"cuzk-daemon ready, serving on {listen}")
    status_listen = daemon.get("status_listen", "")
    if status_listen:
        host, port = tcp_address(status_listen)
        try:
            await asyncio.start_server(lambda r, w: serve_status(engine, r, w), host, port)
            log("INFO", "cuzk_daemon", f"status endpoint listening on {status_listen}")
        except OSError as exc:
            log("ERROR", "cuzk_daemon", "failed to bind status listener", addr=status_listen,
                error=str(exc))
    engine.spawn(engine.dispatcher())
    for worker in engine.workers:
        engine.spawn(engine.gpu_worker(worker))
    await server.wait_for_termination()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1:]))
