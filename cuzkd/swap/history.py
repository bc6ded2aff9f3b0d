"""The release history: which releases were put into service, and whether they proved good.

``current``/``previous`` only say where the store is and where it just was. After a swap to a
crashing build is rolled back, ``previous`` names the crashing build, so a rollback that
followed it would bring the crash back. The history remembers a verdict per release instead:

- ``pending``: put into service, its engines not yet healthy through the settle period;
- ``accepted``: every ``{binary}`` engine was healthy through settle on it;
- ``rejected``: a smoke test or an engine failed on it, an operator rolled back from it, or a
  swap to it was interrupted. Never a rollback target.

Records are ordered by when their release was last put into service by a swap (or seeded by
``initial_binary``); a rollback moves along that order without reordering it. So
``cuzkd swap --rollback`` goes to the last accepted release *before* the active one, and a
second rollback goes further back instead of toggling.

This module is pure (records in, records out, bytes in, bytes out) so every rule is tested
without a filesystem; :mod:`cuzkd.swap.historyfile` stores it durably. Each record has room for
an ``analysis`` object: the canary analysis verdict of ``cuzkd swap --analysis``
(:mod:`cuzkd.swap.analysis`), written with the verdict and carried through unchanged.
"""

from __future__ import annotations

import enum
import json
from collections.abc import Collection, Sequence
from typing import Any

import msgspec

from cuzkd import validation
from cuzkd.errors import HistoryError


class ReleaseVerdict(enum.StrEnum):
    """Whether a release proved good (the module docstring says when each is given)."""

    PENDING = "pending"
    ACCEPTED = "accepted"
    REJECTED = "rejected"


class ReleaseOrigin(enum.StrEnum):
    """How a release came to be put into service."""

    SWAP = "swap"
    INITIAL_BINARY = "initial_binary"
    #: found active at start without a record (see :func:`reconcile`)
    RECOVERED = "recovered"


FORMAT = 1
#: Records kept at most; the oldest records of releases no longer on disk go first.
MAX_RECORDS = 100


class Record(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=False):
    #: release id (``releases/<id>``)
    release: str
    #: the binary's file name in the release
    binary: str
    origin: ReleaseOrigin
    #: Unix time the release was put into service (or smoke-tested, when refused before)
    activated_at: float
    verdict: ReleaseVerdict = ReleaseVerdict.PENDING
    #: Unix time of the verdict; None while pending
    decided_at: float | None = None
    #: why it was rejected, or what accepted it
    reason: str | None = None
    #: the canary analysis's report (``CanaryReport.as_json``) when the swap ran one
    analysis: dict[str, Any] | None = None


class _Document(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    format: int
    records: list[Record]


def put_in_service(records: Sequence[Record], release: str, binary: str, origin: ReleaseOrigin,
                   now: float) -> list[Record]:
    """``release`` starts a trial: a fresh pending record at the end (an older one is dropped)."""
    fresh = Record(release=release, binary=binary, origin=origin, activated_at=now)
    return [*(r for r in records if r.release != release), fresh]


def decide(records: Sequence[Record], release: str, verdict: ReleaseVerdict,
           reason: str | None, now: float, analysis: dict[str, Any] | None = None) -> list[Record]:
    """Record ``verdict`` (and a canary ``analysis``, when given) for ``release``; a release
    without a record is left alone."""
    return [_judged(r, verdict, reason, now, analysis) if r.release == release else r
            for r in records]


def _judged(record: Record, verdict: ReleaseVerdict, reason: str | None, now: float,
            analysis: dict[str, Any] | None = None) -> Record:
    if analysis is None:
        analysis = record.analysis
    return msgspec.structs.replace(record, verdict=verdict, reason=reason, decided_at=now,
                                   analysis=analysis)


def find(records: Sequence[Record], release: str | None) -> Record | None:
    return next((r for r in records if r.release == release), None)


def rollback_target(records: Sequence[Record], active: str | None,
                    installed: Collection[str]) -> str | None:
    """The last accepted release before the active one that is still installed, or None.

    When the active release has no record (a history started after it), every record counts as
    before it.
    """
    index = next((i for i, r in enumerate(records) if r.release == active), len(records))
    return next((r.release for r in reversed(records[:index])
                 if r.verdict == ReleaseVerdict.ACCEPTED and r.release in installed), None)


def protected(records: Sequence[Record], active: str | None,
              installed: Collection[str]) -> set[str]:
    """Releases pruning must keep: the newest accepted one, the accepted one before it, and
    where a rollback from the active release would go."""
    accepted = [r.release for r in records if r.verdict == ReleaseVerdict.ACCEPTED]
    keep = set(accepted[-2:])
    target = rollback_target(records, active, installed)
    return keep if target is None else keep | {target}


def reconcile(records: Sequence[Record], active: str | None, binary: str | None,
              now: float) -> list[Record]:
    """Make the history agree with the links after a restart (see docs/swap.md, recovery).

    A pending release that is not active was being swapped in when the supervisor stopped:
    rejected. An active release without a record (a store from before the history, or a
    history set aside as unreadable) gets a pending one, to be judged like a seed.
    """
    interrupted = "interrupted: the supervisor stopped before its engines were healthy"
    result = [_judged(r, ReleaseVerdict.REJECTED, interrupted, now)
              if r.verdict == ReleaseVerdict.PENDING and r.release != active else r
              for r in records]
    if active is not None and binary is not None and find(result, active) is None:
        result = put_in_service(result, active, binary, ReleaseOrigin.RECOVERED, now)
    return result


def trim(records: Sequence[Record], installed: Collection[str],
         limit: int = MAX_RECORDS) -> list[Record]:
    """At most ``limit`` records, dropping the oldest of releases no longer installed first."""
    excess = len(records) - limit
    kept: list[Record] = []
    for record in records:
        if excess > 0 and record.release not in installed:
            excess -= 1
            continue
        kept.append(record)
    return kept[max(0, len(kept) - limit):]


def encode(records: Sequence[Record]) -> bytes:
    """The file's bytes: ASCII JSON, so names that are not UTF-8 (surrogate escapes) survive."""
    doc = {"format": FORMAT, "records": msgspec.to_builtins(list(records))}
    return (json.dumps(doc, ensure_ascii=True, indent=1) + "\n").encode("ascii")


def decode(data: bytes) -> list[Record]:
    """Records from the file's bytes; :class:`HistoryError` saying what is wrong otherwise."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise HistoryError(f"not UTF-8 (byte 0x{data[exc.start]:02x} at offset {exc.start})"
                           ) from None
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as exc:
        raise HistoryError(f"not valid JSON ({exc.msg} at line {exc.lineno} column "
                           f"{exc.colno}): truncated or damaged") from None
    if isinstance(raw, dict) and raw.get("format") != FORMAT:
        raise HistoryError(f"unknown format {raw.get('format')!r} (this cuzkd reads {FORMAT})")
    try:
        return msgspec.convert(raw, _Document).records
    except msgspec.ValidationError as exc:
        key, message = validation.key_and_message(exc)
        raise HistoryError(f"not a release history (key `{key}`: {message})" if key
                           else f"not a release history ({message})") from None
