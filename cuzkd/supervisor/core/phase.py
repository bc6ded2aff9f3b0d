"""The supervisor's phase and the last reload's outcome: one owner, one source of truth.

``starting`` (the state dir is locked, the engines are being started from the file just read)
→ ``running`` ⇄ ``reloading`` (a reload reads and applies the file again), ⇄ ``upgrading``
(``cuzkd upgrade``: its dry run, then the exec; back to ``running`` when refused) → ``stopping``
(from any phase, for good: the first stop signal or ``request_stop``). Whether a reload may
run, whether a signal reloads, whether the engine set may still start an engine and what
``/v1/supervisor`` calls the supervisor's ``state`` are all read from here, so they can never
disagree.

The composition root (:mod:`cuzkd.supervisor.daemon.root`) creates the one
:class:`SupervisorPhase` and is, with the reload it runs, the only writer; the views, the
routes, the signal decision and the engine set read it through :class:`PhaseView`, its
read-only half. Pure: times come in as arguments, and it imports nothing but the names
(:class:`cuzkd.states.Phase`; the signal decision, imported first thing at ``cuzkd run``'s start,
reads them; not even ``typing``).
"""

from __future__ import annotations

from cuzkd.states import Phase


class PhaseView:
    """The phase as its readers see it: read-only properties (they can never change it)."""

    def __init__(self, started_at: float) -> None:
        """``started_at``: the unix time the supervisor read its config, which counts as the
        first successful reload (``cuzkd_config_last_reload_successful`` starts at 1)."""
        self._phase = Phase.STARTING
        self._reload_ok = True
        self._reload_success_at = started_at

    @property
    def phase(self) -> Phase:
        return self._phase

    @property
    def stopping(self) -> bool:
        """True from the first stop request on: nothing is started or reloaded any more."""
        return self._phase is Phase.STOPPING

    @property
    def reload_ok(self) -> bool:
        """The last reload applied its file (a refused one keeps the running config)."""
        return self._reload_ok

    @property
    def reload_success_at(self) -> float:
        """Unix time of the last reload that applied its file."""
        return self._reload_success_at


class SupervisorPhase(PhaseView):
    """The phase's transitions: only the composition root and its reload call them."""

    def started(self) -> None:
        """The engines were started: ``running``, unless a stop came during start-up."""
        if self._phase is Phase.STARTING:
            self._phase = Phase.RUNNING

    def stop(self) -> None:
        """The first stop request: ``stopping``, whatever the phase was (it never ends)."""
        self._phase = Phase.STOPPING

    def begin_reload(self) -> str | None:
        """``reloading`` and None when a reload may run now; else why not (the file may be
        fine, the moment is not): while starting the engines are being spawned from the file
        just read, while stopping nothing changes any more."""
        if self._phase is Phase.STOPPING:
            return "stopping"
        if self._phase is Phase.STARTING:
            return "still starting"
        if self._phase is Phase.UPGRADING:
            return "upgrading"
        self._phase = Phase.RELOADING
        return None

    def reload_read(self, ok: bool, now: float) -> None:
        """The reload read its file: ``ok`` it validated (and is being applied), at unix time
        ``now``; else it was refused and the running config kept."""
        self._reload_ok = ok
        if ok:
            self._reload_success_at = now

    def end_reload(self) -> bool:
        """The reload is over: back to ``running``; False when a stop came meanwhile (then
        the phase stays ``stopping``, and systemd must not hear ``READY=1`` again)."""
        if self._phase is not Phase.RELOADING:
            return False
        self._phase = Phase.RUNNING
        return True

    def begin_upgrade(self) -> None:
        """An upgrade passed its gate (:func:`~cuzkd.supervisor.core.upgradegate.upgrade_refusal`
        asked this phase first): ``upgrading`` until it is refused, or the program is replaced."""
        if self._phase is Phase.RUNNING:
            self._phase = Phase.UPGRADING

    def end_upgrade(self) -> None:
        """The upgrade was refused or its exec failed: ``running`` again, unless a stop came."""
        if self._phase is Phase.UPGRADING:
            self._phase = Phase.RUNNING

    def adopted(self, reload_ok: bool, reload_success_at: float) -> None:
        """This program took a running supervisor over (``cuzkd upgrade``): the last reload's
        outcome is the old code's."""
        self._reload_ok, self._reload_success_at = reload_ok, reload_success_at
