"""A reload as a plan: for each engine by name, stop, keep, start or change.

Pure: the running specs and the new config's in, the plan out;
:meth:`~cuzkd.supervisor.engines.engineset.EngineSet.apply` carries it out.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from cuzkd.config import EngineConfig


@dataclass(frozen=True)
class ReloadPlan:
    """What a reload does to each engine, by name, in the new config's order."""

    stop: list[str]  # gone from the config
    keep: list[str]  # unchanged: its process runs on
    start: list[str]  # new in the config
    change: list[str]  # its table changed: stopped, then started with the new one


def plan(old: Mapping[str, EngineConfig], new: Sequence[EngineConfig]) -> ReloadPlan:
    """The reload from the running specs ``old`` (by name) to the config's ``new`` ones."""
    names = {spec.name for spec in new}
    return ReloadPlan(
        stop=[name for name in old if name not in names],
        keep=[s.name for s in new if s.name in old and old[s.name] == s],
        start=[s.name for s in new if s.name not in old],
        change=[s.name for s in new if s.name in old and old[s.name] != s],
    )
