"""cuzk's priorities (:mod:`cuzkd.priority`): one enum, in step with the proto's."""

from __future__ import annotations

from cuzkd.cuzk import proving_pb2 as pb
from cuzkd.priority import Priority


def test_the_enum_names_and_numbers_the_protos_priorities() -> None:
    """A member's name is the proto's, so a request may be given it by name."""
    assert [(p.name, p.value) for p in Priority] == pb.Priority.items()
