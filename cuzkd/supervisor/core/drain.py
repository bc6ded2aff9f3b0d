"""The stop sequence's drain, read from a status document: is this a quiet moment, what would a
stop now throw away.

Every supervisor-initiated stop (operator, reload, swap, shutdown) first lets in-flight work end
(docs/supervisor.md, the stop sequence): ``quiet`` waits for a moment with no partition
synthesizing or on a GPU. Pure: a document in, a count or a verdict out; the drain request
(``http``) is :mod:`cuzkd.supervisor.engines.drainrequest`.
"""

from __future__ import annotations

from cuzkd.status.document import BUSY_STATES, PartitionState, StatusDocument


def count_partitions(doc: StatusDocument | None, states: frozenset[PartitionState]) -> int:
    """Partitions of the listed jobs in one of ``states`` (0 without a document)."""
    if doc is None:
        return 0
    return sum(part.state in states for pipe in doc.pipelines for part in pipe.partitions)


def is_quiet(doc: StatusDocument) -> bool:
    """No partition synthesizing or on a GPU: stopping now loses no compute in progress."""
    return count_partitions(doc, BUSY_STATES) == 0
