"""cuzk's own TOML, read the way cuzk reads it: what a ``type = "cuzk"`` engine needs from it.

cuzk (Curio's proving daemon) takes its addresses, GPUs and memory budget from its own file
(``-c/--config``, default :data:`DEFAULT_CUZK_CONFIG`); writing them again in cuzkd's config
would be a second answer that can drift. So cuzkd reads cuzk's file at load and on every
reload, keeps only the keys it needs (:class:`CuzkFile`; every other key is ignored, as cuzk
ignores unknown ones) and refuses what cuzk itself would do wrong silently: a budget cuzk
cannot parse is 50 GiB to cuzk (or 0 for a bad ``MiB``/``MB`` number, see
:func:`cuzk_size`). The rules between this file and cuzkd's are :mod:`cuzkd.config.checks`'s;
this module reports its problems as :class:`CuzkFileError` (key, problem), which the loader
words as a ConfigError naming both files.
"""

from __future__ import annotations

import os
import re
import stat
import tomllib
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated

import msgspec

from cuzkd import validation
from cuzkd.errors import CuzkFileError
from cuzkd.units import parse_listen

#: Where cuzk reads its config without ``-c`` (cuzk-daemon's clap default).
DEFAULT_CUZK_CONFIG = "/data/zk/cuzk.toml"
#: cuzk's ``[daemon] listen`` default: its gRPC socket.
DEFAULT_CUZK_LISTEN = "unix:///run/curio/cuzk.sock"
#: Largest cuzk file read: a real one is a few KiB.
MAX_CUZK_FILE_BYTES = 1 * 2**20

_U32 = Annotated[int, msgspec.Meta(ge=0, le=2**32 - 1)]
_GIB = 2**30
_U64_MAX = 2**64 - 1
#: Rust's ``u64::from_str``: an optional ``+``, then ASCII digits.
_RUST_U64 = re.compile(r"\+?[0-9]+")
#: cuzk's size suffixes in the order ``parse_size`` tries them, with their multipliers.
_SUFFIXES = (("GiB", _GIB), ("MiB", 2**20), ("GB", 10**9), ("MB", 10**6))
#: Wildcard hosts a listener binds on every address, and the loopback cuzkd polls them on.
_LOOPBACK = {"0.0.0.0": "127.0.0.1", "::": "::1"}
#: The tables of cuzk's file cuzkd reads; the rest are cuzk's alone.
_TABLES = ("daemon", "gpus", "memory", "pipeline")
#: cuzk's synthesis working set per partition in its real cap (``synthesis.max_concurrent``
#: divides by 9 GiB instead), its default ``max_parallel_synthesis`` (0 also means it) and its
#: floor.
_SYNTHESIS_PARTITION_BYTES = 14 * _GIB
_DEFAULT_PARALLEL_SYNTHESIS = 18
_MIN_SYNTHESIS = 2


class CuzkDaemon(msgspec.Struct, frozen=True, kw_only=True):
    """``[daemon]``: ``listen`` is the gRPC address, ``status_listen`` the ``GET /status``
    listener ("" -- cuzk's default -- turns it off)."""

    listen: str = DEFAULT_CUZK_LISTEN
    status_listen: str = ""


class CuzkGpus(msgspec.Struct, frozen=True, kw_only=True):
    """``[gpus]``: ``devices`` are nvidia-smi indices (empty: every GPU nvidia-smi lists)."""

    devices: list[_U32] = msgspec.field(default_factory=list)
    gpu_workers_per_device: _U32 = 2


class CuzkMemory(msgspec.Struct, frozen=True, kw_only=True):
    """``[memory]``: ``total_budget`` is ``"auto"`` (MemTotal - ``safety_margin``) or a size."""

    total_budget: str = "auto"
    safety_margin: str = "5GiB"


class CuzkPipeline(msgspec.Struct, frozen=True, kw_only=True):
    """``[pipeline]``: ``max_parallel_synthesis`` caps partitions synthesizing at once."""

    max_parallel_synthesis: _U32 = _DEFAULT_PARALLEL_SYNTHESIS


def synthesis_capacity(budget_bytes: int, max_parallel_synthesis: int) -> int:
    """How many partitions cuzk really synthesizes at once with this memory budget:
    min(budget / 14 GiB, ``max_parallel_synthesis`` -- 0 meaning 18), at least 2. Not the
    ``synthesis.max_concurrent`` its ``/status`` reports (budget / 9 GiB)."""
    parallel = max_parallel_synthesis or _DEFAULT_PARALLEL_SYNTHESIS
    return max(_MIN_SYNTHESIS, min(budget_bytes // _SYNTHESIS_PARTITION_BYTES, parallel))


class CuzkFile(msgspec.Struct, frozen=True, kw_only=True):
    """What cuzkd knows of one cuzk engine's TOML; ``path`` is the file it was read from.

    Part of the engine's spec (:attr:`cuzkd.config.schema.EngineConfig.cuzk_file`), so a
    reload that finds the file changed restarts that engine: cuzk reads it only at start.
    """

    path: str
    daemon: CuzkDaemon = CuzkDaemon()
    gpus: CuzkGpus = CuzkGpus()
    memory: CuzkMemory = CuzkMemory()
    pipeline: CuzkPipeline = CuzkPipeline()
    #: cuzk's ``-l/--listen`` from the engine's command, which overrides ``[daemon] listen``
    listen_override: str | None = None

    @property
    def status_url(self) -> str | None:
        """Where cuzkd polls ``GET /status``: ``http://HOST:PORT/status`` from
        ``status_listen``, a wildcard host (``0.0.0.0``, ``[::]``) replaced by loopback; None
        while ``status_listen`` is off or not ``HOST:PORT`` (the checks refuse both)."""
        try:
            address = parse_listen(self.daemon.status_listen, allow_unix=False)
        except ValueError:
            return None
        host = _LOOPBACK.get(address.host, address.host)
        return f"http://{f'[{host}]' if ':' in host else host}:{address.port}/status"

    @property
    def status_wildcard(self) -> bool:
        """True when ``status_listen`` binds every address of the host: its job ids (miner
        and sector numbers) are then readable from the network."""
        try:
            return parse_listen(self.daemon.status_listen, allow_unix=False).host in _LOOPBACK
        except ValueError:
            return False

    @property
    def grpc_listen(self) -> str:
        """The gRPC address cuzk binds: ``-l`` if the command gives one, else the file's."""
        return self.listen_override if self.listen_override is not None else self.daemon.listen


def cuzk_config_path(explicit: str, command: Sequence[str]) -> str:
    """The file cuzk will read: ``explicit`` (the engine's ``cuzk_config``), else the ``-c P``,
    ``-cP``, ``-c=P``, ``--config P`` or ``--config=P`` in its command, else cuzk's default.

    CuzkFileError with key ``cuzk_config`` when both are given and differ (cuzk reads the
    command's), and with key ``command`` when the command gives it twice (clap refuses that:
    exit 2) or without a value.
    """
    given = _option_value(command, "c", "config")
    if explicit and given is not None and given != explicit:
        raise CuzkFileError("cuzk_config", f"{explicit!r}, but the command passes cuzk "
                                           f"--config {given!r} (the file cuzk reads): drop "
                                           "one or make them the same")
    path = explicit or given or DEFAULT_CUZK_CONFIG
    if "\0" in path:  # no file has such a name; os.open would raise ValueError
        raise CuzkFileError("cuzk_config" if path == explicit else "command",
                            "the cuzk config path must not contain a NUL character")
    if not Path(path).is_absolute():
        raise CuzkFileError("cuzk_config", f"{path!r} is relative: cuzk would read it from its "
                                           "working directory; give an absolute path")
    return path


def listen_from_command(command: Sequence[str]) -> str | None:
    """cuzk's ``-l/--listen ADDR`` override of ``[daemon] listen`` (None without one)."""
    return _option_value(command, "l", "listen")


def _option_value(command: Sequence[str], short: str, long: str) -> str | None:
    """One clap option's value in ``command[1:]`` (arguments after ``--`` are not options)."""
    found: list[str] = []
    args = list(command[1:])
    i = 0
    while i < len(args):
        arg = args[i]
        if arg == "--":
            break
        value: str | None = None
        if arg in (f"-{short}", f"--{long}"):
            if i + 1 >= len(args):
                raise CuzkFileError("command", f"`{arg}` has no value")
            value = args[i + 1]
            i += 1
        elif arg.startswith(f"--{long}="):
            value = arg.removeprefix(f"--{long}=")
        elif arg.startswith(f"-{short}") and not arg.startswith("--"):
            value = arg.removeprefix(f"-{short}").removeprefix("=")
        if value is not None:
            found.append(value)
        i += 1
    if len(found) > 1:
        raise CuzkFileError("command", f"gives cuzk --{long} {len(found)} times (cuzk "
                                       "refuses that with a usage error)")
    return found[0] if found else None


def cuzk_size(text: str) -> int | None:
    """The bytes cuzk's ``parse_size`` reads from ``text``, or None where it would silently
    substitute a value (50 GiB, or 0 for a bad ``MiB``/``MB`` number) or overflow.

    cuzk trims, tries the suffixes ``GiB``, ``MiB``, ``GB``, ``MB`` (case-sensitive, in that
    order), parses the rest as a u64 and otherwise reads plain bytes: ``"256GiB"`` and
    ``"256 GiB"`` work, ``"256G"``, ``"1TiB"``, ``"256gib"`` and ``"1.5GiB"`` do not.
    """
    text = text.strip()
    for suffix, multiplier in _SUFFIXES:
        if text.endswith(suffix):
            number, scale = text.removesuffix(suffix).strip(), multiplier
            break
    else:
        number, scale = text, 1
    if not _RUST_U64.fullmatch(number) or int(number) > _U64_MAX:
        return None
    size = int(number) * scale
    return size if size <= _U64_MAX else None


def read_cuzk_file(path: str, listen_override: str | None = None) -> CuzkFile:
    """Read and decode the cuzk file at ``path``; ``listen_override`` is the engine command's
    ``-l/--listen`` (:func:`listen_from_command`).

    It is opened like cuzk opens it (symlinks followed: cuzk follows them, and the file that
    matters is the one cuzk will read), but without blocking and only as a regular file, at
    most :data:`MAX_CUZK_FILE_BYTES`. A missing file is an error here, though cuzk would run
    on its defaults: those turn ``/status`` off.
    """
    raw = _decode_toml(_read_regular(path))
    tables = {table: raw[table] for table in _TABLES if table in raw}
    try:
        parsed = msgspec.convert({**tables, "path": path}, CuzkFile)
    except msgspec.ValidationError as exc:
        key, message = validation.key_and_message(exc)
        raise CuzkFileError(key, message) from None
    return msgspec.structs.replace(parsed, listen_override=listen_override)


def _read_regular(path: str) -> bytes:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        raise CuzkFileError("", "file not found (cuzk would run on its defaults, which turn "
                                "/status off); create it or set cuzk_config") from None
    except OSError as exc:
        raise CuzkFileError("", f"cannot read: {exc.strerror} (cuzk could not either)") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):  # a FIFO would be drained, a directory fails
        os.close(fd)
        raise CuzkFileError("", "not a regular file")
    with open(fd, "rb") as fh:
        try:
            data = fh.read(MAX_CUZK_FILE_BYTES + 1)
        except OSError as exc:
            raise CuzkFileError("", f"cannot read: {exc.strerror}") from None
    if len(data) > MAX_CUZK_FILE_BYTES:
        raise CuzkFileError("", f"larger than {MAX_CUZK_FILE_BYTES} bytes; not a cuzk config")
    return data


def _decode_toml(data: bytes) -> dict[str, object]:
    try:
        return tomllib.loads(data.decode())
    except UnicodeDecodeError as exc:
        raise CuzkFileError("", f"not UTF-8 text (byte {exc.object[exc.start]:#04x} at offset "
                                f"{exc.start}); cuzk would exit with an error") from None
    except tomllib.TOMLDecodeError as exc:
        raise CuzkFileError("", f"invalid TOML ({exc}); cuzk would exit with an error") from None
    except RecursionError:  # tomllib recurses into nested arrays and inline tables
        raise CuzkFileError("", "invalid TOML (nested too deeply)") from None
