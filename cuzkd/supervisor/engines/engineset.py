"""The engine set: every configured engine's runner, and everything done to them as a group.

It is what the control API, the read-only readout and a binary swap act on -- it implements
:class:`~cuzkd.supervisor.web.targets.ControlTarget` and the swap's
:class:`~cuzkd.swap.rolling.SwapTarget` -- so none of them needs the daemon. A reload is a pure
:func:`~cuzkd.supervisor.core.reloadplan.plan` (old specs, new specs → stop / keep / start / change)
that :meth:`EngineSet.apply` carries out; shutdown is :meth:`EngineSet.stop_all`. Engine processes
are spawned through the :class:`~cuzkd.supervisor.proc.children.ChildTable`.

The set holds the one current config (:attr:`EngineSet.config`: a reload replaces it, and
every reader -- the readout, the reload, the daemon -- goes through it). Two things it is handed
by the composition root rather than owning: the supervisor's phase, read-only (it is
``stopping`` when the phase is: no engine starts behind the shutdown's back), and the
:class:`BinaryReleases` (``{binary}``'s path at each spawn, the release a process executes).
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

import msgspec
import structlog

from cuzkd.config import START_WAIT_SLACK, Config, EngineConfig, door_address, state_dir
from cuzkd.gpus import GpuView, load_gpu_view
from cuzkd.metrics.sample import EngineSample
from cuzkd.states import AT_REST, START_SETTLED, State, StopReason
from cuzkd.status.client import StatusSource
from cuzkd.status.document import Extensions, StatusDocument
from cuzkd.supervisor.core.handover import EngineHandover
from cuzkd.supervisor.core.healthwait import HealthWait, Observation
from cuzkd.supervisor.core.phase import PhaseView
from cuzkd.supervisor.core.reloadplan import ReloadPlan, plan
from cuzkd.supervisor.core.upgradegate import EngineMoment
from cuzkd.supervisor.engines.info import EngineInfo
from cuzkd.supervisor.engines.runclock import RunClock
from cuzkd.supervisor.engines.runner import EngineRunner
from cuzkd.supervisor.engines.seat import DoorSeat
from cuzkd.supervisor.proc import pids
from cuzkd.supervisor.proc.children import ChildTable
from cuzkd.supervisor.proc.leftovers import Records, leftovers

log = structlog.get_logger("cuzkd.supervisor")

#: SIGTERM to SIGKILL for leftovers of an engine not (or no longer) configured, which get the
#: largest configured stop_timeout: this when no engine is configured at all.
FALLBACK_STOP_TIMEOUT = 5.0


@dataclass(frozen=True)
class EngineReading:
    """One engine as a scrape saw it: its control-API entry and its sample, taken together
    (a reload between the two can never attach one engine's status to another)."""

    info: EngineInfo
    sample: EngineSample


class BinaryReleases(Protocol):
    """The releases ``{binary}`` engines execute (:class:`~.binaries.EngineBinaries`)."""

    def resolve(self) -> str:
        """The path to exec for ``{binary}`` now; raises SpawnError when there is none."""
        ...

    def release_of(self, pid: int | None, started_at: float | None) -> str | None:
        """The release the process ``pid``, spawned at ``started_at``, executes."""
        ...


class EngineSet:
    """Every configured engine's runner, and what is done to them as a group: start, reload,
    shutdown, the control API's and the swap's targets. Wide, not deep: one method per group
    operation or query over the runners."""

    def __init__(self, config: Config, children: ChildTable, *,
                 binaries: BinaryReleases, phase: PhaseView,
                 on_change: Callable[[], None] = lambda: None,
                 gpu_view: GpuView | None = None,
                 clock: RunClock | None = None,
                 seats: Callable[[str], DoorSeat | None] = lambda name: None) -> None:
        """``clock``: the runners' clock, blind to the supervisor's freezes (tests on virtual
        time pass ``RunClock(loop.time)``). ``seats``: an engine's seat behind its front door
        by engine name (None: no door in front of it)."""
        self._config = config
        self.children = children
        #: NVML for the GPU memory gate (and cuzkd_gpu_*); :meth:`load_gpu_view` unless given
        self.gpu_view = gpu_view
        self._gpu_view_given = gpu_view is not None
        self._binaries = binaries
        self._phase = phase
        self._on_change = on_change
        self._seats = seats
        #: the supervisor's one clock for engine deadlines (the daemon runs its heartbeat)
        self.clock = clock if clock is not None else RunClock()
        self._clock = self.clock.now
        self._runners: dict[str, EngineRunner] = {}
        #: engine -> leftovers of the previous supervisor stopped at start-up (counted once
        #: that engine's runner exists)
        self._inherited_kills: dict[str, int] = {}

    # -- the set -----------------------------------------------------------------------

    def __len__(self) -> int:
        return len(self._runners)

    def names(self) -> list[str]:
        return list(self._runners)

    @property
    def config(self) -> Config:
        """The config the engines run from: the one read at start, then the last reload's
        (whose ``[supervisor]``, ``[metrics]`` and demo setting stay those of the start)."""
        return self._config

    def running(self) -> int:
        return sum(r.state is State.RUNNING for r in self._runners.values())

    @property
    def stopping(self) -> bool:
        """True once shutdown began (the supervisor's phase): nothing is started any more."""
        return self._phase.stopping

    def start_all(self) -> None:
        """Add and start every configured engine (nothing once stopping)."""
        for spec in self.config.engine:
            self._add_started(spec)

    def adopt_all(self, handed: Sequence[EngineHandover]) -> None:
        """Add every configured engine, carrying on from the old code's hand-over where it
        has one (``cuzkd upgrade``: the same config, so every engine has one), else started."""
        by_name = {engine.name: engine for engine in handed}
        for spec in self.config.engine:
            if (engine := by_name.get(spec.name)) is not None:
                self.add(spec).adopt(engine)
            else:
                self._add_started(spec)

    def handover(self) -> list[EngineHandover]:
        """Every engine for the program that replaces the supervisor."""
        return [runner.handover() for runner in self._runners.values()]

    def moments(self) -> list[EngineMoment]:
        """What each engine is doing, for the upgrade's gate."""
        return [runner.moment() for runner in self._runners.values()]

    def _add_started(self, spec: EngineConfig) -> None:
        """Add ``spec``'s runner and start it, unless stopping: an engine spawned after the
        shutdown's stop_all took its list would be abandoned running (then SIGKILLed by
        PDEATHSIG, without a drain)."""
        runner = self.add(spec)
        if not self.stopping:
            runner.start()

    async def load_gpu_view(self) -> None:
        """NVML, once, before the first start; without it the GPU memory gate is off, said
        once here."""
        if self._gpu_view_given:
            return
        self.gpu_view, reason = await asyncio.to_thread(load_gpu_view)
        if self.gpu_view is None:
            gated = [e.name for e in self.config.engine if e.gpus]
            getattr(log, "warning" if gated else "info")(
                "nvml_unavailable", reason=reason, gated_engines=gated,
                effect="no GPU memory gate before starts, no cuzkd_gpu_* metrics")

    def add(self, spec: EngineConfig) -> EngineRunner:
        runner = EngineRunner(spec, self.config, children=self.children,
                              binary_resolver=self._binaries.resolve,
                              on_change=self._on_change, gpu_view=self.gpu_view,
                              clock=self.clock,
                              inherited_kills=self._inherited_kills.pop(spec.name, 0),
                              seat=self._seats(spec.name))
        self._runners[spec.name] = runner
        return runner

    def runner(self, name: str) -> EngineRunner:
        try:
            return self._runners[name]
        except KeyError:
            raise KeyError(f"no engine named {name!r}") from None

    def demo_targets(self) -> list[tuple[StatusSource, str | None]]:
        """The bundled engines' status sources and door addresses (None: no door): the demo
        load's way to each engine."""
        return [(r.status_source, door_address(self.config, r.spec)) for r in self._runners.values()
                if r.spec.bundled and r.status_source is not None]

    async def apply(self, new: Config) -> ReloadPlan:
        """Carry out a reload to ``new``'s engines (its other tables are the caller's)."""
        todo = plan({name: r.spec for name, r in self._runners.items()}, new.engine)
        gone = [self._runners[name] for name in (*todo.stop, *todo.change)]
        await asyncio.gather(*(r.stop(StopReason.RELOAD) for r in gone))
        for runner in gone:
            await runner.close()
            del self._runners[runner.name]
        self._config = msgspec.structs.replace(new, supervisor=self.config.supervisor,
                                               metrics=self.config.metrics, demo=self.config.demo)
        old = self._runners
        self._runners = {}
        for spec in new.engine:
            if spec.name in old:
                self._runners[spec.name] = old[spec.name]
            else:  # unless a shutdown came while the old ones were stopping
                self._add_started(spec)
        log.info("supervisor_reloaded", engines=list(self._runners),
                 restarted_or_removed=[r.name for r in gone])
        return todo

    async def stop_all(self, grace: float, *, hurry: bool = False) -> None:
        """Run every engine's stop sequence in parallel; ``grace`` caps them all: each drains
        for what the grace leaves after its stop_timeout, and after it whatever is left gets
        SIGKILL. ``hurry``: SIGKILL at once (a second stop signal). The phase is ``stopping``
        by then: no engine starts after its stop."""
        runners = list(self._runners.values())
        for r in runners:
            r.request_stop(StopReason.SHUTDOWN, within=grace)
        if hurry:
            self.kill_now()
        try:
            await asyncio.wait_for(asyncio.gather(*(r.wait_stopped() for r in runners)), grace)
        except TimeoutError:
            log.warning("shutdown_grace_elapsed", grace=grace)
            self.kill_now()
            try:
                await asyncio.wait_for(asyncio.gather(*(r.wait_stopped() for r in runners)),
                                       pids.KILL_SETTLE)
            except TimeoutError:
                log.error("engines_left_running", engines=[r.name for r in runners if r.pid])

    def kill_now(self) -> None:
        """SIGKILL every stopping engine and every leftover being stopped."""
        for runner in self._runners.values():
            runner.kill_now()

    async def close(self) -> None:
        for runner in self._runners.values():
            await runner.close()

    async def stop_previous_leftovers(self) -> None:
        """End what a previous incarnation's engines left running, before any engine starts
        (a leftover would keep its engine's port or GPU memory); see :mod:`.leftovers`."""
        records = Records(state_dir(self.config) / "procs")
        boot = pids.boot_id()
        if boot is None:
            log.warning("previous_leftovers_unchecked",
                        reason="no kernel boot id in /proc: records cannot be trusted")
            records.clear()
            return
        found: dict[str, set[pids.Proc]] = {}
        for record in records.load():
            found.setdefault(record.engine, set()).update(leftovers(record, boot))
        specs = {spec.name: spec for spec in self.config.engine}

        async def stop(engine: str, left: set[pids.Proc]) -> None:
            spec = specs.get(engine)
            timeout = spec.stop_timeout if spec is not None else max(
                (s.stop_timeout for s in specs.values()), default=FALLBACK_STOP_TIMEOUT)
            log.warning("previous_leftovers_stopping", engine=engine,
                        pids=sorted(p.pid for p in left), timeout=timeout)
            stopped = await pids.stop(left, timeout)
            self._inherited_kills[engine] = len(stopped)
            log.warning("previous_leftovers_stopped", engine=engine,
                        pids=[p.pid for p in stopped])

        await asyncio.gather(*(stop(engine, left) for engine, left in found.items() if left))
        records.clear()

    async def stop_adopted(self) -> None:
        """Stop every descendant the supervisor adopted and still has, before it exits.

        The engines' own leftovers are being stopped by their runners; what remains (started
        for an engine, or of unknown origin when its environment is unreadable) is stopped the
        same way, with its engine's stop_timeout (the largest for unknown ones).
        """
        runners = list(self._runners.values())
        await asyncio.gather(*(r.wait_leftovers_stopped() for r in runners))
        left = pids.adopted(self.children.pids())
        if not left:
            return
        unknown: set[pids.Proc] = set()
        for proc, engine in left.items():
            runner = self._runners.get(engine) if engine is not None else None
            if runner is not None:
                runner.stop_leftovers(pids.with_descendants([proc]))
            else:
                unknown |= pids.with_descendants([proc])
        if unknown:
            timeout = max((r.spec.stop_timeout for r in runners), default=FALLBACK_STOP_TIMEOUT)
            log.warning("adopted_stopping", pids=sorted(p.pid for p in unknown), timeout=timeout)
            stopped = await pids.stop(unknown, timeout)
            log.warning("adopted_stopped", pids=[p.pid for p in stopped])
        await asyncio.gather(*(r.wait_leftovers_stopped() for r in runners))

    # -- the control target ------------------------------------------------------------

    def has_engine(self, name: str) -> bool:
        return name in self._runners

    def engines_info(self) -> list[EngineInfo]:
        return [self._info(r) for r in self._runners.values()]

    def engine_info(self, name: str) -> EngineInfo:
        return self._info(self.runner(name))

    def engine_names_using_binary(self) -> list[str]:
        """The engines a swap restarts: ``{binary}`` ones, except those stopped.

        An engine an operator stopped stays stopped through a swap; it starts on the active
        release whenever it is started. A ``failed`` one is included: it may have failed for
        lack of a release, and the swap is what starts it.
        """
        return [name for name, r in self._runners.items()
                if r.spec.uses_binary and r.state is not State.STOPPED]

    async def restart_engine(self, name: str, *, swap: bool = False) -> None:
        """Restart ``name``; while stopping, log and do nothing (see :meth:`start_engine`).
        ``swap``: a binary swap's restart (counted as exit cause ``swap``)."""
        if self._refuse_spawn(name, restart=True):
            return
        await self.runner(name).restart(swap=swap)

    async def stop_engine(self, name: str) -> str | None:
        """Stop ``name``; None once it is stopped, else why not (still running after its
        stop sequence + :data:`pids.KILL_SETTLE` seconds: even SIGKILL did not end it)."""
        runner = self.runner(name)
        runner.request_stop(StopReason.OPERATOR)
        within = runner.spec.stop_budget + pids.KILL_SETTLE
        if await runner.wait_for(lambda: runner.state in AT_REST, within=within):
            return None
        return (f"not stopped {within:g}s after the stop request (drain, stop_timeout "
                f"{runner.spec.stop_timeout:g}s, then SIGKILL): engine is {runner.state}")

    async def start_engine(self, name: str) -> None:
        """Start ``name``; while stopping, log and do nothing: shutdown owns the engines, and
        an engine spawned after its stop was awaited would be abandoned running."""
        if self._refuse_spawn(name, restart=False):
            return
        await self.runner(name).start_and_wait()

    async def wait_running(self, name: str) -> str | None:
        """After a start or restart: None once ``name`` is ``running``; else why not -- it
        ended ``failed``, in ``backoff`` or ``stopped``, or was still not running after its
        start_timeout + :data:`START_WAIT_SLACK`."""
        runner = self.runner(name)
        within = runner.spec.start_timeout + START_WAIT_SLACK
        if not await runner.wait_for(lambda: runner.state in START_SETTLED, within=within):
            return (f"not running within start_timeout + {START_WAIT_SLACK:g}s ({within:g}s): "
                    f"{runner.not_up_reason()}")
        if runner.state is State.RUNNING:
            return None
        return f"did not start: {runner.not_up_reason()}"

    def _refuse_spawn(self, name: str, *, restart: bool) -> bool:
        if self.stopping:
            log.warning("engine_restart_refused" if restart else "engine_start_refused",
                        engine=name, reason="supervisor stopping")
        return self.stopping

    async def wait_healthy(self, name: str, settle: float) -> str | None:
        """None once the status answered and the process then stayed up ``settle`` seconds;
        otherwise why not (the rule: :class:`~cuzkd.supervisor.core.healthwait.HealthWait`)."""
        runner = self.runner(name)
        if runner.pid is None:
            return runner.not_up_reason()
        clock = self._clock
        watch = HealthWait(runner.pid, runner.spec.start_timeout, settle, started=clock())

        def over(now: float | None = None) -> bool:
            return watch.observe(Observation(clock() if now is None else now, runner.pid,
                                             runner.state, runner.last_error,
                                             runner.not_up_reason()))

        while not over():
            deadline = watch.deadline  # moves once the status answered: wait anew then
            def moved(at: float = deadline) -> bool:
                return over() or watch.deadline != at

            changed = await runner.wait_for(moved, within=max(0.0, deadline - clock()))
            if not changed and over(max(clock(), deadline)):  # timers may fire a hair early
                break
        return watch.outcome

    async def engine_status(self, name: str) -> tuple[StatusDocument | None,
                                                      Extensions | None]:
        """A fresh status document of ``name`` and its cumulative extensions (the engine's
        own, or derived from the polls for a plain cuzk); (None, None) without an answer."""
        runner = self.runner(name)
        if runner.status_source is None or runner.state is not State.RUNNING:
            return None, None
        doc = await runner.status_source.fetch(max_age=0.0)
        return doc, runner.status_source.extensions() if doc is not None else None

    def engine_status_address(self, name: str) -> str | None:
        return self.runner(name).status_address

    async def run_oneshot(self, argv: Sequence[str], timeout: float,
                          env: Mapping[str, str] | None = None) -> str:
        """A swap's smoke run or canary check, through the child table (see
        :meth:`ChildTable.run_oneshot`)."""
        return await self.children.run_oneshot(argv, timeout, env)

    # -- readings ----------------------------------------------------------------------

    async def readings(self, max_age: float = 1.0) -> list[EngineReading]:
        """Every engine's entry and sample, from one list of runners (:class:`EngineReading`)."""
        runners = list(self._runners.values())
        samples = await asyncio.gather(*(r.sample(max_age) for r in runners))
        return [EngineReading(self._info(r), dataclasses.replace(s, release=self._release_of(r)))
                for r, s in zip(runners, samples, strict=True)]

    def _info(self, runner: EngineRunner) -> EngineInfo:
        return runner.info(release=self._release_of(runner))

    def _release_of(self, runner: EngineRunner) -> str | None:
        """The release a ``{binary}`` engine's process executes (from ``/proc/PID/exe``)."""
        if not runner.spec.uses_binary:
            return None
        return self._binaries.release_of(runner.pid, runner.started_at)
