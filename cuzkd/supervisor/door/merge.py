"""What a door shared by several engines answers to ``GetStatus``, ``GetMetrics`` and
``PreloadSRS``: the engines' replies merged into one, as if one cuzk served every GPU.

Pure functions of the engines' reply bytes, in the door's engine order (config order). One
reply is passed on as it came, byte for byte: a door with one engine behind it, or one
answering, changes nothing. A reply that does not decode is left out (the shell has checked
every reply already: an engine answering garbage is restarted).

- ``GetStatus``: each GPU once. A GPU is its ``ordinal``: cuzk's ``[gpus] devices`` are the
  host's nvidia-smi indices, so engines pinned to their own GPUs report disjoint ordinals, and
  each engine's entries (one per GPU worker, as cuzk lists them) are kept whole. An ordinal an
  earlier engine listed already is left out of a later engine's entries: two engines on one
  GPU (or unpinned, each listing the host's GPUs) must not show it twice nor double its VRAM.
  Queues are summed by proof kind, loaded SRS listed once per circuit (its hottest tier, the
  engines' references summed), the totals and pinned memory summed, the uptime the shortest
  (the door has served as one engine for as long as its youngest has run).
- ``GetMetrics``: the engines' Prometheus texts in one valid exposition, every sample labelled
  ``engine="<name>"``, each family's ``# HELP``/``# TYPE`` once (the first engine's), its
  samples grouped under it. Not summed: cuzk's ``cuzk_proof_duration_seconds`` is a summary
  over its last 1000 proofs, whose quantiles cannot be added, and an engine label keeps every
  figure true. Samples that are not exposition lines are left out.
- ``PreloadSRS``: ``already_loaded`` when it was on every engine, ``load_time_ms`` the longest.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

from google.protobuf.message import DecodeError

from cuzkd.cuzk import proving_pb2 as pb

_M = TypeVar("_M", pb.GetStatusResponse, pb.PreloadSrsResponse)
_R = TypeVar("_R", pb.GetStatusResponse, pb.PreloadSrsResponse, pb.GetMetricsResponse)

#: The label every merged GetMetrics sample gets: which engine behind the door it is from.
ENGINE_LABEL = "engine"

_NAME = r"[a-zA-Z_:][a-zA-Z0-9_:]*"
_SAMPLE = re.compile(rf"^({_NAME})(?:\{{(.*)\}})?[ \t]+(\S.*)$")
_LABEL = re.compile(r'[ \t]*([a-zA-Z_][a-zA-Z0-9_]*)[ \t]*=[ \t]*"((?:[^"\\\n]|\\.)*)"[ \t]*(,|$)')
_COMMENT = re.compile(rf"^#[ \t]+(HELP|TYPE)[ \t]+({_NAME})(?:[ \t]+(.*))?$")
#: The suffixes of a family's samples (a histogram's buckets, a summary's sum and count, ...).
_SUFFIXES = ("_total", "_created", "_sum", "_count", "_bucket", "_gcount", "_gsum", "_info")


def merge_status(replies: Sequence[bytes]) -> bytes:
    """One ``GetStatusResponse`` of the engines' (see the module's docstring)."""
    return _merged(replies, pb.GetStatusResponse, _merge_status)


def merge_preload(replies: Sequence[bytes]) -> bytes:
    """One ``PreloadSrsResponse``: already loaded only if on every engine; the longest load."""
    return _merged(replies, pb.PreloadSrsResponse, lambda answers: pb.PreloadSrsResponse(
        already_loaded=all(a.already_loaded for a in answers),
        load_time_ms=max(a.load_time_ms for a in answers)))


def merge_metrics(replies: Sequence[tuple[str, bytes]]) -> bytes:
    """One ``GetMetricsResponse`` of ``(engine, reply)`` pairs: the texts in one exposition,
    each sample labelled with its engine."""
    if len(replies) == 1:
        return replies[0][1]
    families: dict[str, _Family] = {}
    for engine, reply in replies:
        answer = _decoded(reply, pb.GetMetricsResponse)
        if answer is not None:
            _read_exposition(engine, answer.prometheus_text, families)
    text = "".join(family.text() for family in families.values())
    return pb.GetMetricsResponse(prometheus_text=text).SerializeToString()


def _merged(replies: Sequence[bytes], message: type[_M],
            merge: Callable[[list[_M]], _M]) -> bytes:
    if len(replies) == 1:
        return replies[0]
    answers = [a for a in (_decoded(r, message) for r in replies) if a is not None]
    return merge(answers).SerializeToString() if answers else message().SerializeToString()


def _decoded(reply: bytes, message: type[_R]) -> _R | None:
    try:
        return message.FromString(reply)
    except DecodeError:
        return None


def _merge_status(answers: list[pb.GetStatusResponse]) -> pb.GetStatusResponse:
    merged = pb.GetStatusResponse(
        total_proofs_completed=sum(a.total_proofs_completed for a in answers),
        total_proofs_failed=sum(a.total_proofs_failed for a in answers),
        uptime_seconds=min(a.uptime_seconds for a in answers),
        pinned_memory_bytes=sum(a.pinned_memory_bytes for a in answers),
        pinned_memory_limit_bytes=sum(a.pinned_memory_limit_bytes for a in answers))
    listed: set[int] = set()
    queues: dict[str, pb.QueueStatus] = {}
    srs: dict[str, pb.SRSStatus] = {}
    for answer in answers:
        merged.gpus.extend(g for g in answer.gpus if g.ordinal not in listed)
        listed.update(g.ordinal for g in answer.gpus)
        for queue in answer.queues:
            total = queues.setdefault(queue.proof_kind, pb.QueueStatus(proof_kind=queue.proof_kind))
            total.pending += queue.pending
            total.in_progress += queue.in_progress
        for loaded in answer.loaded_srs:
            if (first := srs.get(loaded.circuit_id)) is None:
                srs[loaded.circuit_id] = pb.SRSStatus(
                    circuit_id=loaded.circuit_id, tier=loaded.tier,
                    size_bytes=loaded.size_bytes, ref_count=loaded.ref_count)
            else:  # HOT = 0 is the hottest
                first.tier = min(first.tier, loaded.tier)
                first.ref_count += loaded.ref_count
    merged.queues.extend(queues.values())
    merged.loaded_srs.extend(srs.values())
    return merged


@dataclass
class _Family:
    """One metric family of the merged exposition: its comments once, every engine's samples."""

    name: str
    help: str | None = None
    type: str | None = None
    samples: list[str] = field(default_factory=list)

    def text(self) -> str:
        head = "" if self.help is None else f"# HELP {self.name} {self.help}\n"
        head += "" if self.type is None else f"# TYPE {self.name} {self.type}\n"
        return head + "".join(f"{sample}\n" for sample in self.samples)


def _read_exposition(engine: str, text: str, families: dict[str, _Family]) -> None:
    """Add one engine's exposition ``text`` to ``families``, its samples labelled."""
    current: _Family | None = None
    for line in text.splitlines():
        if comment := _COMMENT.match(line):
            kind, name, rest = comment.groups()
            current = families.setdefault(name, _Family(name))
            if kind == "HELP" and current.help is None:
                current.help = rest or ""
            elif kind == "TYPE" and current.type is None and rest:
                current.type = rest.strip()
            continue
        sample = _SAMPLE.match(line)
        if sample is None:  # blank, another comment, or no exposition line: left out
            continue
        name, labels, value = sample.groups()
        pairs = _labels(labels or "")
        if pairs is None:
            continue
        if name in families:  # a family of its very name first (cuzk has ``x_total`` and ``x``)
            current = families[name]
        elif current is None or not _of_family(name, current.name):
            current = families.setdefault(name, _Family(name))
        own = ",".join(f'{k}="{v}"' for k, v in pairs if k != ENGINE_LABEL)
        current.samples.append(f'{name}{{{ENGINE_LABEL}="{_escaped(engine)}"'
                               f'{"," if own else ""}{own}}} {value}')


def _of_family(sample: str, family: str) -> bool:
    return sample == family or any(sample == family + s for s in _SUFFIXES)


def _labels(text: str) -> list[tuple[str, str]] | None:
    """The ``name="value"`` pairs of a sample's label set (values kept escaped), or None if
    it is not one."""
    pairs: list[tuple[str, str]] = []
    position = 0
    text = text.rstrip()
    while position < len(text):
        label = _LABEL.match(text, position)
        if label is None or label.end() == position:
            return None
        pairs.append((label.group(1), label.group(2)))
        position = label.end()
    return pairs


def _escaped(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')
