"""A front door's book (INTERIM, until s4-h1's lands): where each call goes, pure, fed ``now``.

Calls are placed on an engine that admits calls (the one with fewest in flight), or held while
none does (bounded in count, bytes and time: CRITICAL and HIGH placed first when one comes),
or refused. A ``SubmitProof``'d job counts as in flight on its engine until its
``AwaitProof`` returns, and ``AwaitProof`` goes to that engine. A ``Prove``/``SubmitProof``
on an engine that died is placed again once (its bytes were kept, within ``retry_max_bytes``),
else refused. At shutdown held and new calls are refused at once.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from cuzkd.config.doors import DoorPlan

#: Methods whose request is kept for one retry after their engine died under them.
RETRIED = frozenset({"Prove", "SubmitProof"})
#: cuzk's Priority values placed first out of the hold (HIGH, CRITICAL).
URGENT = 3


@dataclass(frozen=True)
class CallFacts:
    """What the book needs of one call."""

    #: the method's name (``Prove``)
    method: str
    #: cuzk's Priority value (0 when the request has none)
    priority: int
    #: the job the call creates or names ("" for none)
    job_id: str


@dataclass(frozen=True)
class Send:
    """Relay ``call`` to ``engine``."""

    call: int
    engine: str
    retry: bool = False


@dataclass(frozen=True)
class Hold:
    """``call`` waits in the door for an engine to take it."""

    call: int


@dataclass(frozen=True)
class Refuse:
    """Answer ``call`` ``UNAVAILABLE`` with ``message``; ``reason``: a bounded word."""

    call: int
    reason: str
    message: str


Decision = Send | Hold | Refuse


@dataclass
class _Call:
    facts: CallFacts
    size: int
    arrived: float
    engine: str | None = None
    held_since: float | None = None
    retained: bool = False
    retried: bool = False


@dataclass
class _Engine:
    up: bool = False
    admitting: bool = False
    jobs: set[str] = field(default_factory=set)


class DoorBook:
    def __init__(self, plan: DoorPlan, now: float) -> None:
        self.plan = plan
        self._engines = {name: _Engine() for name in plan.engines}
        self._calls: dict[int, _Call] = {}
        self._job_engine: dict[str, str] = {}
        self._retained_bytes = 0
        self._shutdown = False

    # -- queries -------------------------------------------------------------------------

    def in_flight(self, engine: str) -> int:
        return (sum(c.engine == engine for c in self._calls.values())
                + len(self._engines[engine].jobs))

    def admitting(self) -> list[str]:
        return [name for name, e in self._engines.items() if e.admitting]

    def held(self) -> list[int]:
        return [i for i, c in self._calls.items() if c.held_since is not None]

    def next_deadline(self) -> float | None:
        held = [c.held_since for c in self._calls.values() if c.held_since is not None]
        return min(held) + self.plan.hold_timeout if held else None

    # -- events ----------------------------------------------------------------------------

    def arrive(self, now: float, call: int, facts: CallFacts, size: int) -> list[Decision]:
        if self._shutdown:
            return [Refuse(call, "shutdown", "cuzkd is shutting down")]
        record = _Call(facts, size, now)
        if facts.method in RETRIED and self._retained_bytes + size <= self.plan.retry_max_bytes:
            record.retained = True
            self._retained_bytes += size
        self._calls[call] = record
        owner = self._job_engine.get(facts.job_id) if facts.method == "AwaitProof" else None
        if owner is not None and self._engines[owner].up:
            record.engine = owner
            return [Send(call, owner)]
        return self._place(now, call, record)

    def answered(self, now: float, call: int) -> list[Decision]:
        record = self._forget(call)
        if record is not None and record.engine is not None:
            job = record.facts.job_id
            if record.facts.method == "SubmitProof":
                self._engines[record.engine].jobs.add(job)
                self._job_engine[job] = record.engine
            elif record.facts.method == "AwaitProof":
                self._engines[record.engine].jobs.discard(job)
                self._job_engine.pop(job, None)
        return []

    def abandoned(self, now: float, call: int) -> list[Decision]:
        self._forget(call)
        return []

    def admit(self, now: float, engine: str) -> list[Decision]:
        state = self._engines[engine]
        state.up = state.admitting = True
        return self._place_held(now)

    def stop_admitting(self, now: float, engine: str) -> list[Decision]:
        self._engines[engine].admitting = False
        return []

    def gone(self, now: float, engine: str, *, crashed: bool) -> list[Decision]:
        state = self._engines[engine]
        state.up = state.admitting = False
        for job in state.jobs:
            self._job_engine.pop(job, None)
        state.jobs.clear()
        out: list[Decision] = []
        for call, record in list(self._calls.items()):
            if record.engine != engine:
                continue
            record.engine = None
            if record.retained and not record.retried:
                record.retried = True
                out += self._place(now, call, record, retry=True)
            else:
                self._forget(call)
                out.append(Refuse(call, "engine_gone",
                                  f"engine {engine} ended under the call"
                                  + (" (already retried once)" if record.retried else "")))
        return out

    def expire(self, now: float) -> list[Decision]:
        out: list[Decision] = []
        for call, record in list(self._calls.items()):
            if record.held_since is not None and now - record.held_since >= self.plan.hold_timeout:
                self._forget(call)
                out.append(Refuse(call, "hold_timeout",
                                  f"held {now - record.held_since:.0f}s (hold_timeout): no "
                                  "engine behind the door took it"))
        return out

    def shutdown(self, now: float) -> list[Decision]:
        self._shutdown = True
        out: list[Decision] = []
        for call in self.held():
            self._forget(call)
            out.append(Refuse(call, "shutdown", "cuzkd is shutting down"))
        return out

    # -- placing -----------------------------------------------------------------------

    def _place(self, now: float, call: int, record: _Call, *,
               retry: bool = False) -> list[Decision]:
        engines = self.admitting()
        if engines:
            engine = min(engines, key=self.in_flight)
            record.engine, record.held_since = engine, None
            return [Send(call, engine, retry)]
        held = [c for c in self._calls.values() if c.held_since is not None]
        if len(held) >= self.plan.hold_max_calls:
            self._forget(call)
            return [Refuse(call, "hold_full", f"{len(held)} calls held (hold_max_calls)")]
        if sum(c.size for c in held) + record.size > self.plan.hold_max_bytes:
            self._forget(call)
            return [Refuse(call, "hold_full", "held calls' bytes at hold_max_bytes")]
        record.held_since = now
        return [Hold(call)]

    def _place_held(self, now: float) -> list[Decision]:
        held = sorted(self.held(), key=lambda i: (self._calls[i].facts.priority < URGENT,
                                                  self._calls[i].arrived))
        out: list[Decision] = []
        for call in held:
            out += self._place(now, call, self._calls[call], retry=self._calls[call].retried)
        return out

    def _forget(self, call: int) -> _Call | None:
        record = self._calls.pop(call, None)
        if record is not None and record.retained:
            self._retained_bytes -= record.size
        return record
