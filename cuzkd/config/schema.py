"""What a cuzkd config is: the typed structs a TOML file decodes into, and their defaults.

Every field's type, range and default is stated here once, so the loader
(:mod:`cuzkd.config.loading`) can hand the decoding to msgspec and the checks
(:mod:`cuzkd.config.checks`) add only the rules between fields. Durations and sizes are their
own types (:class:`Seconds`, :class:`Bytes`) so the decoder resolves them to float seconds and
int bytes at load, and nothing downstream parses strings. When the file names no engine, the
embedded default runs one bundled engine per GPU the driver shows. What the structs imply
(addresses, paths, an engine's argv) is derived in :mod:`cuzkd.config.addresses`.

The structs are frozen and compare by value: a SIGHUP reload diffs engines with ``==``.
"""

from __future__ import annotations

import enum
import signal
from pathlib import Path
from typing import Annotated

import msgspec

from cuzkd.config.cuzkfile import CuzkFile
from cuzkd.kinds import ProofKind
from cuzkd.labelbudget import DEFAULT_LIMITS
from cuzkd.log.configure import LogFormat, LogLevel
from cuzkd.procfs import PROC_ROOT

#: argv[0] placeholder for "the active release's binary" (resolved at spawn time by swap).
BINARY_PLACEHOLDER = "{binary}"

DEFAULT_METRICS_LISTEN = "127.0.0.1:9822"

#: ``[[engine]] door`` turning an engine's front door off.
DOOR_OFF = "off"
#: ``[[engine]] door`` turning it on where its type puts it (a cuzk engine's at its cuzk
#: file's ``[daemon] listen``, a bundled engine's in the state dir). ``cuzkd run --demo`` sets
#: it on each bundled engine that does not set ``door``.
DOOR_DEFAULT = ""

#: ``cuzkd start|restart`` wait this long beyond the engine's start_timeout for ``running``.
START_WAIT_SLACK = 5.0


class Seconds(float):
    """A duration in seconds; the file says ``"250ms"``, ``"30s"``, ``"5m"`` or a number."""


class Bytes(int):
    """A size in bytes; the file says ``"20GiB"``, ``"512MB"`` or a number."""


_NAME = Annotated[str, msgspec.Meta(pattern=r"^[a-z0-9_-]+$", min_length=1, max_length=64)]
_POSITIVE_INT = Annotated[int, msgspec.Meta(ge=1)]
#: A label budget: distinct values of one label (cuzkd.labelbudget); the upper bound keeps a
#: typo (an extra 0s) from undoing the bound the budget exists for.
_LABEL_LIMIT = Annotated[int, msgspec.Meta(ge=1, le=100_000)]


class Restart(enum.StrEnum):
    """Which unexpected exits of an engine's process start it again (``restart``)."""

    ALWAYS = "always"
    #: non-zero exits and signals only
    ON_FAILURE = "on-failure"
    NEVER = "never"


class StallAction(enum.StrEnum):
    """What the stall watchdog does at a stall's onset (``stall_action``), beside its log event."""

    #: SIGKILL at once, then a restart through the backoff, whatever ``restart`` says
    RESTART = "restart"
    #: the log event and the stall metrics only
    ALERT = "alert"


class DrainMode(enum.StrEnum):
    """How a supervisor-initiated stop lets in-flight work end first (docs/supervisor.md, the
    stop sequence)."""

    #: ask the engine to drain (``POST /v1/drain``, the bundled engine's)
    HTTP = "http"
    #: wait for a moment with no partition synthesizing or on a GPU (any engine with a status)
    QUIET = "quiet"
    #: wait for no job in flight in ``/status`` and nothing pending or in progress in cuzk's
    #: gRPC ``GetStatus`` (a cuzk engine's: cuzk cannot drain itself)
    CUZK = "cuzk"
    #: stop the engine's front door admitting calls and wait for its calls and submitted jobs
    #: to return (a cuzk engine behind a door: cuzkd holds Curio's new calls meanwhile)
    DOOR = "door"
    #: send the stop signal at once
    NONE = "none"


class EngineType(enum.StrEnum):
    """What an ``[[engine]]`` runs, which decides how cuzkd talks to it (``type``). Unset, the
    type is inferred from ``command`` and ``status_url`` as before types existed."""

    #: cuzkd's own demo engine, no ``command``
    BUNDLED = "bundled"
    #: a command watched by its process alone
    PROCESS = "process"
    #: a command with a ``GET /status`` at ``status_url``
    HTTP = "http"
    #: Curio's cuzk daemon, its addresses read from its own TOML
    CUZK = "cuzk"


#: Defaults an explicit ``type`` brings, under ``[engine_defaults]`` and the engine's own keys
#: (the values as a file spells them). docs/configuration.md says why each differs.
TYPE_DEFAULTS: dict[EngineType, dict[str, object]] = {
    EngineType.CUZK: {
        # cuzk binds /status right after reading its config and listing its GPUs, before its
        # gRPC listener and before any SRS load (on demand, or Curio's PreloadSRS, 30-90 s):
        # seconds. Longer would leave a cuzk whose status_listen failed to bind (it runs on
        # without /status, taking jobs) unseen for longer before it is restarted.
        "start_timeout": "30s",
        # cuzk cannot drain (SIGINT strands work and never exits, SIGTERM kills at once):
        # cuzkd drains it (``drain_mode``: "door", or "cuzk" with the door off), long enough
        # for a whole PoRep C2 on a 128 GiB host (~150 s; ~38 s with 512 GiB) plus a margin
        # for a GPU shared under load.
        "drain_timeout": "180s",
    },
}


class SupervisorConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """``[supervisor]``. Empty ``state_dir``/``control_socket`` mean "the default"."""

    state_dir: str = ""
    control_socket: str = ""
    shutdown_grace: Seconds = Seconds(30)
    log_level: LogLevel = LogLevel.INFO
    #: "auto": console lines on a terminal, JSON lines elsewhere; `run --log-format` overrides
    log_format: LogFormat = LogFormat.AUTO
    #: swap: the binary ``{binary}`` engines run before the first swap (optional)
    initial_binary: str = ""
    #: swap: how many releases to keep on disk
    keep_releases: _POSITIVE_INT = 3
    #: swap: how long the ``{binary}`` engines must stay healthy at start before the active
    #: release (an ``initial_binary`` seed, or one a crash left on trial) is accepted
    release_settle: Seconds = Seconds(10)


#: Chain deadlines the proof-latency alert compares each kind's p99 job duration with: a
#: WinningPoSt later than ~20 s loses the block; a WindowPoSt must land within its 30-minute
#: deadline window. ``[metrics] proof_deadlines`` overrides or adds kinds ("0s" drops one).
DEFAULT_PROOF_DEADLINES: dict[str, float] = {ProofKind.WINNING_POST: 20.0,
                                             ProofKind.WINDOW_POST: 1200.0}
_PROOF_KIND = Annotated[str, msgspec.Meta(min_length=1, max_length=64)]


class MetricsConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """``[metrics]``: the TCP listener for /metrics, /status and /healthz (read-only)."""

    listen: str = DEFAULT_METRICS_LISTEN
    #: exporter-toolkit's web configuration file (TLS, basic auth, headers) for this listener,
    #: as node_exporter's ``--web.config.file`` (cuzkd.config.webconfig); "" = plain HTTP
    web_config: str = ""
    #: proof kind -> latency deadline, exported as ``cuzkd_proof_deadline_seconds``
    proof_deadlines: dict[_PROOF_KIND, Seconds] = msgspec.field(default_factory=dict)

    def deadlines(self) -> dict[str, float]:
        """The defaults with the file's overrides; kinds set to 0 are left out."""
        merged = {**DEFAULT_PROOF_DEADLINES, **self.proof_deadlines}
        return {kind: float(limit) for kind, limit in merged.items() if limit > 0}


#: Seconds a deadline call's proof may take once an engine has it, by kind: the door sends a
#: call of a kind with a deadline (``[metrics] proof_deadlines``) no later than that deadline
#: less this, and refuses it then (a WinningPoSt ~0.8 s on a warm cuzk, a WindowPoSt
#: partition's synthesis and proof well within 2 minutes). ``[door] proving_allowance``
#: overrides or adds kinds.
DEFAULT_PROVING_ALLOWANCES: dict[str, float] = {ProofKind.WINNING_POST: 5.0,
                                                ProofKind.WINDOW_POST: 120.0}


class DoorConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """``[door]``: how every front door holds and retries Curio's calls (each door's values
    are its :class:`cuzkd.config.doors.DoorPlan`)."""

    #: how long a call waits in the door for an engine to take it; unset: per door, the
    #: longest drain_timeout + start_timeout + backoff_max of its engines + 60 s (a stop, a
    #: start with its SRS load, the longest backoff); must stay below Curio's 30 min
    #: ProveTimeout, which would give up on the call first
    hold_timeout: Seconds | None = None
    #: calls held at once in one door; the next is refused UNAVAILABLE
    hold_max_calls: _POSITIVE_INT = 1024
    #: total request bytes held at once in one door (a PoRep C1 input is ~51 MB)
    hold_max_bytes: Bytes = Bytes(2 << 30)
    #: request bytes a door keeps for a retry after an engine dies under them (one door);
    #: a request that does not fit is not retried
    retry_max_bytes: Bytes = Bytes(1 << 30)
    #: a Unix door's socket mode, octal: Curio's user (owner or group) connects, nobody else
    socket_mode: str = "0660"
    #: a Unix door's socket group (Curio's user's); "" = cuzkd's own group
    socket_group: str = ""
    #: proof kind -> seconds its proof may take on an engine: a call of a kind with a
    #: deadline ([metrics] proof_deadlines) is sent by its deadline less this, or refused
    #: DEADLINE_EXCEEDED while its caller can still act
    proving_allowance: dict[_PROOF_KIND, Seconds] = msgspec.field(default_factory=dict)
    #: how long a poison request's id is refused after it crashed an engine twice (the
    #: second time alone among suspects); `cuzkd door release ID` ends it sooner
    quarantine: Seconds = Seconds(3600)
    #: bounds on what callers may take of the door process, per door (docs/door.md): client
    #: connections at once (at the bound the one idle longest makes room; one that sends no
    #: HTTP/2 preface within 10 s is closed), streams per connection (Curio's MaxPending is
    #: 10), metadata per call
    max_connections: _POSITIVE_INT = 512
    max_streams: Annotated[int, msgspec.Meta(ge=16, le=4096)] = 128
    max_metadata: Bytes = Bytes(16 << 10)
    #: request bytes being received (HTTP/2 flow control holds a caller past it), in all and
    #: per connection; reply bytes callers have not read yet, in all
    request_memory: Bytes = Bytes(1 << 30)
    connection_request_memory: Bytes = Bytes(256 << 20)
    reply_memory: Bytes = Bytes(1 << 30)
    #: a connection with no call this long gets GOAWAY (its next call opens another)
    idle_timeout: Seconds = Seconds(300)
    #: the door process's data memory at most (RLIMIT_DATA): past it the door process dies and
    #: is started again, costing only the calls on its connections
    memory_max: Bytes = Bytes(4 << 30)

    def allowances(self) -> dict[str, float]:
        """The default proving allowances with the file's overrides."""
        merged = {**DEFAULT_PROVING_ALLOWANCES, **self.proving_allowance}
        return {kind: float(allowance) for kind, allowance in merged.items()}


class EngineConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """One ``[[engine]]``. ``command=None`` is the bundled engine run with this Python."""

    name: _NAME
    #: unset: inferred (see EngineType); read it through ``engine_type``
    type: EngineType | None = None
    command: list[str] | None = None
    #: type "cuzk": cuzk's own TOML; "" = the command's -c/--config, else cuzk's default
    #: /data/zk/cuzk.toml
    cuzk_config: str = ""
    #: type "cuzk": that file as read at load and on each reload (never set by a file). Part
    #: of the spec, so a reload that finds it changed restarts the engine (cuzk reads it once)
    cuzk_file: CuzkFile | None = None
    #: types "cuzk" and "bundled": where cuzkd's front door takes Curio's gRPC for this engine
    #: (the engine itself then serves it on a private socket in the state dir): "" = on, at
    #: a cuzk engine's cuzk file ``[daemon] listen`` (the address Curio already dials), at a
    #: bundled engine's ``unix://{state_dir}/{name}.door.sock``; "off"; or an address
    #: ``unix:///PATH`` or ``HOST:PORT``. Unset: on for a cuzk engine, off for a bundled one
    #: (no Curio dials it) but under ``cuzkd run --demo``. Not ``listen``: that is the
    #: bundled engine's HTTP API
    door: str | None = None
    #: types "cuzk" and "bundled" behind a door: the door sends the engine one PoSt at a
    #: time, and none beside a fresh process's first partitioned job (cuzk queues every PoSt
    #: for its GPUs under one key, and a second overwrites the first: its Prove never
    #: returns). Unset: on for a cuzk engine, off for a bundled one; a cuzk without that
    #: defect can turn it off
    one_post_at_a_time: bool | None = None
    env: dict[str, str] = msgspec.field(default_factory=dict)
    status_url: str = ""
    listen: str = ""
    restart: Restart = Restart.ALWAYS
    backoff_initial: Seconds = Seconds(0.1)
    backoff_max: Seconds = Seconds(30)
    backoff_multiplier: Annotated[float, msgspec.Meta(ge=1.0, le=100.0)] = 2.0
    backoff_reset_after: Seconds = Seconds(60)
    start_timeout: Seconds = Seconds(60)
    health_interval: Seconds = Seconds(1)
    #: how long one status fetch may take: independent of health_interval, because a busy
    #: engine's 1 MB document over a congested link can take longer than one poll period
    status_timeout: Seconds = Seconds(5)
    #: type "cuzk": seconds between two gRPC telemetry polls (GetStatus + GetMetrics; "0s":
    #: none). Each GetStatus runs nvidia-smi in the engine (tens of ms of its CPU): 10 s costs
    #: it under 0.5 % of a core, and a scrape reads the last poll, never the engine
    grpc_telemetry_interval: Seconds = Seconds(10)
    unhealthy_after: Seconds = Seconds(15)
    stop_signal: str = "SIGTERM"
    stop_timeout: Seconds = Seconds(10)
    #: unset: ``door`` for a cuzk or bundled engine behind its door, else ``http`` for the
    #: bundled engine, ``cuzk`` for a cuzk one, ``quiet`` with a status_url, ``none``
    drain: DrainMode | None = None
    drain_timeout: Seconds = Seconds(20)
    #: stall watchdog: work and no progress for this long is a stall ("0s": off)
    stall_after: Seconds = Seconds(600)
    stall_action: StallAction = StallAction.RESTART
    #: a plain cuzk document's job whose partitions have not moved for this long is a
    #: failed work (cuzkd/status/failedwork.py: 10 min is many times cuzk's slowest
    #: step, a ~150 s PoRep on a small host); a job with a failed partition is one at once
    stale_job_after: Seconds = Seconds(600)
    #: GPUs the engine is pinned to: NVML indices ("0") or UUIDs ("GPU-..."); sets
    #: CUDA_VISIBLE_DEVICES and CUDA_DEVICE_ORDER=PCI_BUS_ID, and each start waits for their
    #: memory (the previous process's released, gpu_memory_needed free) up to
    #: gpu_release_timeout. A cuzk engine's must be its [gpus] devices, and only
    #: CUDA_DEVICE_ORDER is set (cuzk picks its GPUs by index itself)
    gpus: list[str] = msgspec.field(default_factory=list)
    gpu_memory_needed: Bytes = Bytes(0)
    gpu_release_timeout: Seconds = Seconds(30)
    #: the engine's output logged at most, lines and bytes per second with a burst of each
    #: (both pipes, all its processes); the rest is read and counted, not logged. A real cuzk
    #: logs a few lines per partition and a burst at start: far below these
    output_lines_per_second: Annotated[float, msgspec.Meta(gt=0)] = 200.0
    output_bytes_per_second: Bytes = Bytes(256 << 10)
    output_burst_lines: _POSITIVE_INT = 2000
    output_burst_bytes: Bytes = Bytes(1 << 20)
    #: label budgets: the distinct proof kinds, GPU workers, GPUs and circuits of this engine
    #: that get series and supervisor-side state (the first ones seen while its process
    #: lives); the others are dropped and counted in cuzkd_label_values_dropped_total
    max_proof_kinds: _LABEL_LIMIT = DEFAULT_LIMITS["proof_kind"]
    max_workers: _LABEL_LIMIT = DEFAULT_LIMITS["worker"]
    max_gpus: _LABEL_LIMIT = DEFAULT_LIMITS["gpu"]
    max_circuits: _LABEL_LIMIT = DEFAULT_LIMITS["circuit"]

    @property
    def engine_type(self) -> EngineType:
        """``type`` as configured, or the one ``command`` and ``status_url`` imply."""
        if self.type is not None:
            return self.type
        if self.command is None:
            return EngineType.BUNDLED
        return EngineType.HTTP if self.status_url else EngineType.PROCESS

    @property
    def bundled(self) -> bool:
        return self.engine_type == EngineType.BUNDLED

    @property
    def cuzk(self) -> bool:
        return self.engine_type == EngineType.CUZK

    @property
    def door_on(self) -> bool:
        """True for a cuzk or bundled engine whose gRPC goes through cuzkd's front door."""
        if self.bundled:
            return self.door not in (None, DOOR_OFF)
        return self.cuzk and self.door != DOOR_OFF

    @property
    def one_post(self) -> bool:
        """``one_post_at_a_time`` as configured, or its default: on for a cuzk engine."""
        return self.cuzk if self.one_post_at_a_time is None else self.one_post_at_a_time

    @property
    def label_limits(self) -> dict[str, int]:
        """The label budgets' limits by label name (cuzkd.labelbudget.DEFAULT_LIMITS' keys)."""
        return {"proof_kind": self.max_proof_kinds, "worker": self.max_workers,
                "gpu": self.max_gpus, "circuit": self.max_circuits}

    @property
    def uses_binary(self) -> bool:
        """True when argv[0] is ``{binary}``: the engine runs the active swap release."""
        return self.command is not None and self.command[0] == BINARY_PLACEHOLDER

    @property
    def drain_mode(self) -> DrainMode:
        """``drain`` as configured, or its default for this kind of engine."""
        if self.drain is not None:
            return self.drain
        if self.bundled:
            return DrainMode.DOOR if self.door_on else DrainMode.HTTP
        if self.cuzk:
            return DrainMode.DOOR if self.door_on else DrainMode.CUZK
        return DrainMode.QUIET if self.status_url else DrainMode.NONE

    @property
    def stop_budget(self) -> float:
        """The longest a stop may take before the final SIGKILL: drain, then stop_timeout."""
        return ((self.drain_timeout if self.drain_mode != DrainMode.NONE else 0.0)
                + self.stop_timeout)

    @property
    def stop_signum(self) -> signal.Signals:
        return signal.Signals[self.stop_signal]


class Config(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """The whole file. ``path`` is None for the embedded default."""

    supervisor: SupervisorConfig = SupervisorConfig()
    metrics: MetricsConfig = MetricsConfig()
    door: DoorConfig = DoorConfig()
    engine: list[EngineConfig] = msgspec.field(default_factory=list)
    path: str | None = None
    #: set by ``cuzkd run --demo``, never by the file: bundled engines start as demo engines
    demo: bool = False
    #: set by the loader, never by the file: warnings for what the file should change (an old
    #: proof kind name, still accepted), each naming the file and the key; shown by
    #: ``check-config`` and logged by the daemon at start and at each reload
    notices: tuple[str, ...] = ()
    #: set by the loader, never by the file: the file's text as read (``cuzkd upgrade`` hands
    #: it to the new program, which runs the same config)
    text: str | None = None


def visible_gpu_count(proc_root: Path = PROC_ROOT) -> int:
    """GPUs the NVIDIA driver exposes (``driver/nvidia/gpus``: no CuPy needed in the
    supervisor)."""
    try:
        return sum(1 for _ in (proc_root / "driver" / "nvidia" / "gpus").iterdir())
    except OSError:
        return 0


def default_engines(gpus: int) -> list[EngineConfig]:
    """One bundled engine per GPU pinned with ``gpus`` (NVML index, PCI bus order like
    /proc/driver/nvidia/gpus), or one CPU engine."""
    if gpus == 0:
        return [EngineConfig(name="cpu0")]
    return [EngineConfig(name=f"gpu{i}", gpus=[str(i)]) for i in range(gpus)]


def default_config() -> Config:
    """The embedded default used when ``cuzkd run`` gets no ``--config``."""
    return Config(engine=default_engines(visible_gpu_count()))
