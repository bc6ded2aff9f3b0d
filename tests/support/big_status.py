"""Status documents of production size: a busy cuzk's 1 MB ``/status``.

cuzk pretty-prints its document; with hundreds of jobs x 16 partitions listed it reaches
0.25-1 MB. :func:`big_document` builds one through the reference engine's own tracker (so it is
a valid document by construction), with or without ``cuzkd_extensions``.
"""

from __future__ import annotations

import json

import msgspec

from cuzkd.status.document import encode_status
from cuzkd.status.tracker import StatusTracker

PARTITIONS = 16
KINDS = ("porep-c2", "snap-update", "window-post", "winning-post")


def big_document(min_bytes: int = 2**20, *, extensions: bool = True) -> bytes:
    """A pretty-printed document of at least ``min_bytes`` with partitions in every phase."""
    tracker = StatusTracker()
    tracker.register_workers((w, w // 2) for w in range(4))
    jobs = 0
    while True:
        for _ in range(64):
            job = f"ps-{KINDS[jobs % 4]}-{3644168 + jobs}-33825-1120793"
            tracker.register_job(job, KINDS[jobs % 4], PARTITIONS)
            for p in range((jobs % 3) * 4):  # some partitions synthesized, the rest pending
                tracker.partition_synth_start(job, p)
                tracker.partition_synth_end(job, p)
            jobs += 1
        doc = tracker.snapshot()
        if not extensions:
            doc = msgspec.structs.replace(doc, cuzkd_extensions=None)
        body = json.dumps(json.loads(encode_status(doc)), indent=2).encode()
        if len(body) >= min_bytes:
            return body
