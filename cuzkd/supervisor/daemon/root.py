"""``cuzkd run``: the composition root, which builds the supervisor's parts and wires them.

It keeps only what is supervisor-wide (the phase, the state dir lock, signals, servers,
sd_notify) so that every other part is built from what it is handed; docs/design.md draws the
parts and who owns what.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
from collections.abc import Callable, Mapping, Sequence

import structlog

from cuzkd import __version__
from cuzkd.config import Config, control_socket, demo_config, plan_doors, state_dir
from cuzkd.errors import CuzkdError, DoorAddressError, StartupError
from cuzkd.gpus import GpuView
from cuzkd.log.ratelimit import LimitedLog, RateLimiter
from cuzkd.metrics.carry import CounterCarry, carried_samples
from cuzkd.metrics.http import collect, self_collectors
from cuzkd.metrics.sample import ListenerAccess
from cuzkd.states import Phase
from cuzkd.supervisor.core import signals
from cuzkd.supervisor.core.handover import FORMAT as HANDOVER_FORMAT
from cuzkd.supervisor.core.handover import Handover, Listeners, Locks
from cuzkd.supervisor.core.phase import SupervisorPhase
from cuzkd.supervisor.core.upgradegate import upgrade_refusal
from cuzkd.supervisor.daemon import demo, dumps, errorlog
from cuzkd.supervisor.daemon.configread import log_notices
from cuzkd.supervisor.daemon.notify import Notifier
from cuzkd.supervisor.daemon.reload import ConfigReloader
from cuzkd.supervisor.daemon.signalinstall import LoopSignals
from cuzkd.supervisor.daemon.startup import startup_fields
from cuzkd.supervisor.daemon.statedir import ControlSocketLock, StateDirLock, unusable_dir
from cuzkd.supervisor.daemon.upgrade import Upgrader
from cuzkd.supervisor.door.control import door_routes
from cuzkd.supervisor.door.doors import DOOR_CHANNEL, Doors, server_limits
from cuzkd.supervisor.door.inherited import take_passed_sockets
from cuzkd.supervisor.engines.binaries import EngineBinaries
from cuzkd.supervisor.engines.engineset import EngineSet
from cuzkd.supervisor.proc.children import ChildTable
from cuzkd.supervisor.proc.reexec import InstalledProgram, launcher
from cuzkd.supervisor.proc.spawn import set_child_subreaper
from cuzkd.supervisor.tasks import TaskSet
from cuzkd.supervisor.web.access import WebAccess
from cuzkd.supervisor.web.control_routes import RouteHook, build_control_app
from cuzkd.supervisor.web.listener import connection_limit
from cuzkd.supervisor.web.metrics_routes import build_metrics_app
from cuzkd.supervisor.web.readout import SupervisorReadout
from cuzkd.supervisor.web.servers import Servers
from cuzkd.swap.control import swap_routes
from cuzkd.swap.rolling import SwapCoordinator

log = structlog.get_logger("cuzkd.supervisor")

#: One line per signal and meaning per this many seconds (a second SIGUSR1 a few seconds after
#: the first still dumps; a flood of them writes one dump a second).
SIGNAL_LOG_INTERVAL = 1.0
#: How old the engines' status documents in an upgrade's hand-over may be: the counts taken
#: from them continue in the engines themselves, and a fresh fetch would only hold the exec.
HANDOVER_SAMPLE_AGE = 60.0
#: What a swap in flight is told when the shutdown cancels it.
SHUTDOWN_REASON = "supervisor shutting down"


class Supervisor:
    def __init__(
        self,
        config: Config,
        *,
        control_routes: Sequence[RouteHook] = (),
        demo: bool = False,
        gpu_view: GpuView | None = None,
        log_drops: Callable[[], Mapping[str, int]] = dict,
        log_flush: Callable[[float], int] = lambda timeout: 0,
        log_format: str | None = None,
        handover: Handover | None = None,
        command: Sequence[str] = (),
    ) -> None:
        """``log_drops``/``log_flush``: the log sink's drop counts, and its flush before
        ``cuzkd upgrade`` execs; ``log_format``: ``cuzkd run --log-format``, kept by an
        upgrade; ``handover``: the old code's, when this program replaced it in place;
        ``command``: runs the cuzkd installed where this one was started from (default: from
        ``sys.argv[0]``)."""
        # --demo: bundled engines start as demo engines behind doors (demo_config), reloads too.
        config = demo_config(config) if demo else config
        #: starting, running, reloading, stopping; the last reload's outcome
        self.phase = SupervisorPhase(started_at=time.time())
        #: the old code's hand-over (``cuzkd upgrade``), adopted by run()
        self._handed = handover
        #: the counters of the program this one replaced, carried in every scrape
        self._carry = CounterCarry(handover.samples if handover is not None else ())
        #: every child's spawn and exit goes through here (see cuzkd.supervisor.proc.children)
        self.children = ChildTable()
        # Built once, from the config at start: a reload keeps the store and the coordinator.
        self.binaries = EngineBinaries(config.supervisor, state_dir(config))
        #: the front doors Curio dials (cuzk engines'): their sockets bound (or taken from
        #: systemd: cuzkd.socket) before the engines start and closed after they stopped,
        #: served by the door process; their counts (cuzkd_door_*) for the supervisor's life
        self.doors = Doors(plan_doors(config), time.monotonic, server_limits(config.door),
                           children=self.children, channel=state_dir(config) / DOOR_CHANNEL,
                           passed=take_passed_sockets(os.environ))
        #: gpu_view: NVML for the GPU memory gate and cuzkd_gpu_*; loaded by run() unless
        #: given (tests)
        self.engines = EngineSet(config, self.children, binaries=self.binaries,
                                 phase=self.phase, on_change=self._notify_status,
                                 gpu_view=gpu_view, seats=self.doors.seat)
        self.swaps = SwapCoordinator(self.binaries.store, self.engines,
                                     keep_releases=config.supervisor.keep_releases)
        self._notifier = Notifier()
        #: set by the first stop request (the phase says "stopping" from then on)
        self._stop_event = asyncio.Event()
        self._stop_signals = 0
        #: loop time by which the shutdown must be over (set by the first stop request)
        self._stop_deadline: float | None = None
        self._signal_log = LimitedLog(RateLimiter(SIGNAL_LOG_INTERVAL))
        self._tasks = TaskSet()
        self._metrics_bound = ("", 0)
        #: repeated errors (accept failing, refused connections) log once per 10 s per kind
        self._limited = LimitedLog()
        self._servers = Servers(self._limited)
        #: TLS, basic auth and headers of the metrics listener ([metrics] web_config); a file
        #: broken since the config was read is a ConfigError here (exit 78)
        self.access = WebAccess(config.metrics.web_config, self._limited, where=config.path or "")
        #: log_drops: lines the log sink dropped, by reason (``cuzkd run``'s queued logging)
        self.readout = SupervisorReadout(self.engines, self.children, self.phase, self.swaps,
                                         self._limited, log_drops,
                                         self._servers.connections_closed,
                                         self._listener_access, self.doors.refresh_figures)
        self._reloader = ConfigReloader(self.engines, self.phase, self._notifier,
                                        status_line=self.readout.status_line,
                                        on_applied=self._notify_status)
        self._lock = StateDirLock(state_dir(config))
        self._control_lock = ControlSocketLock(control_socket(config))
        program = InstalledProgram(self.children, command or launcher(sys.argv[0]),
                                   ["--log-format", log_format] if log_format else [])
        self._upgrader = Upgrader(
            self.phase, self._notifier, program, refusal=self._upgrade_refusal,
            handover=self._handover, quiesce=self._servers.quiesce,
            resume=self._servers.resume, flush_log=log_flush,
            status_line=self.readout.status_line)
        self._control_routes = [*control_routes, swap_routes(self.swaps),
                                self._reloader.routes(),
                                door_routes(self.doors), self._upgrader.routes()]

    @property
    def config(self) -> Config:
        """The current config (the engine set's: the last reload's)."""
        return self.engines.config

    # -- the daemon ----------------------------------------------------------------------

    async def run(self) -> int:
        """Run until SIGTERM/SIGINT (or :meth:`request_stop`); the exit code."""
        loop = asyncio.get_running_loop()
        errorlog.install(loop, self._limited)
        lock, control_lock, handed = self._lock, self._control_lock, self._handed
        try:
            self._take_locks(handed)
        except CuzkdError as exc:  # busy: 1; a directory it cannot write: a config error, 78
            log.error("supervisor_start_failed", error=str(exc))
            lock.release()
            return exc.exit_code
        if not set_child_subreaper():
            log.warning("subreaper_refused", detail="orphaned grandchildren will not be reaped")
        if handed is None:
            self.children.install(loop)
        self.engines.clock.start()  # from now on a freeze of the supervisor is seen
        loop_signals = LoopSignals(loop, self._on_signal)
        for signum in loop_signals.install():  # those that came during start-up, replayed
            self._on_signal(signum)
        try:
            await self.engines.load_gpu_view()
            if handed is None:
                await self.engines.stop_previous_leftovers()
            await asyncio.to_thread(self.binaries.prepare)
            if handed is not None:
                gap = await self._adopt(handed, loop)
            else:
                await self._start_servers()
                await self.doors.start()
            started = startup_fields(self.config, *self._metrics_bound,
                                     self.swaps.active_release(), self.access.web)
            if "metrics_exposed" in started:
                log.warning("metrics_listener_exposed", listen=self.config.metrics.listen,
                            detail=started["metrics_exposed"])
            if handed is None:
                log.info("supervisor_started", pid=os.getpid(), **started)
                log_notices(self.config)
                self.engines.start_all()  # after a stop signal during start-up: none started
            else:
                self._upgrader.adopted(handed, gap)
            self.phase.started()
            self._notifier.send("READY=1", self.readout.status_line())
            self._tasks.start(self.swaps.accept_when_healthy(
                self.config.supervisor.release_settle))
            if self._notifier.watchdog_interval is not None:
                self._tasks.start(self._watchdog(self._notifier.watchdog_interval))
            if self.config.demo:
                self._tasks.start(demo.drive(self.engines.demo_targets))
            await self._stop_event.wait()
            self._notifier.send("STOPPING=1", "STATUS=stopping engines")
            log.info("supervisor_stopping")
            await self._tasks.cancel_all()
            await self.engines.stop_all(self._grace_left(),
                                        hurry=self._stop_signals > 1)
            await self.engines.stop_adopted()
            return 0
        except (StartupError, DoorAddressError, OSError, ValueError) as exc:
            if handed is not None:
                return await self._upgrade_failed(exc)
            if not isinstance(exc, CuzkdError):
                raise
            log.error("supervisor_start_failed", error=str(exc))
            return exc.exit_code
        finally:
            await self._shutdown(loop_signals)
            control_lock.release()
            lock.release()

    async def _upgrade_failed(self, exc: Exception) -> int:
        """The new code could not take everything over: it stops the engines it has as a
        shutdown does and exits 1 (docs/operations.md, *Upgrading cuzkd in place*)."""
        log.error("supervisor_upgrade_failed", error=str(exc), outcome="failed",
                  detail="the new code could not take the supervisor over: stopping the "
                         "engines as a shutdown does")
        self.phase.stop()
        self._notifier.send("STOPPING=1", "STATUS=upgrade failed: stopping engines")
        await self.engines.stop_all(self._grace_left())
        return 1

    def _take_locks(self, handed: Handover | None) -> None:
        """The state dir's and control socket's locks: taken, or held on from the old code."""
        if handed is None:
            self._lock_dirs()
        else:
            self._lock.adopt(handed.locks.state_dir)
            self._control_lock.adopt(handed.locks.control_socket)

    async def _adopt(self, handed: Handover, loop: asyncio.AbstractEventLoop) -> float:
        """Carry on from the old code's hand-over: the run clock and the engines (their seats
        first), then the reaper -- every adopted child registered, so an exit during the exec
        is its owner's -- then the door process and the listeners. The supervision gap: from
        the old code's last decision to the engines watched again."""
        self.readout.started_at = handed.started_at
        self.phase.adopted(handed.reload_ok, handed.reload_success_at)
        if handed.door is not None:
            self.doors.adopt_seats(handed.door.seats)
        gap = self.engines.clock.adopt(handed.frozen_seconds, handed.freezes, handed.handed_at)
        self.engines.adopt_all(handed.engines)
        if handed.door is not None:
            await self.doors.adopt(handed.door)
        self.children.install(loop)
        await self._start_servers(handed.listeners)
        return gap

    async def _handover(self, upgrade_id: str, mask: list[int]) -> Handover:
        """Everything the program that replaces this one needs (see
        :mod:`~cuzkd.supervisor.core.handover`), as it stands now."""
        # the engines' last documents will do (their series are read again by the new code)
        sample = await self.readout.sample(max_age=HANDOVER_SAMPLE_AGE)
        families = collect(sample, [*self_collectors(), self.doors], self._carry)
        config, clock = self.config, self.engines.clock
        return Handover(
            format=HANDOVER_FORMAT, version=__version__, upgrade_id=upgrade_id,
            config_text=config.text, config_path=config.path, demo=config.demo,
            signal_mask=mask, handed_at=clock.raw(),
            frozen_seconds=clock.frozen_seconds_total, freezes=clock.freezes,
            started_at=self.readout.started_at, reload_ok=self.phase.reload_ok,
            reload_success_at=self.phase.reload_success_at,
            locks=Locks(self._lock.fileno(), self._control_lock.fileno()),
            listeners=self._servers.handover(), engines=self.engines.handover(),
            door=self.doors.handover(), samples=carried_samples(families))

    def _upgrade_refusal(self, phase: Phase) -> str | None:
        return upgrade_refusal(phase, swapping=self.swaps.busy,
                               engines=self.engines.moments())

    def _lock_dirs(self) -> None:
        """Take the state dir and the control socket (StateDirBusy when another supervisor
        has one); a directory that cannot be written is the config's mistake, named."""
        try:
            self._lock.acquire()
        except OSError as exc:
            raise unusable_dir(self.config, exc) from None
        try:
            self._control_lock.acquire()
        except OSError as exc:
            raise unusable_dir(self.config, exc, control_socket=True) from None

    def request_stop(self) -> None:
        """Begin the shutdown: no engine starts any more, a swap in flight is cancelled (its
        client told why), and ``shutdown_grace`` starts to run."""
        if self._stop_deadline is None:
            self._stop_deadline = (asyncio.get_running_loop().time()
                                   + self.config.supervisor.shutdown_grace)
        self.phase.stop()
        self.swaps.close(SHUTDOWN_REASON)
        self._stop_event.set()

    async def _start_servers(self, handed: Listeners | None = None) -> None:
        await self._servers.start(
            build_control_app(self.engines, self.readout.about, self.swaps.active_verdict,
                              self._control_routes),
            control_socket(self.config),
            build_metrics_app(self.readout, self._servers.outbox, self.access,
                              [self.doors], self._carry),
            self.config.metrics.listen, lambda: connection_limit(len(self.engines)),
            self.access.tls, self._metrics_listening, handed)

    def _metrics_listening(self, host: str, port: int) -> None:
        self._metrics_bound = (host, port)
        self.readout.metrics_address = f"{host}:{port}"

    def _listener_access(self) -> ListenerAccess:
        """The web config's state for a scrape: re-read first if its files changed, so that
        a broken rotation shows even while Prometheus keeps its connection open."""
        self.access.refresh()
        ok, failed = self._servers.handshakes()
        return ListenerAccess(reload_ok=self.access.last_reload_ok,
                              auth_refused_total=self.access.refused_total,
                              auth_throttled_total=self.access.throttled_total,
                              handshakes_ok_total=ok, handshakes_failed_total=failed)

    def _grace_left(self) -> float:
        """Seconds left of ``shutdown_grace`` (all of it when no stop was requested: a
        start-up that failed)."""
        grace = self.config.supervisor.shutdown_grace
        if self._stop_deadline is None:
            return grace
        return max(0.0, self._stop_deadline - asyncio.get_running_loop().time())

    async def _shutdown(self, loop_signals: LoopSignals) -> None:
        self.swaps.close(SHUTDOWN_REASON)  # also after a failed start-up
        await self._tasks.cancel_all()
        await self.engines.close()
        self.engines.clock.close()
        await self.doors.close(self._grace_left())
        await self._servers.close(self._grace_left())
        loop_signals.uninstall()
        self.children.uninstall()
        self.children.reap()
        log.info("supervisor_stopped", zombies_reaped=self.children.zombies_reaped)

    # -- signals and children ----------------------------------------------------------

    def _on_signal(self, signum: int) -> None:
        """Carry out :func:`signals.decide`'s decision. Only sets flags and starts tasks: a
        handler that awaited could be held up, and the second SIGTERM must always hurry."""
        phase = self.phase.phase
        decision = signals.decide(signum, phase, self._stop_signals)
        logged = decision.event is None or self._signal_log.log(
            log, decision.level, decision.event, key=(signum, decision),
            signal=signals.name_of(signum), action=decision.detail, phase=str(phase))
        match decision:
            case signals.Decision.STOP:
                self._stop_signals += 1
                self.request_stop()
            case signals.Decision.HURRY:
                self._stop_signals += 1
                self.engines.kill_now()
            case signals.Decision.RELOAD:
                self._tasks.start(self._reloader.on_signal())
            case signals.Decision.DUMP_STATE if logged:  # a flood dumps once per interval
                dumps.log_state(log, {**self.readout.about(),
                                      "release": self.swaps.active_verdict()},
                                self.engines.engines_info())
            case signals.Decision.DUMP_STACKS if logged:
                dumps.log_task_stacks(log, asyncio.all_tasks())

    async def _watchdog(self, interval: float) -> None:
        while True:
            self._notifier.send("WATCHDOG=1")
            await asyncio.sleep(interval)

    def _notify_status(self) -> None:
        if not self.phase.stopping:
            self._notifier.status(self.readout.status_line())
