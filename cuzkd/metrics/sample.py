"""What the exporter is given at each scrape: plain, immutable data.

The supervisor builds one :class:`SupervisorSample` per scrape (after fetching fresh status
documents) and the collector turns it into metric families. Keeping this a data contract lets
the collector be tested without processes, and keeps the supervisor free of Prometheus types.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from cuzkd.cuzk.telemetry import Telemetry
from cuzkd.gpus import NvmlDevice
from cuzkd.labelbudget import LabelBudgets
from cuzkd.status.document import Extensions, StatusDocument
from cuzkd.status.salvage import FieldErrorReason


@dataclass(frozen=True)
class EngineSample:
    """One engine as the supervisor sees it at scrape time."""

    name: str
    #: one of :class:`cuzkd.states.State`
    state: str
    restarts_total: int
    #: exit cause (``exit_1``, ``signal_SIGKILL``, ``unhealthy``, ...) -> count
    exits_total: Mapping[str, int]
    #: Unix time the current process started; None when no process runs
    start_time_seconds: float | None
    #: summed over the engine's process tree; None when no process runs
    resident_memory_bytes: int | None
    cpu_seconds_total: float | None
    #: the status document fetched for this scrape; None when missing, malformed or stale
    status: StatusDocument | None
    #: cumulative figures: the engine's own extensions, or derived by the supervisor from its
    #: polls for engines that serve cuzk's plain document (approximations)
    extensions: Extensions | None
    #: seconds the last status fetch took; None before the first
    fetch_duration_seconds: float | None
    fetch_errors_total: int
    #: release id the running process executes (swap), None when not a ``{binary}`` engine
    release: str | None = None
    #: False for an engine without a status URL: it is up while it runs, and has no status
    status_polled: bool = True
    #: descendants stopped because they outlived the engine (or a previous supervisor)
    descendants_killed_total: int = 0
    #: stalls the watchdog declared, and whether one lasts now
    stalls_total: int = 0
    stalled: bool = False
    #: stop reason (:data:`cuzkd.states.WORK_LOST_REASONS`) -> partitions in flight when the
    #: supervisor stopped the engine
    stop_inflight_partitions_total: Mapping[str, int] = field(default_factory=dict)
    #: proof kind (:class:`cuzkd.kinds.ProofKind`, ``other``) -> jobs the engine held
    #: when the supervisor stopped it
    jobs_lost_total: Mapping[str, int] = field(default_factory=dict)
    #: drain result (:class:`cuzkd.states.DrainResult`) -> drains of the stop sequence
    drains_total: Mapping[str, int] = field(default_factory=dict)
    #: times the engine's health loop died of an exception and was started again
    health_loop_failures_total: int = 0
    #: a cuzk engine's ``[pipeline] max_parallel_synthesis`` from its config (None otherwise)
    max_parallel_synthesis: int | None = None
    #: engine output lines its output limits kept from the log, and the bytes of output not
    #: logged (those lines', and the cut-off rest of lines over the length limit)
    output_dropped_lines_total: int = 0
    output_dropped_bytes_total: int = 0
    #: reason -> values left out of the engine's decoded status documents
    status_field_errors_total: Mapping[FieldErrorReason, int] = field(default_factory=dict)
    #: seconds from the spawn to the first status answer, of the last process that answered
    #: (None before any, and for an engine without a status URL)
    first_answer_seconds: float | None = None
    #: the engine's label budgets, which the exporter's series pass through and which count
    #: what they dropped: one object for the engine's life, its runner's (None: a fresh one
    #: with the default limits for this scrape alone, as in tests and benches)
    labels: LabelBudgets | None = None
    #: a cuzk engine's last gRPC telemetry poll (None: not a cuzk engine, not running, or its
    #: gRPC told nothing at the last poll): exported as ``cuzk_grpc_*``, apart from ``status``
    grpc: Telemetry | None = None
    #: a cuzk engine: its gRPC is polled (``cuzkd_engine_grpc_errors_total`` exported)
    grpc_polled: bool = False
    #: reason (:data:`cuzkd.cuzk.telemetry.FAILURE_REASONS`) -> gRPC reads that told nothing
    grpc_errors_total: Mapping[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class ListenerAccess:
    """The metrics listener's ``[metrics] web_config`` as it stands (defaults: none set)."""

    #: whether the last re-read of the web config and its files was applied
    reload_ok: bool = True
    #: requests answered 401 (no, malformed or wrong basic auth credentials)
    auth_refused_total: int = 0
    #: requests answered 429 (not checked: their address had its share of waiting checks)
    auth_throttled_total: int = 0
    #: TLS handshakes that completed, and that failed or timed out
    handshakes_ok_total: int = 0
    handshakes_failed_total: int = 0


@dataclass(frozen=True)
class SupervisorSample:
    engines: Sequence[EngineSample]
    zombies_reaped_total: int
    #: swap result (:data:`cuzkd.states.SWAP_RESULTS`) -> count
    swaps_total: Mapping[str, int] = field(default_factory=dict)
    #: ``cuzkd swap --rollback`` result (:data:`cuzkd.states.ROLLBACK_RESULTS`) -> count
    rollbacks_total: Mapping[str, int] = field(default_factory=dict)
    #: the active release id, None before the first swap/initial_binary
    active_release: str | None = None
    #: whether the last SIGHUP reload was applied (the config read at start counts as one)
    config_reload_ok: bool = True
    #: Unix time of the last successful config load; None when not known
    config_reload_success_time: float | None = None
    #: proof kind -> latency deadline in seconds (``[metrics] proof_deadlines``)
    proof_deadlines: Mapping[str, float] = field(default_factory=dict)
    #: the host's GPUs as NVML reports them (empty without NVML)
    gpus: Sequence[NvmlDevice] = ()
    #: freezes of the supervisor itself (it did not run: SIGSTOP, a VM pause) and their seconds
    freezes_total: int = 0
    frozen_seconds_total: float = 0.0
    #: reason (queue_full, write_error, upgrade) -> lines the supervisor's log never got
    log_lines_dropped_total: Mapping[str, int] = field(default_factory=dict)
    #: reason (cuzkd.supervisor.web: refused, idle, deadline, send_budget) -> connections of
    #: the metrics listener cuzkd closed
    metrics_connections_closed_total: Mapping[str, int] = field(default_factory=dict)
    #: TLS and basic auth of the metrics listener
    listener_access: ListenerAccess = ListenerAccess()
