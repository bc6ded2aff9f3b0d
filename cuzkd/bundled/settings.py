"""The engine's TOML configuration, validated with msgspec.

Unknown keys are rejected (a misspelt key silently ignored is a budget silently wrong). Every
error is a :class:`ProverConfigError` naming the file and the key; the CLI turns it into exit 78
(EX_CONFIG). Without ``--config`` the defaults apply, which is what the supervisor and CI use.

Example::

    memory_budget = "auto"        # or "8GiB": total of the host-memory budget
    safety_margin = "5GiB"        # "auto" budget = RAM (or the cgroup's limit) minus this
    workers_per_gpu = 2
    devices = [0, 1]              # GPU ordinals; empty = every device CuPy sees
    backend = "auto"              # "auto" | "numpy" | "cupy"
    synthesis_threads = 2         # 0 = one per CPU core
    synthesis_rounds = 1          # a ← a² + x layers per witness element: synthesis CPU cost
    drain_timeout = "30s"         # SIGTERM / POST /v1/drain: accepted jobs finish within this
    [sizes]                       # log2 of the constraint count per partition
    porep-c2 = 14
"""

from __future__ import annotations

import dataclasses
import os
import tomllib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any

import msgspec

from cuzkd import validation
from cuzkd.bundled.backend import BackendName
from cuzkd.bundled.memlimit import usable_memory_bytes
from cuzkd.errors import KindTwice, ProverConfigError
from cuzkd.kinds import typed_table
from cuzkd.status.document import PARTITIONS as PARTITIONS
from cuzkd.units import parse_duration, parse_size

#: Largest size_log2 accepted (2n must stay within the field's 2^27 two-adic subgroup; far
#: beyond what fits in memory anyway).
MAX_SIZE_LOG2 = 24
MIN_SIZE_LOG2 = 2

SizeLog2 = Annotated[int, msgspec.Meta(ge=MIN_SIZE_LOG2, le=MAX_SIZE_LOG2)]


class Sizes(msgspec.Struct, forbid_unknown_fields=True, frozen=True, rename="kebab"):
    """Default log2 partition size per proof kind, keyed by the kinds' names (``porep-c2``):
    a snap-update job (16 partitions of 2^14) takes about a second on 2 CPU cores with NumPy."""

    porep_c2: SizeLog2 = 14
    snap_update: SizeLog2 = 14
    window_post: SizeLog2 = 14
    winning_post: SizeLog2 = 13


class _RawConfig(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    memory_budget: str | int = "auto"
    safety_margin: str | int = "5GiB"
    workers_per_gpu: Annotated[int, msgspec.Meta(ge=1, le=64)] = 2
    devices: list[Annotated[int, msgspec.Meta(ge=0)]] = msgspec.field(default_factory=list)
    backend: BackendName = BackendName.AUTO
    synthesis_threads: Annotated[int, msgspec.Meta(ge=0, le=1024)] = 0
    synthesis_rounds: Annotated[int, msgspec.Meta(ge=1, le=100_000)] = 1
    drain_timeout: str | float | int = "30s"
    sizes: Sizes = msgspec.field(default_factory=Sizes)


@dataclass(frozen=True)
class ProverConfig:
    """Resolved configuration: sizes in bytes, durations in seconds."""

    memory_budget_bytes: int
    workers_per_gpu: int = 2
    devices: tuple[int, ...] = ()
    backend: BackendName = BackendName.AUTO
    synthesis_threads: int = 1
    synthesis_rounds: int = 1
    drain_timeout_secs: float = 30.0
    sizes: Sizes = field(default_factory=Sizes)
    #: test-only (``cuzkd engine --test-slowdown``): GPU phases take this many times as long
    test_slowdown: float = 1.0
    #: test-only (``cuzkd engine --test-failure-rate``): this share of jobs fails
    test_failure_rate: float = 0.0
    #: warnings for what the file should change (an old proof kind name in ``[sizes]``, still
    #: accepted), each naming the file and the key; the engine logs them at start
    notices: tuple[str, ...] = ()

    def size_log2(self, proof_kind: str) -> int:
        value: int = getattr(self.sizes, proof_kind.replace("-", "_"))  # the kebab renaming
        return value


def resolve(raw: _RawConfig, source: str, *,
            usable_memory: Callable[[], int] = usable_memory_bytes) -> ProverConfig:
    """Sizes and durations resolved; ``usable_memory`` gives what "auto" budgets from."""
    def fail(key: str, message: str) -> ProverConfigError:
        return ProverConfigError(validation.key_error(source, key, message))

    try:
        margin = parse_size(raw.safety_margin)
    except ValueError as exc:
        raise fail("safety_margin", str(exc)) from exc
    if raw.memory_budget == "auto":
        usable = usable_memory()
        budget = usable - margin
        if budget <= 0:
            raise fail("safety_margin", f"{margin} bytes leaves nothing of the {usable} bytes "
                                        "this process may use (RAM, or its cgroup's limit)")
    else:
        try:
            budget = parse_size(raw.memory_budget)
        except ValueError as exc:
            raise fail("memory_budget", f"{exc} (or \"auto\")") from exc
        if budget <= 0:
            raise fail("memory_budget", "must be positive")
    try:
        grace = parse_duration(raw.drain_timeout)
    except ValueError as exc:
        raise fail("drain_timeout", str(exc)) from exc
    return ProverConfig(
        memory_budget_bytes=budget,
        workers_per_gpu=raw.workers_per_gpu,
        devices=tuple(raw.devices),
        backend=raw.backend,
        synthesis_threads=raw.synthesis_threads or (os.cpu_count() or 1),
        synthesis_rounds=raw.synthesis_rounds,
        drain_timeout_secs=grace,
        sizes=raw.sizes,
    )


def default_config() -> ProverConfig:
    return resolve(_RawConfig(), "<defaults>")


#: ``cuzkd engine --demo`` (what ``cuzkd run --demo`` starts): a budget small enough that a
#: burst of jobs fills it, as production bursts fill cuzk's (so the memory panels move), and
#: synthesis about as costly as the CPU pseudo-device's proving phase, so partitions are seen
#: synthesizing as they are on cuzk, where synthesis is the long phase.
DEMO_MEMORY_BUDGET = "32MiB"
DEMO_SYNTHESIS_ROUNDS = 150


def demo_config() -> ProverConfig:
    return resolve(_RawConfig(memory_budget=DEMO_MEMORY_BUDGET,
                              synthesis_rounds=DEMO_SYNTHESIS_ROUNDS), "<demo>")


def load_config(path: Path) -> ProverConfig:
    """Read and validate ``path``; :class:`ProverConfigError` names the file and the bad key."""
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ProverConfigError(f"{path}: cannot read: {exc.strerror or exc}") from exc
    except UnicodeDecodeError as exc:
        raise ProverConfigError(f"{path}: not UTF-8 text (offset {exc.start}); TOML files must be "
                          "UTF-8") from exc
    except tomllib.TOMLDecodeError as exc:
        raise ProverConfigError(f"{path}: not valid TOML: {exc}") from exc
    notices = _size_kinds(data, str(path))
    try:
        raw = msgspec.convert(data, _RawConfig)
    except msgspec.ValidationError as exc:
        raise ProverConfigError(validation.describe(exc, str(path))) from exc
    return dataclasses.replace(resolve(raw, str(path)), notices=tuple(notices))


def _size_kinds(data: dict[str, Any], where: str) -> list[str]:
    """``[sizes]`` keyed by cuzk's kind names (in ``data``); returns the warnings for old
    names typed, each naming the file and the key. Each value is checked first, so that an
    error names the key as the file wrote it."""
    sizes = data.get("sizes")
    if not isinstance(sizes, dict):
        return []  # msgspec's to refuse
    for key, value in sizes.items():
        try:
            msgspec.convert(value, SizeLog2)
        except msgspec.ValidationError as exc:
            raise ProverConfigError(validation.describe(exc, where, f"sizes.{key}")) from None
    try:
        data["sizes"], warnings = typed_table(sizes)
    except KindTwice as exc:
        raise ProverConfigError(validation.key_error(where, f"sizes.{exc.key}", str(exc))) from None
    return [validation.key_error(where, f"sizes.{key}", text) for key, text in warnings.items()]
