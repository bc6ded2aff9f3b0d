"""The rules a config must keep that its schema cannot state: between fields, and at run time.

msgspec checks each value on its own (:mod:`cuzkd.config.schema`). What is left is checked
here, before any engine starts and before a reload gets far enough to replace a running
engine: names unique, a backoff that does not shrink, a stop sequence that fits in the
shutdown grace, socket paths the kernel can bind, ``env`` entries ``execve`` accepts. Each
failure is a :class:`ConfigError` naming the file and the key.
"""

from __future__ import annotations

import os
import re
import signal
import socket
from collections.abc import Callable
from pathlib import Path
from urllib.parse import urlsplit

from cuzkd.config.addresses import control_socket, status_address
from cuzkd.config.schema import Config, DrainMode, EngineConfig, EngineType
from cuzkd.errors import ConfigError
from cuzkd.units import parse_listen

#: Longest Unix socket path the kernel binds: ``sun_path`` is 108 bytes including the NUL.
MAX_SOCKET_PATH_BYTES = 107
#: Shortest health_interval and backoff_initial: below it an engine's polls or restarts would
#: spin the supervisor's loop rather than pace it.
MIN_INTERVAL = 0.01


def check_metrics_host(config: Config, where: str) -> None:
    """Refuse a ``metrics.listen`` host that does not resolve (only the daemon binds it)."""
    try:
        metrics = parse_listen(config.metrics.listen, allow_unix=False)
        _resolve(metrics.host, metrics.port)
    except ValueError as exc:
        raise ConfigError(f"{where}: key `metrics.listen`: {exc}") from None


def check(config: Config, where: str) -> None:
    """Cross-field rules msgspec cannot express, and what would only fail at run time."""

    def fail(key: str, problem: str) -> ConfigError:
        return ConfigError(f"{where}: key `{key}`: {problem}")

    try:
        parse_listen(config.metrics.listen, allow_unix=False)
    except ValueError as exc:
        raise fail("metrics.listen", str(exc)) from None
    control_key = ("supervisor.control_socket" if config.supervisor.control_socket
                   else "supervisor.state_dir")
    try:
        check_socket_path(control_socket(config))
    except ValueError as exc:
        raise fail(control_key, str(exc)) from None
    seen: dict[str, int] = {}
    for i, eng in enumerate(config.engine):
        key = f"engine[{i}]"
        if eng.name in seen:
            raise fail(f"{key}.name", f"duplicate engine name {eng.name!r} "
                                      f"(also engine[{seen[eng.name]}])")
        seen[eng.name] = i
        if type_problem := _engine_type_problem(eng):
            raise fail(f"{key}.{type_problem[0]}", type_problem[1])
        if eng.command is not None:
            if not eng.command or not eng.command[0]:
                raise fail(f"{key}.command", "must be a non-empty list (omit it for the bundled "
                                             "engine)")
            for j, arg in enumerate(eng.command):
                if "\0" in arg:
                    raise fail(f"{key}.command[{j}]", "must not contain a NUL character")
            if eng.listen:
                raise fail(f"{key}.listen", "only for the bundled engine (omit `command`)")
        # Checked here, not at spawn: execve refuses these, and a reload must not get that far.
        for var, value in eng.env.items():
            if not var or "=" in var or "\0" in var or "\0" in value:
                raise fail(f"{key}.env", f"{var!r}: names must be non-empty without '=' or "
                                         "NUL, values without NUL")
        if eng.status_url:
            try:
                _check_status_url(eng.status_url)
            except ValueError as exc:
                raise fail(f"{key}.status_url", str(exc)) from None
        if eng.listen:
            try:
                parse_listen(eng.listen)
            except ValueError as exc:
                raise fail(f"{key}.listen", str(exc)) from None
        address = status_address(config, eng)
        if address is not None and address.startswith("unix:"):
            field = "status_url" if eng.status_url else "listen"
            try:
                check_socket_path(Path(address.removeprefix("unix:")))
            except ValueError as exc:
                raise fail(f"{key}.{field}", str(exc)) from None
        if eng.stop_signal not in signal.Signals.__members__:
            raise fail(f"{key}.stop_signal", f"unknown signal {eng.stop_signal!r} "
                                             "(use a name such as 'SIGTERM')")
        positive = ("backoff_max", "backoff_reset_after", "start_timeout", "unhealthy_after",
                    "stale_job_after",
                    "stop_timeout", "drain_timeout", "status_timeout", "output_bytes_per_second",
                    "output_burst_bytes")
        for field in positive:
            if getattr(eng, field) <= 0:
                raise fail(f"{key}.{field}", "must be greater than zero")
        for field in ("health_interval", "backoff_initial"):
            if getattr(eng, field) < MIN_INTERVAL:
                raise fail(f"{key}.{field}", f"{getattr(eng, field):g}s is below the minimum "
                                             f"of {MIN_INTERVAL * 1000:g}ms")
        if 0 < eng.grpc_telemetry_interval < MIN_INTERVAL:
            raise fail(f"{key}.grpc_telemetry_interval",
                       f"{eng.grpc_telemetry_interval:g}s is below the minimum of "
                       f"{MIN_INTERVAL * 1000:g}ms (\"0s\": no telemetry)")
        if eng.backoff_max < eng.backoff_initial:
            raise fail(f"{key}.backoff_max", f"{eng.backoff_max:g}s is less than "
                                             f"backoff_initial ({eng.backoff_initial:g}s)")
        _check_gpus(eng, key, fail)
        if 0 < eng.stall_after < eng.health_interval:
            raise fail(f"{key}.stall_after", f"{eng.stall_after:g}s is shorter than "
                                             f"health_interval ({eng.health_interval:g}s); "
                                             "use '0s' to turn the stall watchdog off")
        if eng.drain_mode != DrainMode.NONE and address is None:
            raise fail(f"{key}.drain", f"{str(eng.drain_mode)!r} needs the engine's status "
                                       "(set status_url, or drain = \"none\")")
        if eng.drain_mode == DrainMode.CUZK and not eng.cuzk:
            raise fail(f"{key}.drain", "'cuzk' reads cuzk's gRPC GetStatus: only for "
                                       "type = \"cuzk\" (use \"quiet\" for this engine)")
        # A shutdown drains for what shutdown_grace leaves after stop_timeout (the grace
        # bounds everything); only a stop signal with no room before the grace ends is refused.
        if eng.stop_timeout > config.supervisor.shutdown_grace:
            raise fail(f"{key}.stop_timeout", f"stop_timeout {eng.stop_timeout:g}s is more "
                                              f"than supervisor.shutdown_grace "
                                              f"({config.supervisor.shutdown_grace:g}s): a "
                                              "shutdown would SIGKILL the engine before its "
                                              "stop signal had its time")
        if eng.unhealthy_after < eng.health_interval:
            raise fail(f"{key}.unhealthy_after", f"{eng.unhealthy_after:g}s is shorter than "
                                                 f"health_interval ({eng.health_interval:g}s)")


_GPU_ID = re.compile(r"^(\d+|(GPU|MIG)-[0-9A-Za-z/-]+)$")
#: Set from ``gpus``; also setting them in ``env`` would be two answers to one question.
_GPU_ENV = ("CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER")


def _check_gpus(eng: EngineConfig, key: str, fail: Callable[[str, str], ConfigError]) -> None:
    for j, gpu in enumerate(eng.gpus):
        if not _GPU_ID.match(gpu):
            raise fail(f"{key}.gpus[{j}]", f"{gpu!r} is neither an NVML index ('0') nor a GPU "
                                            "UUID ('GPU-...'; see nvidia-smi -L)")
    if len(set(eng.gpus)) != len(eng.gpus):
        raise fail(f"{key}.gpus", "lists a GPU twice")
    if eng.gpus:
        for var in _GPU_ENV:
            if var in eng.env:
                raise fail(f"{key}.env", f"{var} is set from `gpus`; remove it from env")
    elif eng.gpu_memory_needed:
        raise fail(f"{key}.gpu_memory_needed", "needs `gpus` (the GPUs to check)")


def _check_status_url(url: str) -> None:
    """``unix:/PATH`` or ``http://HOST[:PORT]/...`` with a host and a valid port."""
    if url.startswith("unix:"):
        parse_listen(url)
        return
    if not url.startswith("http://"):
        raise ValueError(f"{url!r} must start with http:// or unix:")
    parts = urlsplit(url)
    if not parts.hostname:
        raise ValueError(f"{url!r} names no host (http://HOST:PORT/status)")
    try:
        parts.port  # noqa: B018 -- the property raises ValueError for a bad port
    except ValueError:
        raise ValueError(f"{url!r} has an invalid port") from None


def check_socket_path(path: Path) -> None:
    """Refuse a Unix socket path the kernel could not bind (too long for ``sun_path``)."""
    size = len(os.fsencode(path))
    if size > MAX_SOCKET_PATH_BYTES:
        raise ValueError(f"socket path {str(path)!r} is {size} bytes; the kernel's limit is "
                   f"{MAX_SOCKET_PATH_BYTES} (choose a shorter state_dir or socket path)")


def _resolve(host: str, port: int) -> None:
    """ValueError unless ``host`` resolves to an address a TCP listener can bind."""
    try:
        socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except (OSError, UnicodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise ValueError(f"host {host!r} does not resolve: {reason}") from None



def _engine_type_problem(eng: EngineConfig) -> tuple[str, str] | None:
    """(key, problem) when an explicit ``type`` does not fit the keys beside it (an inferred
    type always does)."""
    if eng.type is None:
        return None
    if eng.type == EngineType.BUNDLED and eng.command is not None:
        return "command", "the bundled engine has no `command` (set another type)"
    if eng.type != EngineType.BUNDLED and eng.command is None:
        return "type", (f"type {str(eng.type)!r} needs a `command` "
                        "(only the bundled engine has none)")
    if eng.type == EngineType.HTTP and not eng.status_url:
        return "status_url", "type 'http' needs a status_url"
    if eng.type == EngineType.PROCESS and eng.status_url:
        return "status_url", "type 'process' has no status (use type 'http')"
    return None
