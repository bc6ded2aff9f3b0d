"""Reading a config file safely and decoding it: bytes in, a checked :class:`Config` out.

The path is operator-controlled and may name anything. The read is capped at
:data:`MAX_CONFIG_BYTES` (a path naming /dev/zero must not be read into memory without end),
and a FIFO (``--config <(...)``, or one a reload reads) can be read without blocking in
``open`` and given a deadline. Every failure -- the file, its encoding, its TOML, a value
msgspec refuses -- becomes a :class:`ConfigError` whose message names the file and the key
(``engine[1].backoff_max``); ``cuzkd run`` / ``cuzkd check-config`` turn it into exit code 78
(EX_CONFIG). The rules between fields are :mod:`cuzkd.config.checks`'s.
"""

from __future__ import annotations

import os
import select
import stat
import time
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TypeVar

import msgspec

from cuzkd import validation
from cuzkd.config.addresses import control_socket
from cuzkd.config.checks import check, check_metrics_host
from cuzkd.config.cuzkchecks import check_cuzk_engines, cuzk_file_error, cuzk_warnings
from cuzkd.config.cuzkfile import cuzk_config_path, listen_from_command, read_cuzk_file
from cuzkd.config.doorchecks import check_door_groups, check_doors, door_notices
from cuzkd.config.schema import (
    DOOR_DEFAULT,
    TYPE_DEFAULTS,
    Bytes,
    Config,
    EngineConfig,
    Seconds,
    default_config,
    default_engines,
    visible_gpu_count,
)
from cuzkd.config.webconfig import WebConfig, read_web_config, tls_context
from cuzkd.errors import ConfigError, CuzkFileError, KindTwice, WebConfigError
from cuzkd.kinds import typed_table
from cuzkd.units import parse_duration, parse_size

_T = TypeVar("_T")

#: Largest config file read: a real one is a few KiB.
MAX_CONFIG_BYTES = 4 * 2**20


def load_or_default(path: str | Path | None, *, resolve_hosts: bool = True) -> Config:
    """The config at ``path``, or the embedded default when no path is given."""
    return load_config(path, resolve_hosts=resolve_hosts) if path else default_config()


def control_socket_despite_errors(path: str | Path) -> Path:
    """The control socket ``path`` names, for a file that does not validate as a whole: from
    its ``[supervisor]`` table alone while the file still parses as TOML, else the default.

    ``cuzkd reload`` needs it so that the running supervisor refuses the broken file itself --
    recorded in ``cuzkd_config_last_reload_successful`` and its alert -- instead of the client
    giving up before asking.
    """
    try:
        raw = tomllib.loads(_read_config_bytes(path, None).decode())
        supervisor = raw.get("supervisor", {})
        return control_socket(parse_config({"supervisor": supervisor}, str(path)))
    except (OSError, ValueError, ConfigError):  # the TOML and UTF-8 errors are ValueErrors
        return control_socket(Config())


def load_config(path: str | Path, *, resolve_hosts: bool = True,
                fifo_wait: float | None = None) -> Config:
    """Read, validate and resolve a TOML config file; raise ConfigError naming file and key.

    ``resolve_hosts=False`` skips what only running the daemon needs (the metrics.listen host
    resolving, the door's socket group looked up): client commands read the file for the
    control socket alone, and must keep working while DNS does not. ``fifo_wait``: a FIFO is
    read without blocking in ``open`` and must reach its end within that many seconds (a
    reload's read must end); None waits for a writer as ``cat`` does (``--config <(...)``).
    """
    where = str(path)
    try:
        data = _read_config_bytes(path, fifo_wait)
    except TimeoutError:  # an OSError: before the handler below
        raise ConfigError(f"{where}: no writer sent it within {fifo_wait:g}s (a FIFO)") from None
    except FileNotFoundError:
        raise ConfigError(f"{where}: file not found") from None
    except OSError as exc:
        raise ConfigError(f"{where}: cannot read: {exc.strerror}") from None
    try:
        text = data.decode()
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{where}: not UTF-8 text (byte {exc.object[exc.start]:#04x} at "
                          f"offset {exc.start}); TOML files must be UTF-8") from None
    return config_from_text(text, where, resolve_hosts=resolve_hosts)


def config_from_text(text: str, where: str, *, resolve_hosts: bool = True) -> Config:
    """:func:`load_config` of a file's ``text`` as read from ``where`` (``cuzkd upgrade``
    hands the running config's text to the new program)."""
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{where}: invalid TOML: {exc}") from None
    except RecursionError:  # tomllib recurses into nested arrays: "a = [[[[..." 4 MiB deep
        raise ConfigError(f"{where}: invalid TOML: nested too deeply") from None
    config = msgspec.structs.replace(parse_config(raw, where), text=text)
    if resolve_hosts:
        check_metrics_host(config, where)
        check_web_config(config.metrics.web_config, where)
        check_door_groups(config, where)
    return config


def check_web_config(path: str, where: str) -> WebConfig | None:
    """The ``metrics.web_config`` file read and its TLS context built (None without one), or
    a ConfigError naming both files and the key. Only the daemon's reads (and check-config)
    get here: a client command must not need to read the listener's private key."""
    if not path:
        return None
    try:
        web = read_web_config(path)
        tls_context(web)
    except WebConfigError as exc:
        raise ConfigError(web_config_error(where, path, exc)) from None
    return web


def web_config_error(where: str, path: str, exc: WebConfigError) -> str:
    """``cuzkd.toml: key `metrics.web_config`: web.yml: key `k`: problem``."""
    return validation.key_error(where, "metrics.web_config",
                                validation.key_error(path, exc.key, exc.problem))


def _read_config_bytes(path: str | Path, fifo_wait: float | None) -> bytes:
    """The file's bytes, at most MAX_CONFIG_BYTES (a path naming /dev/zero must not be read
    into memory without end)."""
    if fifo_wait is None:
        with Path(path).open("rb") as fh:
            data = fh.read(MAX_CONFIG_BYTES + 1)
    else:
        with open(os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC), "rb") as fh:
            if stat.S_ISFIFO(os.fstat(fh.fileno()).st_mode):
                data = _read_fifo(fh.fileno(), fifo_wait)
            else:
                data = fh.read(MAX_CONFIG_BYTES + 1)
    if len(data) > MAX_CONFIG_BYTES:
        raise ConfigError(f"{path}: larger than {MAX_CONFIG_BYTES} bytes; not a cuzkd config")
    return data


def _read_fifo(fd: int, wait: float) -> bytes:
    """A non-blocking FIFO read to its end (a writer came and closed), or TimeoutError after
    ``wait`` seconds. Linux reports no hang-up before a writer has come, so "no writer yet" is
    told apart from "the writer is done". Stops once past MAX_CONFIG_BYTES."""
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    deadline = time.monotonic() + wait
    chunks: list[bytes] = []
    size = 0
    while (left := deadline - time.monotonic()) > 0:
        events = poller.poll(left * 1000)
        try:
            chunk = os.read(fd, 65536)
        except BlockingIOError:
            continue
        if chunk:
            chunks.append(chunk)
            size += len(chunk)
            if size > MAX_CONFIG_BYTES:
                break  # refused by the caller
        elif any(mask & select.POLLHUP for _, mask in events):
            break
    else:
        raise TimeoutError
    return b"".join(chunks)


def parse_config(raw: Mapping[str, Any], where: str) -> Config:
    """Validate an already-parsed TOML document (``where`` names it in messages)."""
    data = dict(raw)
    notices = _kind_tables(data, where)
    for internal in ("path", "demo", "notices", "text"):  # fields of Config no file sets
        if internal in data:
            raise ConfigError(f"{where}: key `{internal}`: unknown key")
    defaults = data.pop("engine_defaults", {})
    if not isinstance(defaults, dict):
        raise ConfigError(f"{where}: key `engine_defaults`: expected a table")
    _refuse_internal_engine_keys(defaults, data.get("engine"), where)
    if "name" in defaults:
        raise ConfigError(f"{where}: key `engine_defaults.name`: names must be set per engine")
    # Validate the defaults on their own first so their mistakes name `engine_defaults.*`.
    _convert({"name": "defaults", **defaults}, EngineConfig, where, "engine_defaults")
    engines = data.get("engine", [])
    if isinstance(engines, list):
        data["engine"] = [
            {**_type_defaults({**defaults, **e}), **defaults, **e} if isinstance(e, dict) else e
            for e in engines
        ]
    config = _convert(data, Config, where, "")
    if not config.engine:
        config = msgspec.structs.replace(config, engine=default_engines(visible_gpu_count()))
    config = msgspec.structs.replace(config, path=where,
                                     engine=[_with_cuzk_file(e, i, where)
                                             for i, e in enumerate(config.engine)])
    check_doors(config, where)
    check_cuzk_engines(config, where)
    notices += [f"{where}: {warning}" for warning in cuzk_warnings(config)]
    check(config, where)
    notices += door_notices(config, where)
    return msgspec.structs.replace(config, notices=tuple(notices))


def demo_config(config: Config) -> Config:
    """``config`` as ``cuzkd run --demo`` runs it (at start and at each reload): its bundled
    engines demo engines, each behind a front door of its own unless its ``door`` says
    otherwise, so the demo's load comes through a door as Curio's calls would. The doors it
    adds keep the door rules (checked here as at load: ConfigError naming the file and key)."""
    engines = [msgspec.structs.replace(e, door=DOOR_DEFAULT) if e.bundled and e.door is None
               else e for e in config.engine]
    demo = msgspec.structs.replace(config, demo=True, engine=engines)
    where = config.path or "the default config"
    check_doors(demo, where)
    check_cuzk_engines(demo, where)
    return demo


def _refuse_internal_engine_keys(defaults: dict[str, Any], engines: object, where: str) -> None:
    """``cuzk_file`` is what loading read, never a key a file sets."""
    if "cuzk_file" in defaults:
        raise ConfigError(f"{where}: key `engine_defaults.cuzk_file`: unknown key")
    for i, engine in enumerate(engines if isinstance(engines, list) else []):
        if isinstance(engine, dict) and "cuzk_file" in engine:
            raise ConfigError(f"{where}: key `engine[{i}].cuzk_file`: unknown key")


def _with_cuzk_file(engine: EngineConfig, index: int, where: str) -> EngineConfig:
    """A cuzk engine with its cuzk file read; others as they are (``cuzk_config`` is refused
    on them by the checks)."""
    if not engine.cuzk or engine.command is None:  # without a command: refused by the checks
        return engine
    key = f"engine[{index}]"
    command = engine.command
    try:
        path = cuzk_config_path(engine.cuzk_config, command)
        listen = listen_from_command(command)
    except CuzkFileError as exc:
        raise ConfigError(f"{where}: key `{key}.{exc.key}`: {exc.problem}") from None
    try:
        cuzk_file = read_cuzk_file(path, listen)
    except CuzkFileError as exc:
        raise ConfigError(cuzk_file_error(path, exc.key, exc.problem, f"{where}: {key}")) from None
    return msgspec.structs.replace(engine, cuzk_file=cuzk_file)


def _type_defaults(engine: dict[str, Any]) -> dict[str, object]:
    """What an explicit ``type`` defaults (a bad ``type`` is msgspec's to name)."""
    kind = engine.get("type")
    return next((v for k, v in TYPE_DEFAULTS.items() if k == kind), {})


def _duration_hook(typ: type, obj: Any) -> Any:
    if typ is Seconds:
        if not isinstance(obj, str | int | float) or isinstance(obj, bool):
            raise ValueError(f"expected a duration such as '30s' or a number, got {obj!r}")
        return Seconds(parse_duration(obj))
    if typ is Bytes:
        if not isinstance(obj, str | int) or isinstance(obj, bool):
            raise ValueError(f"expected a size such as '20GiB' or a number, got {obj!r}")
        return Bytes(parse_size(obj))
    raise NotImplementedError


#: The tables a person writes keyed by proof kind, each (table, key): their values are durations
KIND_TABLES = (("metrics", "proof_deadlines"), ("door", "proving_allowance"))


def _kind_tables(data: dict[str, Any], where: str) -> list[str]:
    """Each value of a table keyed by proof kind (``[metrics] proof_deadlines``, ``[door]
    proving_allowance``) checked on its own (msgspec names a bad value of a table of
    arbitrary keys only as ``proof_deadlines[...]``, this names its proof kind), and its kinds
    by cuzk's names (in ``data``); returns the warnings for old names typed, each naming the
    file and the key."""
    notices: list[str] = []
    for section, table in KIND_TABLES:
        outer = data.get(section)
        if not isinstance(outer, dict) or not isinstance(outer.get(table), dict):
            continue
        prefix = f"{section}.{table}"
        for kind, value in outer[table].items():
            _convert(value, Seconds, where, f"{prefix}.{kind}")
        try:
            by_kind, warnings = typed_table(outer[table])
        except KindTwice as exc:
            raise ConfigError(validation.key_error(where, f"{prefix}.{exc.key}",
                                                   str(exc))) from None
        data[section] = {**outer, table: by_kind}
        notices += [validation.key_error(where, f"{prefix}.{key}", text)
                    for key, text in warnings.items()]
    return notices


def _convert(data: Any, typ: type[_T], where: str, prefix: str) -> _T:
    try:
        return msgspec.convert(data, typ, dec_hook=_duration_hook)
    except msgspec.ValidationError as exc:
        raise ConfigError(validation.describe(exc, where, prefix)) from None
