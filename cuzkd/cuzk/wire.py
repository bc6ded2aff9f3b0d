"""The few fields of a ``Prove`` call the door needs, read straight from its wire bytes.

The door relays ``Prove`` as raw bytes and wants only a handful of small fields: the
request's ``request_id``, ``proof_kind`` and ``priority``, the reply's ``status`` and its five
``*_ms`` timings. Parsing the whole message with ``proving_pb2`` costs a copy of the payload
(a PoRep C1 input is ~51 MB: tens of milliseconds and 51 MB more memory per call, measured in
docs/benchmarks.md) to read three numbers. This walks the protobuf wire format instead and
jumps over every length-delimited field it does not need, so its cost is the number of fields,
not the number of bytes, and it copies nothing but the request id.

It reads what ``proving_pb2`` would read (tests/cuzk/test_wire.py holds it to that, on
messages protobuf writes and on odd ones: fields repeated, out of order, unknown, a
``submit`` written twice): for a singular field the last value on the wire wins, an embedded
message written twice is merged, a field of an unexpected wire type is an unknown field,
an enum keeps a number it does not know. It is no validator: bytes it cannot walk (a
truncated varint or field, field number 0, wire types 6 and 7, or groups, which cuzk's
messages never hold) are ``None``, and so are a message of over :data:`MAX_FIELDS` fields
and a ``request_id`` that is not UTF-8 (protobuf refuses it too); what is inside the fields
it jumps over is not looked at.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

from cuzkd.errors import MalformedWire

_VARINT, _FIXED64, _LEN, _FIXED32 = 0, 1, 2, 5
_U64 = (1 << 64) - 1
#: Fields one read walks at most, nested ones included: a WindowPoSt's ``vanilla_proofs`` has
#: one entry per sector of its partition (2349 at most), the rest are a dozen. A message of
#: more is none of cuzk's, and its walk is bounded (~3 µs a field, on the event loop): a
#: 128 MiB message of two-byte fields would otherwise take minutes.
MAX_FIELDS = 4096


@dataclass(frozen=True, slots=True)
class ProveCall:
    """A ``ProveRequest``'s ``submit``: the fields the door acts on and measures by."""

    #: the idempotency key (cuzk's job id); "" when absent
    request_id: str
    #: the ``ProofKind`` enum number (0: unspecified; a number cuzk lacks is kept)
    proof_kind: int
    #: the ``Priority`` enum number (0: unspecified)
    priority: int


@dataclass(frozen=True, slots=True)
class ProveResult:
    """A ``ProveResponse``'s ``result``: its status and timings (0 when absent)."""

    #: the ``AwaitProofResponse.Status`` number (0: UNKNOWN, also when there is no result)
    status: int
    queue_wait_ms: int
    srs_load_ms: int
    synthesis_ms: int
    gpu_compute_ms: int
    total_ms: int


def _varint(data: bytes, at: int, end: int) -> tuple[int, int]:
    """The varint at ``at`` and the offset after it (at most 10 bytes, as protobuf's)."""
    value = shift = 0
    while at < end and shift < 70:
        byte = data[at]
        at += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value & _U64, at
        shift += 7
    raise MalformedWire("truncated or over-long varint")


class _Walk:
    """One read of one message's bytes, and the fields it may still walk (nested ones
    count against the same :data:`MAX_FIELDS`)."""

    def __init__(self, data: bytes) -> None:
        self.data = data
        self._left = MAX_FIELDS

    def fields(self, at: int, end: int) -> Iterator[tuple[int, int, int, int]]:
        """Each field of the message in ``data[at:end]`` as (number, wire type, a, b): a
        varint's value in ``a``; a length-delimited field's content as the offsets ``a`` to
        ``b``; fixed fields are jumped over (``a`` = ``b`` = 0)."""
        data = self.data
        while at < end:
            self._left -= 1
            if self._left < 0:
                raise MalformedWire(f"over {MAX_FIELDS} fields")
            tag, at = _varint(data, at, end)
            number, wire_type = tag >> 3, tag & 7
            if number == 0 or number > 0x1FFFFFFF:
                raise MalformedWire(f"field number {number}")
            if wire_type == _VARINT:
                value, at = _varint(data, at, end)
                yield number, wire_type, value, 0
            elif wire_type == _LEN:
                length, at = _varint(data, at, end)
                if length > end - at:
                    raise MalformedWire("length-delimited field runs past the end")
                yield number, wire_type, at, at + length
                at += length
            elif wire_type in (_FIXED64, _FIXED32):
                at += 8 if wire_type == _FIXED64 else 4
                if at > end:
                    raise MalformedWire("fixed field runs past the end")
                yield number, wire_type, 0, 0
            else:
                raise MalformedWire(f"wire type {wire_type}")


def _enum(value: int) -> int:
    """An enum's varint as protobuf reads it: the low 32 bits, signed."""
    value &= 0xFFFFFFFF
    return value - (1 << 32) if value >= 1 << 31 else value


def _only_field(walk: _Walk) -> Iterator[tuple[int, int, int, int]]:
    """The fields inside field 1 of the message (a ``ProveRequest``'s ``submit``, a
    ``ProveResponse``'s ``result``: each the message's one field), of every occurrence in wire
    order: protobuf merges them."""
    for number, wire_type, a, b in walk.fields(0, len(walk.data)):
        if number == 1 and wire_type == _LEN:
            yield from walk.fields(a, b)


def read_call(data: bytes) -> ProveCall | None:
    """The ``submit`` fields of a ``ProveRequest``; None when the bytes cannot be walked."""
    return _read_submit(data, _only_field)


def read_submit(data: bytes) -> ProveCall | None:
    """The same fields of a ``SubmitProofRequest`` (``Prove``'s ``submit`` on its own);
    None when the bytes cannot be walked. Its ``vanilla_proof`` is as large as a Prove's."""
    return _read_submit(data, lambda walk: walk.fields(0, len(walk.data)))


def _read_submit(data: bytes, fields: Callable[[_Walk], Iterator[tuple[int, int, int, int]]]
                 ) -> ProveCall | None:
    request_id, kind, priority = "", 0, 0
    try:
        for number, wire_type, value, stop in fields(_Walk(data)):
            if number == 1 and wire_type == _LEN:
                request_id = data[value:stop].decode()
            elif number == 2 and wire_type == _VARINT:
                kind = _enum(value)
            elif number == 5 and wire_type == _VARINT:
                priority = _enum(value)
    except (MalformedWire, UnicodeDecodeError):
        return None
    return ProveCall(request_id, kind, priority)


#: AwaitProofResponse's field numbers of the timings, in ProveResult's order
_TIMINGS = {10: 0, 11: 1, 12: 2, 13: 3, 14: 4}


def read_result(data: bytes) -> ProveResult | None:
    """The ``result`` status and timings of a ``ProveResponse``; None when the bytes cannot
    be walked."""
    status, timings = 0, [0, 0, 0, 0, 0]
    try:
        for number, wire_type, value, _ in _only_field(_Walk(data)):
            if wire_type != _VARINT:
                continue
            if number == 2:
                status = _enum(value)
            elif (slot := _TIMINGS.get(number)) is not None:
                timings[slot] = value
    except MalformedWire:
        return None
    return ProveResult(status, *timings)
