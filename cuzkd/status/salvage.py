"""What of a JSON document still fits its msgspec types when the strict decode refuses it.

A document is not all or nothing. A real cuzk proving a WindowPoSt decrements
``buffers.synth_in_flight`` without incrementing it, and the counter wraps to 2**64 - 1; refusing
the whole document for it made the engine look dead and got it restarted every 15 s. The strict
typed decode stays the fast path; only when it raises does :class:`Salvage` walk the document
against the very same struct definitions and keep what decodes:

* a bad value of a field that may be ``None`` becomes ``None``, of a field with a default its
  default -- the field is unknown, the rest of its object is kept;
* a bad entry of a dict, or a bad record (a struct) of a list, is left out, unless the dict's
  values may be ``None`` (a count per proof kind: ``None``, so that the exporter leaves the
  series out instead of publishing 0 for it);
* any other bad value makes its enclosing value bad in turn: a record missing its identity,
  a histogram whose bucket list holds a bad count (its entries are positional), and at the top a
  document whose section is missing or not an object -- which is then no status document.

Each bad value is counted by a bounded :class:`FieldErrorReason` (a metric label), and the first
:data:`MAX_DETAILED` are each one :class:`FieldError`: where (the JSON path, as msgspec writes
it), why, and msgspec's own message. The walk takes a value apart (its members kept as raw
JSON, unknown keys skipped) only where the strict decode of it fails, so a document with one
odd field costs about one more scan of it, not a Python-speed walk of every field.
"""

from __future__ import annotations

import enum
import functools
import json
import re
import types
import typing
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import msgspec

from cuzkd.errors import Unsalvageable


class FieldErrorReason(enum.StrEnum):
    """Why a value was refused: the ``reason`` label of ``cuzkd_status_field_errors_total``."""

    OUT_OF_RANGE = "out_of_range"
    WRONG_TYPE = "wrong_type"
    UNKNOWN_VALUE = "unknown_value"
    #: a string with bytes that are no UTF-8 (one odd byte costs its value)
    INVALID_UTF8 = "invalid_utf8"
    MISSING = "missing"


#: Characters of a dict key quoted in a path (keys are the engine's strings, of any length).
KEY_CHARS = 40
#: Characters of msgspec's message kept: it quotes the odd value, which may be a 1 MB string.
MESSAGE_CHARS = 160
#: Field errors of one document kept one by one. Past them an odd flat record (a partition, a
#: worker: no list or dict inside) is left out whole, without being taken apart, and only
#: counted: taking one apart costs ~17 us, and a hostile 16 MB document of odd partitions
#: would block the loop for seconds.
MAX_DETAILED = 1000

_RANGE = re.compile(r"out of range|[<>]=")


@dataclass(frozen=True)
class FieldError:
    """One value of a document that did not decode."""

    #: where, as in msgspec's messages: ``$.buffers.synth_in_flight``, ``$.pipelines[3].state``
    path: str
    reason: FieldErrorReason
    #: msgspec's message, e.g. "Expected `int` <= 9223372036854775807"
    message: str

    def __str__(self) -> str:
        return self.message if self.path == "$" else f"{self.message} - at `{self.path}`"


class _Bad:
    """A value that did not decode; its error is already recorded."""

    __slots__ = ("error",)

    def __init__(self, error: FieldError) -> None:
        self.error = error


#: A decode of raw JSON into one value that raises msgspec.DecodeError when it does not fit.
Decode = Callable[[msgspec.Raw], Any]

_OBJECT = msgspec.json.Decoder(dict[str, msgspec.Raw]).decode
_ARRAY = msgspec.json.Decoder(list[msgspec.Raw]).decode


class _Plan:
    """How to decode and, failing that, take apart one type: built once per type, so that the
    walk of a document with thousands of odd records does no type introspection."""

    __slots__ = ("cls", "decode", "fields", "flat", "item", "members", "nullable", "records",
                 "shape")

    def __init__(self, kind: Any) -> None:
        self.decode: Decode = msgspec.json.Decoder(kind).decode
        self.nullable = _is_union(kind) and type(None) in typing.get_args(kind)
        inner = _without_none(kind)
        origin = typing.get_origin(inner)
        self.cls: type[msgspec.Struct] | None = None
        #: a struct's (field, its plan); a list's or dict's item plan
        self.fields: tuple[tuple[msgspec.structs.FieldInfo, _Plan], ...] = ()
        self.item: _Plan | None = None
        #: a struct's fields as raw JSON (UNSET when absent), unknown keys skipped in C: a
        #: dict of every key would let a document of a million unknown keys cost seconds
        self.members: Decode = _OBJECT
        self.shape = "leaf"
        if isinstance(inner, type) and issubclass(inner, msgspec.Struct):
            self.shape, self.cls = "struct", inner
            self.fields = tuple((f, _plan(f.type)) for f in msgspec.structs.fields(inner))
            self.members = msgspec.json.Decoder(msgspec.defstruct(
                f"_Members{inner.__name__}",
                [(f.name, msgspec.Raw | msgspec.UnsetType, msgspec.UNSET) for f, _ in self.fields],
                rename={f.name: f.encode_name for f, _ in self.fields}, gc=False)).decode
        elif origin in (list, dict):
            self.shape = origin.__name__
            self.item = _plan(typing.get_args(inner)[-1])
        #: entries of a list of records can be left out one by one (scalars are positional)
        self.records = self.item is not None and self.item.shape == "struct"
        #: a struct of scalars only
        self.flat = self.shape == "struct" and all(p.shape == "leaf" for _, p in self.fields)


@functools.cache
def _plan(kind: Any) -> _Plan:
    return _Plan(kind)


class Salvage:
    """One walk over one document; :attr:`errors` lists what it left out, in document order
    (the first :data:`MAX_DETAILED`), :attr:`counts` all of it by reason.

    ``first`` overrides the strict decode of some top-level fields (the status decoder's
    partition reuse); when one raises, that field is walked like any other.
    """

    def __init__(self, first: Mapping[str, Decode] | None = None) -> None:
        self.errors: list[FieldError] = []
        self.counts: Counter[FieldErrorReason] = Counter()
        self._first = first or {}

    def document(self, cls: type[msgspec.Struct], data: bytes) -> Any:
        """``data`` decoded as ``cls`` as far as it can be; raises Unsalvageable naming the
        error that leaves no ``cls`` (the top level is not an object, a required section is
        bad)."""
        value = self._struct(_plan(cls), msgspec.Raw(data), "$", self._first)
        if isinstance(value, _Bad):
            raise Unsalvageable(str(value.error))
        return value

    def _value(self, plan: _Plan, raw: msgspec.Raw, path: str, strict: Decode | None = None,
               *, whole: bool = False) -> Any:
        """The value, or it salvaged, or _Bad; ``whole``: an odd value is not taken apart."""
        try:
            return (strict or plan.decode)(raw)
        except msgspec.DecodeError as exc:  # ValidationError is a subclass
            if plan.shape == "leaf" or whole:
                message, _, inside = str(exc).partition(" - at `$")
                return self._bad(path + inside.removesuffix("`"), message)
        if plan.shape == "struct":
            return self._struct(plan, raw, path)
        if plan.shape == "list":
            return self._list(plan, raw, path)
        return self._dict(plan, raw, path)

    def _struct(self, plan: _Plan, raw: msgspec.Raw, path: str,
                first: Mapping[str, Decode] | None = None) -> Any:
        members = self._members(plan.members, raw, path)
        if isinstance(members, _Bad):
            return members
        values: dict[str, Any] = {}
        for field, field_plan in plan.fields:
            member = getattr(members, field.name)
            if member is msgspec.UNSET:
                if field.required:
                    bad = self._bad(path, f"Object missing required field `{field.encode_name}`",
                                    FieldErrorReason.MISSING)
                    if not field_plan.nullable:
                        return bad
                    values[field.name] = None
                continue  # else its default, as the strict decode gives it
            value = self._value(field_plan, member, f"{path}.{field.encode_name}",
                                (first or {}).get(field.name))
            if isinstance(value, _Bad):
                if not field.required:
                    continue
                if not field_plan.nullable:
                    return value
                value = None
            values[field.name] = value
        assert plan.cls is not None
        return plan.cls(**values)

    def _list(self, plan: _Plan, raw: msgspec.Raw, path: str) -> Any:
        items = self._members(_ARRAY, raw, path)
        if isinstance(items, _Bad):
            return items
        assert plan.item is not None
        kept = []
        for i, item in enumerate(items):
            value = self._value(plan.item, item, f"{path}[{i}]", whole=self._saturated(plan))
            if isinstance(value, _Bad):
                if not plan.records:
                    return value  # entries are positional: the list is bad as a whole
                continue
            kept.append(value)
        return kept

    def _dict(self, plan: _Plan, raw: msgspec.Raw, path: str) -> Any:
        entries = self._members(_OBJECT, raw, path)
        if isinstance(entries, _Bad):
            return entries
        assert plan.item is not None
        kept = {}
        for key, entry in entries.items():
            value = self._value(plan.item, entry, f"{path}[{_quoted(key)}]",
                                whole=self._saturated(plan))
            if isinstance(value, _Bad):
                if not plan.item.nullable:
                    continue
                value = None
            kept[key] = value
        return kept

    def _members(self, decode: Decode, raw: msgspec.Raw, path: str) -> Any:
        try:
            return decode(raw)
        except msgspec.DecodeError as exc:
            return self._bad(path, str(exc))

    def _saturated(self, container: _Plan) -> bool:
        """Past MAX_DETAILED errors: the entries of ``container`` are left out whole if odd."""
        assert container.item is not None
        return container.item.flat and len(self.errors) >= MAX_DETAILED

    def _bad(self, path: str, message: str, reason: FieldErrorReason | None = None) -> _Bad:
        if len(message) > MESSAGE_CHARS:
            message = message[:MESSAGE_CHARS] + "..."
        error = FieldError(path, reason or _reason(message), message)
        self.counts[error.reason] += 1
        if len(self.errors) < MAX_DETAILED:
            self.errors.append(error)
        return _Bad(error)


def _reason(message: str) -> FieldErrorReason:
    """The bounded reason of one of msgspec's messages about a single value."""
    if message.startswith("Invalid enum value"):
        return FieldErrorReason.UNKNOWN_VALUE
    if message.startswith("Invalid UTF-8"):
        return FieldErrorReason.INVALID_UTF8
    if ", got `" not in message and _RANGE.search(message):
        # "Expected `int` <= 9223372036854775807", "Number out of range"
        return FieldErrorReason.OUT_OF_RANGE
    return FieldErrorReason.WRONG_TYPE


def _quoted(key: str) -> str:
    """A dict key in a path: JSON-quoted (no newline or odd byte reaches a log line), cut."""
    return json.dumps(key if len(key) <= KEY_CHARS else key[:KEY_CHARS] + "...")


def _without_none(kind: Any) -> Any:
    """``X`` of ``X | None``; any other type as it is."""
    if not _is_union(kind):
        return kind
    others = [k for k in typing.get_args(kind) if k is not type(None)]
    return others[0] if len(others) == 1 else kind


def _is_union(kind: Any) -> bool:
    return typing.get_origin(kind) in (typing.Union, types.UnionType)
