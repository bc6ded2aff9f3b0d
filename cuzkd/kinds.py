"""cuzk's proof kinds: the four names, and every other spelling that means one of them.

A kind is at once a ``proof_kind`` label value, a key of the engine's ``[sizes]`` and of
``[metrics] proof_deadlines``, a word of ``POST /v1/jobs`` and of ``cuzkd bench --kind``. cuzk
names them ``porep-c2``, ``snap-update``, ``window-post`` and ``winning-post`` in ``/status``
(``proof_kind``, the keys of ``completed_by_kind``/``failed_by_kind``), and with underscores in
its gRPC metrics (``porep_c2``). cuzkd once had names of its own (``porep``, ``snap``, ``wpost``,
``winning``); files and scripts written then still work, with a warning to change them.

:func:`normalise_kind` maps every spelling to cuzk's, so a kind has one label value whatever
source it came from (an old release's ``/status``, gRPC, a config file): one series per kind,
where two spellings would split its counters and miss its deadline. A name it does not know is
kept as it is: another engine may prove kinds cuzk does not have. :func:`deprecation` is the
warning for an old name a person typed; the caller says where (file and key, the API's reply,
the CLI's stderr). :func:`typed_table` does both for a table a person wrote, keyed by kinds.
:func:`reported_kind` bounds what a cuzk engine reports to cuzk's four names and ``other``;
:func:`enum_kind` does the same for the ``ProofKind`` number of a gRPC request.

Dependency-free (the standard library only): every layer, and ``grafana/generate.py``, may
import it.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from typing import TypeVar

from cuzkd.errors import KindTwice

_V = TypeVar("_V")


class ProofKind(enum.StrEnum):
    """A kind of proof cuzk computes, named as cuzk's ``/status`` names it."""

    #: PoRep commit phase 2 (sealing a sector): 10 partitions for 32 and 64 GiB sectors
    POREP_C2 = "porep-c2"
    #: SnapDeals' UpdateProve (new data into a committed sector): 16 partitions for 32 GiB
    SNAP_UPDATE = "snap-update"
    #: WindowPoSt: proved whole, due within the partition's 30-minute deadline window
    WINDOW_POST = "window-post"
    #: WinningPoSt: proved whole, due within about 20 seconds or the block is lost
    WINNING_POST = "winning-post"


#: cuzkd's own names before it took cuzk's: still accepted where a person types a kind.
OLD_NAMES: Mapping[str, ProofKind] = {
    "porep": ProofKind.POREP_C2,
    "snap": ProofKind.SNAP_UPDATE,
    "wpost": ProofKind.WINDOW_POST,
    "winning": ProofKind.WINNING_POST,
}

#: cuzk's gRPC spellings (``GetMetrics``' ``proof_kind`` labels): the same kinds, no warning.
GRPC_NAMES: Mapping[str, ProofKind] = {kind.replace("-", "_"): kind for kind in ProofKind}

#: spelling -> cuzk's name, a plain ``str`` (msgspec takes no ``str`` subclass for a key)
_SPELLINGS: dict[str, str] = {text: str(kind) for text, kind in {**OLD_NAMES, **GRPC_NAMES}.items()}
_CUZK_NAMES = frozenset(str(kind) for kind in ProofKind)


def normalise_kind(text: str) -> str:
    """cuzk's name for the kind ``text`` spells; ``text`` itself when it is no known spelling
    (a cuzk name, or a kind of another engine's)."""
    return _SPELLINGS.get(text, text)


#: cuzk's gRPC ``ProofKind`` enum (``proving.proto``): its numbers and the kinds they name
#: (0, ``PROOF_KIND_UNSPECIFIED``, names none).
ENUM_KINDS: Mapping[int, ProofKind] = {
    1: ProofKind.POREP_C2,  # POREP_SEAL_COMMIT
    2: ProofKind.SNAP_UPDATE,  # SNAP_DEALS_UPDATE
    3: ProofKind.WINDOW_POST,  # WINDOW_POST_PARTITION
    4: ProofKind.WINNING_POST,  # WINNING_POST
}

#: The label value of a kind a cuzk engine named that is none of cuzk's (an engine newer than
#: this list): the kinds a cuzk engine reports stay four (and this) whatever it sends.
OTHER_KIND = "other"


def reported_kind(text: str) -> str:
    """A kind a cuzk engine reported (``/status``, gRPC's ``QueueStatus``, ``GetMetrics``), as
    a bounded label value: cuzk's name whatever the spelling or case, else :data:`OTHER_KIND`."""
    kind = normalise_kind(text.strip().lower().replace("_", "-"))
    return kind if kind in _CUZK_NAMES else OTHER_KIND


def enum_kind(number: int) -> str:
    """The kind a gRPC request's ``ProofKind`` number names, as a bounded label value: cuzk's
    name, else :data:`OTHER_KIND` (unspecified, or a number newer than this table)."""
    kind = ENUM_KINDS.get(number)
    return OTHER_KIND if kind is None else str(kind)


def deprecation(text: str) -> str | None:
    """The warning for a kind a person typed by its old name; None for any other text."""
    new = OLD_NAMES.get(text)
    if new is None:
        return None
    return (f"proof kind {text!r} is the old name of {str(new)!r} (cuzk's name); "
            f"write {str(new)!r}: the old name will stop being accepted")


def typed_table(table: Mapping[str, _V]) -> tuple[dict[str, _V], dict[str, str]]:
    """A kind -> value table a person wrote (``[sizes]``, ``proof_deadlines``) keyed by cuzk's
    names, and the :func:`deprecation` warning of each key written with an old name. Raises
    :class:`KindTwice` when two keys name one kind."""
    renamed: dict[str, _V] = {}
    spelled: dict[str, str] = {}
    warnings: dict[str, str] = {}
    for key, value in table.items():
        kind = normalise_kind(key)
        if kind in renamed:
            raise KindTwice(key, spelled[kind], kind)
        renamed[kind], spelled[kind] = value, key
        if (warning := deprecation(key)) is not None:
            warnings[key] = warning
    return renamed, warnings
