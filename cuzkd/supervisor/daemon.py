"""``cuzkd run``: the supervisor daemon.

One asyncio loop owns everything: the reaper (SIGCHLD), the signal handlers (TERM/INT stop,
HUP reload), one :class:`EngineRunner` per configured engine, the control API on a Unix socket,
the read-only metrics listener, the systemd watchdog and the optional demo load. Every task it
starts is cancelled and awaited before :meth:`Supervisor.run` returns.

The per-engine rules live in the pure lifecycle; this module wires events and owns the
supervisor-wide concerns: PID-1/subreaper duties, shutdown ordering, config reload, sd_notify.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import signal
import time
from collections.abc import Coroutine, Mapping, Sequence
from typing import Any

import msgspec
import structlog
from aiohttp import web

from cuzkd.config import (
    START_WAIT_SLACK,
    Config,
    ConfigError,
    EngineConfig,
    default_config,
    load_config,
)
from cuzkd.gpus import GpuView, GpuViewError, NvmlDevice, load_gpu_view
from cuzkd.httperrors import JsonErrorsRunner
from cuzkd.metrics.sample import SupervisorSample
from cuzkd.ratelimit import LimitedLog, errno_name
from cuzkd.status.document import Extensions, StatusDocument
from cuzkd.supervisor import demo, errorlog, procs
from cuzkd.supervisor.binaries import EngineBinaries
from cuzkd.supervisor.children import ChildTable
from cuzkd.supervisor.configread import OffLoopReader
from cuzkd.supervisor.control import RouteHook, bind_control_socket, build_control_app
from cuzkd.supervisor.leftovers import Records, leftovers
from cuzkd.supervisor.lifecycle import State
from cuzkd.supervisor.listener import IDLE_TIMEOUT, GatedListener, connection_limit
from cuzkd.supervisor.notify import Notifier
from cuzkd.supervisor.process import set_child_subreaper
from cuzkd.supervisor.runner import EngineRunner
from cuzkd.supervisor.startup import startup_fields
from cuzkd.supervisor.statedir import ControlSocketLock, StateDirBusy, StateDirLock
from cuzkd.supervisor.tasks import TaskSet
from cuzkd.supervisor.web import build_metrics_app
from cuzkd.units import parse_listen

log = structlog.get_logger("cuzkd.supervisor")

#: After shutdown_grace and a SIGKILL, how long to wait for the kernel to deliver the exits.
KILL_SETTLE = 5.0


class StartupError(Exception):
    """The daemon cannot start (state dir locked, port taken); the message says why."""


class Supervisor:
    def __init__(
        self,
        config: Config,
        *,
        control_routes: Sequence[RouteHook] = (),
        demo: bool = False,
        gpu_view: GpuView | None = None,
    ) -> None:
        # --demo: bundled engines start as demo engines (Config.engine_command), reloads too.
        self.config = msgspec.structs.replace(config, demo=True) if demo else config
        #: NVML for the GPU memory gate and cuzkd_gpu_*; loaded by run() unless given (tests)
        self.gpu_view = gpu_view
        self._gpu_view_given = gpu_view is not None
        # Built once, from the config at start: a reload keeps the store and the coordinator.
        self.binaries = EngineBinaries(config.supervisor, config.state_dir, self)
        self._control_routes = [*control_routes, self.binaries.routes()]
        #: every child's spawn and exit goes through here (see cuzkd.supervisor.children)
        self.children = ChildTable()
        self._runners: dict[str, EngineRunner] = {}
        self._notifier = Notifier()
        self._stop_event = asyncio.Event()
        self._stop_signals = 0
        self._phase = "starting"
        self._started_at = time.time()
        self._tasks = TaskSet()
        self._reload_lock = asyncio.Lock()
        self._web_runners: list[web.AppRunner] = []
        self.metrics_address: str | None = None
        self._metrics_bound = ("", 0)
        self._metrics_listener: GatedListener | None = None
        #: repeated errors (accept failing, refused connections) log once per 10 s per kind
        self._limited = LimitedLog()
        self._last_status_line = ""
        self._config_reader = OffLoopReader(load_config)
        #: the last reload's outcome; the config read at start counts as the first success
        self.last_reload_ok = True
        self.last_reload_success_at = time.time()
        #: engine -> leftovers of the previous supervisor stopped at start-up (counted once
        #: that engine's runner exists)
        self._inherited_kills: dict[str, int] = {}

    # -- the daemon ----------------------------------------------------------------------

    async def run(self) -> int:
        """Run until SIGTERM/SIGINT (or :meth:`request_stop`); the exit code."""
        loop = asyncio.get_running_loop()
        errorlog.install(loop, self._limited)
        lock = StateDirLock(self.config.state_dir)
        control_lock = ControlSocketLock(self.config.control_socket)
        try:
            lock.acquire()
            control_lock.acquire()
        except (StateDirBusy, OSError) as exc:
            log.error("supervisor_start_failed", error=str(exc))
            lock.release()
            return 1
        if not set_child_subreaper():
            log.warning("subreaper_refused", detail="orphaned grandchildren will not be reaped")
        self.children.install(loop)
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, self._on_stop_signal, signum)
        loop.add_signal_handler(signal.SIGHUP, self._on_reload_signal)
        try:
            await self._load_gpu_view()
            await self._stop_previous_leftovers()
            await asyncio.to_thread(self.binaries.prepare)
            await self._start_servers()
            log.info("supervisor_started", pid=os.getpid(), **startup_fields(
                self.config, *self._metrics_bound, self.binaries.active_release()))
            for spec in self.config.engine:
                runner = self._add_runner(spec)
                if not self.stopping:  # a stop signal during start-up: spawn nothing more
                    runner.start()
            self._phase = "running"
            self._notifier.send("READY=1", self._status_line())
            self._track(self.binaries.accept_when_healthy())
            if self._notifier.watchdog_interval is not None:
                self._track(self._watchdog(self._notifier.watchdog_interval))
            if self.config.demo:
                self._track(demo.drive(
                    lambda: [r.status for r in self._runners.values()
                             if r.spec.bundled and r.status is not None]))
            await self._stop_event.wait()
            self._phase = "stopping"
            self._notifier.send("STOPPING=1", "STATUS=stopping engines")
            log.info("supervisor_stopping")
            await self._cancel_tasks()
            await self._stop_all()
            await self._stop_adopted()
            return 0
        except StartupError as exc:
            log.error("supervisor_start_failed", error=str(exc))
            return 1
        finally:
            await self._shutdown(loop)
            control_lock.release()
            lock.release()

    def request_stop(self) -> None:
        self._stop_event.set()

    @property
    def stopping(self) -> bool:
        """True from the first stop signal (or :meth:`request_stop`) on."""
        return self._stop_event.is_set()

    async def _start_servers(self) -> None:
        control = JsonErrorsRunner(build_control_app(self, self._control_routes),
                                handle_signals=False, access_log=None)
        metrics = JsonErrorsRunner(build_metrics_app(self), handle_signals=False, access_log=None,
                                   keepalive_timeout=IDLE_TIMEOUT)
        for runner in (control, metrics):
            await runner.setup()
            self._web_runners.append(runner)
        try:
            sock = bind_control_socket(self.config.control_socket)
        except OSError as exc:
            raise StartupError(f"cannot bind control socket {self.config.control_socket}: "
                               f"{exc.strerror}") from None
        await web.SockSite(control, sock).start()
        address = parse_listen(self.config.metrics.listen, allow_unix=False)
        assert metrics.server is not None  # set up above
        self._metrics_listener = GatedListener(
            metrics.server, limit=lambda: connection_limit(len(self._runners)),
            on_accept_error=self._on_metrics_accept_error, on_limit=self._on_metrics_limit)
        try:
            host, port = (await self._metrics_listener.start(address.host, address.port))[0]
        except OSError as exc:
            raise StartupError(f"cannot listen on metrics.listen {self.config.metrics.listen}: "
                               f"{exc.strerror}") from None
        self._metrics_bound = (str(host), int(port))
        self.metrics_address = f"{host}:{port}"

    def _on_metrics_limit(self, limit: int) -> None:
        self._limited.log(log, "warning", "metrics_connection_refused", limit=limit,
                          detail="at the connection limit (descriptor limit less a reserve); "
                                 "silent connections are closed after 10 s")

    def _on_metrics_accept_error(self, exc: OSError) -> None:
        self._limited.log(log, "error", "metrics_accept_failed", key=errno_name(exc),
                          error=str(exc), errno=errno_name(exc))

    async def _stop_all(self) -> None:
        """Run every engine's stop sequence in parallel; shutdown_grace caps them all: after
        it, SIGKILL whatever is left."""
        runners = list(self._runners.values())
        for r in runners:
            r.request_stop("shutdown")
        if self._stop_signals > 1:  # the second signal came before the stops were sent
            for r in runners:
                r.kill_now()
        try:
            await asyncio.wait_for(asyncio.gather(*(r.wait_stopped() for r in runners)),
                                   self.config.supervisor.shutdown_grace)
        except TimeoutError:
            log.warning("shutdown_grace_elapsed", grace=self.config.supervisor.shutdown_grace)
            for r in runners:
                r.kill_now()
            try:
                await asyncio.wait_for(asyncio.gather(*(r.wait_stopped() for r in runners)),
                                       KILL_SETTLE)
            except TimeoutError:
                log.error("engines_left_running", engines=[r.name for r in runners if r.pid])

    async def _stop_previous_leftovers(self) -> None:
        """End what a previous incarnation's engines left running, before any engine starts
        (a leftover would keep its engine's port or GPU memory); see :mod:`.leftovers`."""
        records = Records(self.config.state_dir / "procs")
        boot = procs.boot_id()
        if boot is None:
            log.warning("previous_leftovers_unchecked",
                        reason="no kernel boot id in /proc: records cannot be trusted")
            records.clear()
            return
        found: dict[str, set[procs.Proc]] = {}
        for record in records.load():
            found.setdefault(record.engine, set()).update(leftovers(record, boot))
        specs = {spec.name: spec for spec in self.config.engine}

        async def stop(engine: str, left: set[procs.Proc]) -> None:
            spec = specs.get(engine)
            timeout = spec.stop_timeout if spec is not None else max(
                (s.stop_timeout for s in specs.values()), default=KILL_SETTLE)
            log.warning("previous_leftovers_stopping", engine=engine,
                        pids=sorted(p.pid for p in left), timeout=timeout)
            stopped = await procs.stop(left, timeout)
            self._inherited_kills[engine] = len(stopped)
            log.warning("previous_leftovers_stopped", engine=engine,
                        pids=[p.pid for p in stopped])

        await asyncio.gather(*(stop(engine, left) for engine, left in found.items() if left))
        records.clear()

    async def _stop_adopted(self) -> None:
        """Stop every descendant the supervisor adopted and still has, before it exits.

        The engines' own leftovers are being stopped by their runners; what remains (started
        for an engine, or of unknown origin when its environment is unreadable) is stopped the
        same way, with its engine's stop_timeout (the largest for unknown ones).
        """
        runners = list(self._runners.values())
        await asyncio.gather(*(r.wait_swept() for r in runners))
        left = procs.adopted(self.children.pids())
        if not left:
            return
        unknown: set[procs.Proc] = set()
        for proc, engine in left.items():
            runner = self._runners.get(engine) if engine is not None else None
            if runner is not None:
                runner.stop_leftovers(procs.with_descendants([proc]))
            else:
                unknown |= procs.with_descendants([proc])
        if unknown:
            timeout = max((r.spec.stop_timeout for r in runners), default=KILL_SETTLE)
            log.warning("adopted_stopping", pids=sorted(p.pid for p in unknown), timeout=timeout)
            stopped = await procs.stop(unknown, timeout)
            log.warning("adopted_stopped", pids=[p.pid for p in stopped])
        await asyncio.gather(*(r.wait_swept() for r in runners))

    async def _shutdown(self, loop: asyncio.AbstractEventLoop) -> None:
        await self._cancel_tasks()
        for runner in self._runners.values():
            await runner.close()
        if self._metrics_listener is not None:
            self._metrics_listener.close()
        for web_runner in self._web_runners:
            await web_runner.cleanup()
        self.config.control_socket.unlink(missing_ok=True)
        for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            loop.remove_signal_handler(signum)
        self.children.uninstall()
        self.children.reap()
        log.info("supervisor_stopped", zombies_reaped=self.children.zombies_reaped)

    # -- signals and children ----------------------------------------------------------

    def _on_stop_signal(self, signum: int) -> None:
        self._stop_signals += 1
        name = signal.Signals(signum).name
        if self._stop_signals == 1:
            log.info("signal_received", signal=name, action="stopping engines")
            self._stop_event.set()
        else:
            log.warning("signal_received", signal=name, action="killing engines now")
            for runner in self._runners.values():
                runner.kill_now()

    def _on_reload_signal(self) -> None:
        # While reloading, queue another (the file may have changed again); never while
        # starting (the engines are being spawned from the file just read) or stopping.
        if self._phase in ("running", "reloading"):
            self._track(self.reload())

    async def _watchdog(self, interval: float) -> None:
        while True:
            self._notifier.send("WATCHDOG=1")
            await asyncio.sleep(interval)

    # -- reload --------------------------------------------------------------------------

    async def reload(self) -> None:
        """Apply the config file again: add, remove and restart changed engines only."""
        async with self._reload_lock:
            if self.stopping:
                return
            self._phase = "reloading"
            self._notifier.reloading()
            try:
                new = (await self._config_reader.read(self.config.path) if self.config.path
                       else default_config())
            except ConfigError as exc:
                self.last_reload_ok = False
                log.error("reload_refused", error=str(exc), detail="keeping the running config")
            else:
                self.last_reload_ok = True
                self.last_reload_success_at = time.time()
                await self._apply_config(new)
            finally:
                # READY=1 ends the reload for systemd (`systemctl reload` returns): only once
                # the engines were added, removed and restarted, and never after STOPPING=1.
                if self._phase == "reloading":
                    self._phase = "running"
                    self._notifier.send("READY=1", self._status_line())

    async def _apply_config(self, new: Config) -> None:
        if (new.supervisor, new.metrics) != (self.config.supervisor, self.config.metrics):
            log.warning("reload_partial", detail="[supervisor] and [metrics] changes take "
                                                 "effect at the next start")
        new_specs = {spec.name: spec for spec in new.engine}
        gone = [r for name, r in self._runners.items()
                if name not in new_specs or new_specs[name] != r.spec]
        await asyncio.gather(*(r.stop("reload") for r in gone))
        for runner in gone:
            await runner.close()
            del self._runners[runner.name]
        self.config = msgspec.structs.replace(new, supervisor=self.config.supervisor,
                                              metrics=self.config.metrics, demo=self.config.demo)
        old = self._runners
        self._runners = {}
        for spec in new.engine:
            if spec.name in old:
                self._runners[spec.name] = old[spec.name]
            else:
                self._add_runner(spec).start()
        log.info("reloaded", engines=list(self._runners),
                 restarted_or_removed=[r.name for r in gone])
        self._notify_status()

    # -- engines -------------------------------------------------------------------------

    async def _load_gpu_view(self) -> None:
        """NVML, once; without it the GPU memory gate is off, said once here."""
        if self._gpu_view_given:
            return
        self.gpu_view, reason = await asyncio.to_thread(load_gpu_view)
        if self.gpu_view is None:
            gated = [e.name for e in self.config.engine if e.gpus]
            getattr(log, "warning" if gated else "info")(
                "nvml_unavailable", reason=reason, gated_engines=gated,
                effect="no GPU memory gate before starts, no cuzkd_gpu_* metrics")

    async def _gpu_devices(self) -> list[NvmlDevice]:
        if self.gpu_view is None:
            return []
        try:
            return list(await asyncio.to_thread(self.gpu_view.devices))
        except GpuViewError as exc:
            self._limited.log(log, "warning", "nvml_read_failed", error=str(exc))
            return []

    def _add_runner(self, spec: EngineConfig) -> EngineRunner:
        runner = EngineRunner(spec, self.config, children=self.children,
                              binary_resolver=self.binaries.resolve,
                              on_change=self._notify_status, gpu_view=self.gpu_view)
        runner.descendants_killed = self._inherited_kills.pop(spec.name, 0)
        self._runners[spec.name] = runner
        return runner

    def _runner(self, name: str) -> EngineRunner:
        try:
            return self._runners[name]
        except KeyError:
            raise KeyError(f"no engine named {name!r}") from None

    def has_engine(self, name: str) -> bool:
        return name in self._runners

    def engine_pid(self, name: str) -> int | None:
        return self._runner(name).pid

    def engine_names_using_binary(self) -> list[str]:
        """The engines a swap restarts: ``{binary}`` ones, except those stopped.

        An engine an operator stopped stays stopped through a swap; it starts on the active
        release whenever it is started. A ``failed`` one is included: it may have failed for
        lack of a release, and the swap is what starts it.
        """
        return [name for name, r in self._runners.items()
                if r.spec.uses_binary and r.machine.state is not State.STOPPED]

    async def restart_engine(self, name: str, *, swap: bool = False) -> None:
        """Restart ``name``; while stopping, log and do nothing (see :meth:`start_engine`).
        ``swap``: a binary swap's restart (counted as exit cause ``swap``)."""
        if self._refuse_spawn("restart", name):
            return
        await self._runner(name).restart(swap=swap)

    async def stop_engine(self, name: str) -> str | None:
        """Stop ``name``; None once it is stopped, else why not (still running after its
        stop sequence + :data:`KILL_SETTLE` seconds: even SIGKILL did not end it)."""
        runner = self._runner(name)
        runner.request_stop("operator")
        within = runner.spec.stop_budget + KILL_SETTLE
        if await runner.wait_for(lambda: runner.machine.state in (State.STOPPED, State.FAILED),
                                 within=within):
            return None
        return (f"not stopped {within:g}s after the stop request (drain, stop_timeout "
                f"{runner.spec.stop_timeout:g}s, then SIGKILL): engine is {runner.machine.state}")

    async def start_engine(self, name: str) -> None:
        """Start ``name``; while stopping, log and do nothing: shutdown owns the engines, and
        an engine spawned after its stop was awaited would be abandoned running."""
        if self._refuse_spawn("start", name):
            return
        await self._runner(name).start_and_wait()

    async def wait_running(self, name: str) -> str | None:
        """After a start or restart: None once ``name`` is ``running``; else why not -- it
        ended ``failed``, in ``backoff`` or ``stopped``, or was still not running after its
        start_timeout + :data:`START_WAIT_SLACK`."""
        runner = self._runner(name)
        within = runner.spec.start_timeout + START_WAIT_SLACK
        settled = (State.RUNNING, State.FAILED, State.BACKOFF, State.STOPPED)
        if not await runner.wait_for(lambda: runner.machine.state in settled, within=within):
            return (f"not running within start_timeout + {START_WAIT_SLACK:g}s ({within:g}s): "
                    f"{_not_up(runner)}")
        if runner.machine.state is State.RUNNING:
            return None
        return f"did not start: {_not_up(runner)}"

    def _refuse_spawn(self, action: str, name: str) -> bool:
        if self.stopping:
            log.warning(f"{action}_refused", engine=name, reason="supervisor stopping")
        return self.stopping

    async def wait_healthy(self, name: str, settle: float) -> str | None:
        """None once the status answered and the process then stayed up ``settle`` seconds.

        Otherwise why not: the status stayed silent for start_timeout, or the process (the one
        running when called) ended before answering or during the settle period; the reason
        names its exit cause.
        """
        runner = self._runner(name)
        pid = runner.pid
        if pid is None:
            return _not_up(runner)

        def gone() -> bool:
            return runner.pid != pid

        timeout = runner.spec.start_timeout
        if not await runner.wait_for(lambda: gone() or runner.machine.state is not State.STARTING,
                                     within=timeout):
            why = f" (last error: {runner.machine.last_error})" if runner.machine.last_error else ""
            return f"status did not answer within start_timeout ({timeout:g}s){why}"
        if gone() or runner.machine.state is not State.RUNNING:
            return f"process {pid} ended before its status answered: {_not_up(runner)}"
        if await runner.wait_for(lambda: gone() or runner.machine.state is not State.RUNNING,
                                 within=settle):
            return (f"process {pid} did not stay up for the {settle:g}s settle period: "
                    f"{_not_up(runner)}")
        return None

    async def engine_status(self, name: str) -> tuple[StatusDocument | None,
                                                      Extensions | None]:
        """A fresh status document of ``name`` and its cumulative extensions (the engine's
        own, or derived from the polls for a plain cuzk); (None, None) without an answer."""
        runner = self._runner(name)
        if runner.status is None or runner.machine.state is not State.RUNNING:
            return None, None
        doc = await runner.status.fetch(max_age=0.0)
        return doc, runner.status.extensions() if doc is not None else None

    def engine_status_address(self, name: str) -> str | None:
        return self._runner(name).status_address

    async def run_oneshot(self, argv: Sequence[str], timeout: float,
                          env: Mapping[str, str] | None = None) -> str:
        """A swap's smoke run or canary check, through the child table (see
        :meth:`ChildTable.run_oneshot`)."""
        return await self.children.run_oneshot(argv, timeout, env)

    # -- views ---------------------------------------------------------------------------

    async def sample(self, max_age: float = 1.0) -> SupervisorSample:
        runners = list(self._runners.values())
        engines = await asyncio.gather(*(r.sample(max_age) for r in runners))
        return SupervisorSample(
            engines=[dataclasses.replace(eng, release=self._release_of(r))
                     for r, eng in zip(runners, engines, strict=True)],
            zombies_reaped_total=self.children.zombies_reaped,
            swaps_total=dict(self.binaries.coordinator.counts),
            rollbacks_total=dict(self.binaries.coordinator.rollback_counts),
            active_release=self.binaries.active_release(),
            config_reload_ok=self.last_reload_ok,
            config_reload_success_time=self.last_reload_success_at,
            proof_deadlines=self.config.metrics.deadlines(),
            gpus=await self._gpu_devices(),
        )

    def engines_info(self) -> list[dict[str, Any]]:
        return [self._info(r) for r in self._runners.values()]

    def engine_info(self, name: str) -> dict[str, Any]:
        return self._info(self._runner(name))

    def _info(self, runner: EngineRunner) -> dict[str, Any]:
        return {**runner.info(), "release": self._release_of(runner)}

    def _release_of(self, runner: EngineRunner) -> str | None:
        """The release a ``{binary}`` engine's process executes (from ``/proc/PID/exe``)."""
        if not runner.spec.uses_binary:
            return None
        return self.binaries.release_of(runner.pid, runner.started_at)

    def about(self) -> dict[str, Any]:
        running = sum(r.machine.state is State.RUNNING for r in self._runners.values())
        return {
            "pid": os.getpid(),
            "state": self._phase,
            "started_at": self._started_at,
            "config": self.config.path,
            "state_dir": str(self.config.state_dir),
            "control_socket": str(self.config.control_socket),
            "metrics_listen": self.metrics_address,
            "engines_running": running,
            "engines_total": len(self._runners),
            "zombies_reaped_total": self.children.zombies_reaped,
            "active_release": self.binaries.active_release(),
        }

    async def status_document(self) -> dict[str, Any]:
        """``GET /status``: supervisor state and each engine's last status document."""
        sample = await self.sample(max_age=1.0)
        engines = []
        for info, eng in zip(self.engines_info(), sample.engines, strict=True):
            engines.append({**info, "status": msgspec.to_builtins(eng.status)})
        return {"supervisor": self.about(), "engines": engines}

    def _status_line(self) -> str:
        about = self.about()
        return f"STATUS={about['engines_running']}/{about['engines_total']} engines running"

    def _notify_status(self) -> None:
        line = self._status_line()
        if line != self._last_status_line and self._phase != "stopping":
            self._last_status_line = line
            self._notifier.send(line)

    # -- task ownership --------------------------------------------------------------------

    def _track(self, coro: Coroutine[Any, Any, None]) -> None:
        self._tasks.start(coro)

    async def _cancel_tasks(self) -> None:
        await self._tasks.cancel_all()


def _not_up(runner: EngineRunner) -> str:
    """Why an engine is not up, naming only what is known (never "error: None")."""
    m = runner.machine
    known = [f"last exit: {m.last_exit_cause}" if m.last_exit_cause else "",
             f"error: {m.last_error}" if m.last_error else ""]
    detail = ", ".join(part for part in known if part)
    return f"engine is {m.state}" + (f" ({detail})" if detail else "")
