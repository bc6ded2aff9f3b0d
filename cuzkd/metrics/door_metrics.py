"""The ``cuzkd_door_*`` families: every ``Prove`` a front door relayed, and what it held.

cuzk's own figures miss what a caller lives through: ``/status`` lists only PoRep and SnapDeals
and never counts a failure, ``GetMetrics`` keeps a summary of its last 1000 proofs. Every proof
Curio asks for passes the door, and its reply carries cuzk's own timings of that proof
(``queue_wait_ms``, ``srs_load_ms``, ``synthesis_ms``, ``gpu_compute_ms``, ``total_ms``), so the
door measures each proof exactly: all four kinds, failures included, as histograms in seconds
by kind, and a count by kind, priority and result. Beside them, what the door did itself: calls
held while no engine could take one, how long each was held (by kind: a WinningPoSt's wait is
what decides a block), calls sent again after their engine died, calls refused, deadline calls
answered past their deadline, PoSts that waited for their engine's one PoSt slot, work a
drain stopped waiting for, request ids quarantined.

Unlike the other families these are events, not readings of a document, so they are kept here
for the supervisor's life (a door's first engine name is its ``door`` label: bounded by the
config and readable, where an address is neither) and collected at each scrape as plain
families (no ``_created`` series: :mod:`cuzkd.metrics.exposition`). Every label value comes from
a fixed vocabulary: the proto's enums (a number this cuzkd does not know is ``other``,
``unspecified``, ``unknown``), gRPC's status codes and :mod:`cuzkd.states`' door words; never a
request id. A request is read with :mod:`cuzkd.cuzk.wire`, which jumps over a 51 MB payload
instead of copying it. Everything is called on the event loop (grpc.aio's handlers and the
scrape share it), so nothing here locks.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterator, Mapping, Sequence

import grpc
import msgspec
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    InfoMetricFamily,
)
from prometheus_client.metrics_core import Metric

from cuzkd.cuzk import proving_pb2 as pb
from cuzkd.cuzk.wire import ProveCall, ProveResult, read_call, read_result
from cuzkd.kinds import enum_kind
from cuzkd.metrics.tally import le_labels
from cuzkd.priority import Priority
from cuzkd.states import DoorAbandon, DoorRefusal, DoorRetry, HoldEnd

#: Seconds, for proofs from a 10 ms WinningPoSt on a warm engine to a 30 min PoRep on a small
#: host; 20 s and 20 min (1200) are the default deadlines of winning-post and window-post.
PROOF_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 45.0,
                 60.0, 120.0, 300.0, 600.0, 1200.0, 1800.0, 3600.0)
#: Seconds a call was held: a moment between two engines, a restart's SRS load (30-90 s), a
#: hold_timeout of several minutes.
HOLD_BUCKETS = (0.001, 0.01, 0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1200.0,
                1800.0)

#: Priority number -> label value (``low`` ... ``critical``; PRIORITY_UNSPECIFIED is
#: ``unspecified``, and so is a number the proto does not have)
_PRIORITIES = {priority.value: priority.name.removeprefix("PRIORITY_").lower()
               for priority in Priority}
#: AwaitProofResponse.Status number -> result (``completed``, ``failed``, ``cancelled``,
#: ``timeout``; UNKNOWN, or a number the proto does not have, is ``unknown``)
_STATUSES = {number: name.lower() for name, number in pb.AwaitProofResponse.Status.items()}
_UNKNOWN = _STATUSES[pb.AwaitProofResponse.UNKNOWN]
_UNSPECIFIED = _PRIORITIES[Priority.PRIORITY_UNSPECIFIED]
#: what a request that cannot be read is counted as: kind ``other``, priority unspecified
_NO_CALL = ProveCall("", pb.PROOF_KIND_UNSPECIFIED, Priority.PRIORITY_UNSPECIFIED)
#: A call that ended in a gRPC error: ``error:`` and the code, lower case (``error:unavailable``)
_ERRORS = {code.name: f"error:{code.name.lower()}" for code in grpc.StatusCode
           if code is not grpc.StatusCode.OK}
_ERROR_UNKNOWN = _ERRORS[grpc.StatusCode.UNKNOWN.name]
#: The bounds a door's server holds against its callers (the ``bound`` label of
#: ``cuzkd_door_bounds_hit_total``): the server's
#: (:data:`cuzkd.supervisor.door.server.BOUNDS`), and the relay's ``request_id`` (an id too
#: long to be cuzk's)
SERVER_BOUNDS = ("connections", "streams", "header_list", "message_size", "request_bytes",
                 "request_stall", "reply_bytes", "preface_timeout", "idle", "rapid_reset",
                 "reply_stall", "frame_size", "request_id")
#: The ``proof_kind`` of a call that names none (a status read, an AwaitProof, an unknown kind)
NO_KIND = "none"

#: (family name, help) of each timing of a reply, in :func:`_timings` order: histograms by door
#: and kind
_TIMINGS: tuple[tuple[str, str], ...] = (
    ("cuzkd_door_proof_duration_seconds", "total_ms: the proof from submit to result"),
    ("cuzkd_door_proof_queue_wait_seconds", "queue_wait_ms: waiting in cuzk's scheduler"),
    ("cuzkd_door_proof_srs_load_seconds", "srs_load_ms: loading its SRS"),
    ("cuzkd_door_proof_synthesis_seconds", "synthesis_ms: circuit synthesis"),
    ("cuzkd_door_proof_gpu_compute_seconds", "gpu_compute_ms: proving on the GPU"),
)


def _timings(result: ProveResult) -> tuple[int, ...]:
    """The reply's timings in :data:`_TIMINGS`' order (milliseconds)."""
    return (result.total_ms, result.queue_wait_ms, result.srs_load_ms, result.synthesis_ms,
            result.gpu_compute_ms)


class Histogram(msgspec.Struct):
    """Bucket counts and the sum of the values observed (seconds); ``counts[-1]`` counts the
    values above every bound (+Inf only)."""

    counts: list[int]
    sum: float = 0.0

    @classmethod
    def of(cls, bounds: tuple[float, ...]) -> Histogram:
        return cls([0] * (len(bounds) + 1))

    def observe(self, bounds: tuple[float, ...], value: float) -> None:
        self.counts[bisect.bisect_left(bounds, value)] += 1
        self.sum += value

    def add(self, other: Histogram) -> None:
        if len(other.counts) == len(self.counts):  # figures of another bucket layout: skipped
            self.counts = [a + b for a, b in zip(self.counts, other.counts, strict=True)]
            self.sum += other.sum

    def add_to(self, family: HistogramMetricFamily, bounds: tuple[float, ...],
               labels: list[str]) -> None:
        cumulative, buckets = 0, []
        for le, count in zip((*le_labels(bounds), "+Inf"), self.counts, strict=True):
            cumulative += count
            buckets.append((le, float(cumulative)))
        family.add_metric(labels, buckets, self.sum)


#: Joins the label values of a counter's key (no label value of these families holds a tab).
_SEP = "\t"


class DoorFigures(msgspec.Struct):
    """What one door counted, in a form that crosses the door process's channel: counters are
    keyed by their label values joined with :data:`_SEP`."""

    engines: list[str] = msgspec.field(default_factory=list)
    held: int = 0
    quarantined: int = 0
    connections: int = 0
    #: kind, priority, result -> Prove calls
    proofs: dict[str, int] = msgspec.field(default_factory=dict)
    #: kind -> one histogram per timing of :data:`_TIMINGS`
    timings: dict[str, list[Histogram]] = msgspec.field(default_factory=dict)
    #: kind, how the hold ended -> seconds held
    holds: dict[str, Histogram] = msgspec.field(default_factory=dict)
    retries: dict[str, int] = msgspec.field(default_factory=dict)
    #: reason, kind -> calls refused
    refusals: dict[str, int] = msgspec.field(default_factory=dict)
    #: kind -> deadline calls answered past their deadline
    late: dict[str, int] = msgspec.field(default_factory=dict)
    #: kind -> seconds PoSt calls waited for their engine's PoSt slot
    post_waits: dict[str, Histogram] = msgspec.field(default_factory=dict)
    abandoned: dict[str, int] = msgspec.field(default_factory=dict)
    #: bound -> times the door's server held it against a caller
    bounds: dict[str, int] = msgspec.field(default_factory=dict)

    def add(self, other: DoorFigures) -> None:
        """Add ``other``'s counts (not its gauges: they are a moment's, of one process)."""
        self.engines = other.engines or self.engines
        for mine, theirs in ((self.proofs, other.proofs), (self.retries, other.retries),
                             (self.refusals, other.refusals), (self.late, other.late),
                             (self.abandoned, other.abandoned), (self.bounds, other.bounds)):
            for key, n in theirs.items():
                mine[key] = mine.get(key, 0) + n
        for kind, histograms in other.timings.items():
            if (have := self.timings.get(kind)) is None:
                self.timings[kind] = [Histogram(list(h.counts), h.sum) for h in histograms]
            else:
                for histogram, other_histogram in zip(have, histograms, strict=False):
                    histogram.add(other_histogram)
        for mine_h, theirs_h in ((self.holds, other.holds), (self.post_waits, other.post_waits)):
            for key, hist in theirs_h.items():
                mine_h.setdefault(key, Histogram([0] * len(hist.counts))).add(hist)


def _key(*labels: str) -> str:
    return _SEP.join(labels)


def _labels(key: str) -> list[str]:
    return key.split(_SEP)


class DoorMetrics:
    """The front doors' counts; a collector for the supervisor's scrapes.

    The door shell calls :meth:`opened` when a door starts serving and the rest as calls pass:
    :meth:`proved` after each relayed ``Prove``, :meth:`held` whenever its count of held calls
    changes, :meth:`hold_ended` as each held call leaves the hold, :meth:`retried`,
    :meth:`refused`, :meth:`answered_late`, :meth:`post_serialized`, :meth:`abandoned`,
    :meth:`quarantined`, :meth:`bound_hit` and :meth:`connections` as they happen. ``door``
    is the label value, the name of the door's first engine.

    The doors run in a process of their own: its counts cross to the supervisor as
    :meth:`snapshot`\\ s, and the supervisor's instance keeps the counts of every door process
    it ran (:meth:`absorb`), so no counter goes down when a door process is replaced.
    """

    def __init__(self) -> None:
        self._doors: dict[str, DoorFigures] = {}

    def _door(self, door: str) -> DoorFigures:
        if (state := self._doors.get(door)) is None:
            state = self._doors[door] = DoorFigures()
        return state

    def opened(self, door: str, engines: Sequence[str]) -> None:
        """``door`` serves, in front of ``engines`` (``cuzkd_door_engine_info``: which engines
        the door's histograms are of, so the proof-latency alert reads them for those)."""
        self._door(door).engines = list(engines)

    def proved(self, door: str, request: bytes, reply: bytes | None, code: str) -> None:
        """A ``Prove`` relayed: its request's bytes, its reply's (None when the call ended in
        an error) and the call's gRPC status code name (``OK``, ``UNAVAILABLE``)."""
        state = self._door(door)
        call = read_call(request) or _NO_CALL
        kind = enum_kind(call.proof_kind)
        priority = _PRIORITIES.get(call.priority, _UNSPECIFIED)
        outcome = read_result(reply) if reply is not None else None
        if reply is None:
            result = _ERRORS.get(code, _ERROR_UNKNOWN)
        else:  # a reply that cannot be read says nothing of the proof: unknown
            result = _UNKNOWN if outcome is None else _STATUSES.get(outcome.status, _UNKNOWN)
        _count(state.proofs, _key(kind, priority, result))
        if outcome is None or result == _UNKNOWN:
            return  # no proof was made or failed: no timings of one
        if (histograms := state.timings.get(kind)) is None:
            histograms = state.timings[kind] = [Histogram.of(PROOF_BUCKETS) for _ in _TIMINGS]
        for histogram, ms in zip(histograms, _timings(outcome), strict=True):
            histogram.observe(PROOF_BUCKETS, ms / 1000)

    def held(self, door: str, n: int) -> None:
        """The door holds ``n`` calls now."""
        self._door(door).held = n

    def hold_ended(self, door: str, seconds: float, outcome: HoldEnd, kind: str = "") -> None:
        """A call (of proof kind ``kind``, "" none) held ``seconds`` left the hold, as
        ``outcome`` says (a negative or NaN duration, a clock's mistake, is 0: it must not make
        the sum go down or NaN for good)."""
        _observe(self._door(door).holds, _key(kind or NO_KIND, outcome), seconds)

    def retried(self, door: str, reason: DoorRetry) -> None:
        _count(self._door(door).retries, reason)

    def refused(self, door: str, reason: DoorRefusal, kind: str = "") -> None:
        _count(self._door(door).refusals, _key(reason, kind or NO_KIND))

    def answered_late(self, door: str, kind: str) -> None:
        """A deadline call was answered (proved or failed) after its deadline."""
        _count(self._door(door).late, kind or NO_KIND)

    def post_serialized(self, door: str, kind: str, seconds: float) -> None:
        """A PoSt call waited ``seconds`` for its engine's one PoSt slot."""
        _observe(self._door(door).post_waits, kind or NO_KIND, seconds)

    def abandoned(self, door: str, reason: DoorAbandon) -> None:
        _count(self._door(door).abandoned, reason)

    def quarantined(self, door: str, n: int) -> None:
        """The door refuses ``n`` request ids now."""
        self._door(door).quarantined = n

    def bound_hit(self, door: str, bound: str, n: int = 1) -> None:
        """The door's server held ``bound`` against a caller ``n`` times more."""
        _count(self._door(door).bounds, bound, n)

    def connections(self, door: str, n: int) -> None:
        """The door has ``n`` client connections open now."""
        self._door(door).connections = n

    def snapshot(self) -> dict[str, DoorFigures]:
        """Every door's figures now (the door process sends them to the supervisor)."""
        return self._doors

    def absorb(self, figures: Mapping[str, DoorFigures], *, gauges: bool) -> None:
        """Add another's counts (a door process's); ``gauges``: take its gauges too (the
        door process serving now), else leave them (one that ended holds nothing)."""
        for door, theirs in figures.items():
            mine = self._door(door)
            mine.add(theirs)
            if gauges:
                mine.held, mine.quarantined = theirs.held, theirs.quarantined
                mine.connections = theirs.connections

    def collect(self) -> Iterator[Metric]:
        """Every door's families (none without a door)."""
        if not self._doors:
            return
        d, c, g = ["door"], CounterMetricFamily, GaugeMetricFamily
        info = InfoMetricFamily("cuzkd_door_engine",
                                "An engine behind the front door (door = its first engine).",
                                labels=["door", "engine"])
        proofs = c("cuzkd_door_proofs",
                   "Prove calls the door relayed, by proof kind, priority and result (cuzk's "
                   "reply status, or error:CODE when the call ended in a gRPC error).",
                   labels=["door", "proof_kind", "priority", "result"])
        timings = [HistogramMetricFamily(
            name, f"Prove replies relayed by the door, {text} (cuzk's own timing; every "
            "result, failures included), in seconds.", labels=["door", "proof_kind"])
            for name, text in _TIMINGS]
        held = g("cuzkd_door_held_calls",
                 "Calls the door holds now: no engine behind it can take them yet.", labels=d)
        holds = HistogramMetricFamily(
            "cuzkd_door_hold_duration_seconds",
            "Seconds calls were held in the door, by proof kind (none: not a proof call) and "
            "how the hold ended.", labels=["door", "proof_kind", "outcome"])
        retries = c("cuzkd_door_retries",
                    "Calls the door sent again (same request, same request_id) because the "
                    "engine they went to died or was taken out of rotation, by reason.",
                    labels=["door", "reason"])
        refusals = c("cuzkd_door_refusals",
                     "Calls the door answered with an error itself, by reason and proof kind "
                     "(none: not a proof call).", labels=["door", "reason", "proof_kind"])
        late = c("cuzkd_door_late_answers",
                 "Deadline calls ([metrics] proof_deadlines) the door relayed an answer to "
                 "after their deadline, by proof kind: a WinningPoSt proved late is a lost "
                 "block.", labels=["door", "proof_kind"])
        post_waits = HistogramMetricFamily(
            "cuzkd_door_post_wait_seconds",
            "Seconds PoSt calls waited for their engine's one PoSt slot (cuzk overwrites a "
            "PoSt queued beside another), by proof kind.", labels=["door", "proof_kind"])
        abandoned = c("cuzkd_door_drain_abandoned",
                      "Calls and jobs a drain stopped waiting for because the engine showed it "
                      "no longer had them (cuzk dropped them), by reason.",
                      labels=["door", "reason"])
        quarantined = g("cuzkd_door_quarantined_requests",
                        "Request ids the door refuses now: each crashed an engine twice, the "
                        "second time alone among suspects.", labels=d)
        bounds = c("cuzkd_door_bounds_hit",
                   "Times the door held a bound against a caller (its connection, streams, "
                   "metadata, memory, an idle or silent connection, a flood of resets), by "
                   "bound.", labels=["door", "bound"])
        connections = g("cuzkd_door_connections",
                        "Client connections the door has open now.", labels=d)
        for door, state in sorted(self._doors.items()):
            for engine in state.engines:
                info.add_metric([door, engine], {})
            for key, n in sorted(state.proofs.items()):
                proofs.add_metric([door, *_labels(key)], n)
            for kind, histograms in sorted(state.timings.items()):
                for timing, histogram in zip(timings, histograms, strict=True):
                    histogram.add_to(timing, PROOF_BUCKETS, [door, kind])
            held.add_metric([door], state.held)
            for key, hold in sorted(state.holds.items()):
                hold.add_to(holds, HOLD_BUCKETS, [door, *_labels(key)])
            for reason in DoorRetry:
                retries.add_metric([door, reason], state.retries.get(reason, 0))
            for refusal in DoorRefusal:  # every reason present, as "none"'s
                refusals.add_metric([door, refusal, NO_KIND],
                                    state.refusals.get(_key(refusal, NO_KIND), 0))
            for key, n in sorted(state.refusals.items()):
                if _labels(key)[1] != NO_KIND:
                    refusals.add_metric([door, *_labels(key)], n)
            for kind, n in sorted(state.late.items()):
                late.add_metric([door, kind], n)
            for kind, wait in sorted(state.post_waits.items()):
                wait.add_to(post_waits, HOLD_BUCKETS, [door, kind])
            for why in DoorAbandon:
                abandoned.add_metric([door, why], state.abandoned.get(why, 0))
            quarantined.add_metric([door], state.quarantined)
            for bound in SERVER_BOUNDS:
                bounds.add_metric([door, bound], state.bounds.get(bound, 0))
            connections.add_metric([door], state.connections)
        for family in (info, proofs, *timings, held, holds, retries, refusals, late,
                       post_waits, abandoned, quarantined, bounds, connections):
            if family.samples:
                yield family


def _count(counter: dict[str, int], key: str, n: int = 1) -> None:
    counter[key] = counter.get(key, 0) + n


def _observe(histograms: dict[str, Histogram], key: str, seconds: float) -> None:
    """Observe ``seconds`` in ``histograms[key]`` (made on first use); a negative or NaN
    duration, a clock's mistake, is 0."""
    if (histogram := histograms.get(key)) is None:
        histogram = histograms[key] = Histogram.of(HOLD_BUCKETS)
    histogram.observe(HOLD_BUCKETS, seconds if seconds > 0 else 0.0)
