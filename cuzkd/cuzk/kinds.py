"""cuzk's proof kinds in one spelling, whichever interface named them.

``/status`` says ``porep-c2``, ``snap-update``, ``window-post``, ``winning-post``; gRPC
(``QueueStatus.proof_kind``, ``GPUStatus.current_proof_kind``, ``GetMetrics``' labels) spells
the same kinds with underscores. Every reading of cuzk goes through :func:`kind_label` before a
kind becomes a label value, so a kind has one label value whatever source it came from, and an
engine that invents kinds cannot grow a label without bound.
"""

from __future__ import annotations

#: The kinds cuzk proves, in ``/status``'s spelling: the label values cuzkd publishes.
CUZK_KINDS: tuple[str, ...] = ("porep-c2", "snap-update", "window-post", "winning-post")
#: The label value of a kind cuzk is not known to name (an engine newer than this list).
OTHER_KIND = "other"


def kind_label(name: str) -> str:
    """``porep_c2`` or ``porep-c2`` -> ``porep-c2``; anything else -> ``other``."""
    spelled = name.strip().lower().replace("_", "-")
    return spelled if spelled in CUZK_KINDS else OTHER_KIND
