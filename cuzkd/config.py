"""The supervisor's configuration: TOML in, typed and fully validated structs out.

Everything an operator can get wrong is caught here, before any engine starts: unknown keys,
wrong types, duplicate names and impossible values all raise :class:`ConfigError` whose message
names the file, the key (``engine[1].backoff_max``) and the problem, and ``cuzkd run`` /
``cuzkd check-config`` turn it into exit code 78 (EX_CONFIG). Durations are resolved to float
seconds at load so nothing downstream parses strings.

The structs are frozen and compare by value: a SIGHUP reload diffs engines with ``==``.
"""

from __future__ import annotations

import os
import re
import select
import signal
import socket
import stat
import sys
import time
import tomllib
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar
from urllib.parse import urlsplit

import msgspec

from cuzkd import validation
from cuzkd.errors import EX_CONFIG, CuzkdError
from cuzkd.logs import LogFormat
from cuzkd.units import parse_duration, parse_listen, parse_size

_T = TypeVar("_T")

#: argv[0] placeholder for "the active release's binary" (resolved at spawn time by swap).
BINARY_PLACEHOLDER = "{binary}"

DEFAULT_METRICS_LISTEN = "127.0.0.1:9822"

#: ``cuzkd start|restart`` wait this long beyond the engine's start_timeout for ``running``.
START_WAIT_SLACK = 5.0
#: Longest Unix socket path the kernel binds: ``sun_path`` is 108 bytes including the NUL.
MAX_SOCKET_PATH_BYTES = 107
#: Shortest health_interval and backoff_initial: below it an engine's polls or restarts would
#: spin the supervisor's loop rather than pace it.
MIN_INTERVAL = 0.01


#: Largest config file read: a real one is a few KiB.
MAX_CONFIG_BYTES = 4 * 2**20


class ConfigError(CuzkdError):
    """A configuration mistake; the message is meant for the operator as is."""

    exit_code = EX_CONFIG


class Seconds(float):
    """A duration in seconds; the file says ``"250ms"``, ``"30s"``, ``"5m"`` or a number."""


class Bytes(int):
    """A size in bytes; the file says ``"20GiB"``, ``"512MB"`` or a number."""


_NAME = Annotated[str, msgspec.Meta(pattern=r"^[a-z0-9_-]+$", min_length=1, max_length=64)]
_POSITIVE_INT = Annotated[int, msgspec.Meta(ge=1)]
Restart = Literal["always", "on-failure", "never"]
LogLevel = Literal["debug", "info", "warning", "error"]
StallAction = Literal["restart", "alert"]
#: How a supervisor-initiated stop lets in-flight work end first (docs/supervisor.md, the stop
#: sequence): ``http`` asks the engine to drain (``POST /v1/drain``, the bundled engine's),
#: ``quiet`` waits for a moment with no partition synthesizing or on a GPU (any engine with a
#: status), ``none`` sends the stop signal at once.
DrainMode = Literal["http", "quiet", "none"]


class SupervisorConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """``[supervisor]``. Empty ``state_dir``/``control_socket`` mean "the default"."""

    state_dir: str = ""
    control_socket: str = ""
    shutdown_grace: Seconds = Seconds(30)
    log_level: LogLevel = "info"
    #: "auto": console lines on a terminal, JSON lines elsewhere; `run --log-format` overrides
    log_format: LogFormat = "auto"
    #: swap: the binary ``{binary}`` engines run before the first swap (optional)
    initial_binary: str = ""
    #: swap: how many releases to keep on disk
    keep_releases: _POSITIVE_INT = 3
    #: swap: how long the ``{binary}`` engines must stay healthy at start before the active
    #: release (an ``initial_binary`` seed, or one a crash left on trial) is accepted
    release_settle: Seconds = Seconds(10)


#: Chain deadlines the proof-latency alert compares each kind's p99 job duration with: a
#: WinningPoSt later than ~20 s loses the block; a WindowPoSt must land within its 30-minute
#: deadline window. ``[metrics] proof_deadlines`` overrides or adds kinds ("0s" drops one).
DEFAULT_PROOF_DEADLINES: dict[str, float] = {"winning": 20.0, "wpost": 1200.0}
_PROOF_KIND = Annotated[str, msgspec.Meta(min_length=1, max_length=64)]


class MetricsConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """``[metrics]``: the TCP listener for /metrics, /status and /healthz (read-only)."""

    listen: str = DEFAULT_METRICS_LISTEN
    #: proof kind -> latency deadline, exported as ``cuzkd_proof_deadline_seconds``
    proof_deadlines: dict[_PROOF_KIND, Seconds] = msgspec.field(default_factory=dict)

    def deadlines(self) -> dict[str, float]:
        """The defaults with the file's overrides; kinds set to 0 are left out."""
        merged = {**DEFAULT_PROOF_DEADLINES, **self.proof_deadlines}
        return {kind: float(limit) for kind, limit in merged.items() if limit > 0}


class EngineConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """One ``[[engine]]``. ``command=None`` is the bundled engine run with this Python."""

    name: _NAME
    command: list[str] | None = None
    env: dict[str, str] = msgspec.field(default_factory=dict)
    status_url: str = ""
    listen: str = ""
    restart: Restart = "always"
    backoff_initial: Seconds = Seconds(0.1)
    backoff_max: Seconds = Seconds(30)
    backoff_multiplier: Annotated[float, msgspec.Meta(ge=1.0, le=100.0)] = 2.0
    backoff_reset_after: Seconds = Seconds(60)
    start_timeout: Seconds = Seconds(60)
    health_interval: Seconds = Seconds(1)
    #: how long one status fetch may take: independent of health_interval, because a busy
    #: engine's 1 MB document over a congested link can take longer than one poll period
    status_timeout: Seconds = Seconds(5)
    unhealthy_after: Seconds = Seconds(15)
    stop_signal: str = "SIGTERM"
    stop_timeout: Seconds = Seconds(10)
    #: unset: ``http`` for the bundled engine, ``quiet`` with a status_url, else ``none``
    drain: DrainMode | None = None
    drain_timeout: Seconds = Seconds(20)
    #: stall watchdog: work and no progress for this long is a stall ("0s": off)
    stall_after: Seconds = Seconds(600)
    stall_action: StallAction = "restart"
    #: GPUs the engine is pinned to: NVML indices ("0") or UUIDs ("GPU-..."); sets
    #: CUDA_VISIBLE_DEVICES and CUDA_DEVICE_ORDER=PCI_BUS_ID, and each start waits for their
    #: memory (the previous process's released, gpu_memory_needed free) up to
    #: gpu_release_timeout
    gpus: list[str] = msgspec.field(default_factory=list)
    gpu_memory_needed: Bytes = Bytes(0)
    gpu_release_timeout: Seconds = Seconds(30)

    @property
    def bundled(self) -> bool:
        return self.command is None

    @property
    def uses_binary(self) -> bool:
        """True when argv[0] is ``{binary}``: the engine runs the active swap release."""
        return self.command is not None and self.command[0] == BINARY_PLACEHOLDER

    @property
    def drain_mode(self) -> DrainMode:
        """``drain`` as configured, or its default for this kind of engine."""
        if self.drain is not None:
            return self.drain
        if self.bundled:
            return "http"
        return "quiet" if self.status_url else "none"

    @property
    def stop_budget(self) -> float:
        """The longest a stop may take before the final SIGKILL: drain, then stop_timeout."""
        return (self.drain_timeout if self.drain_mode != "none" else 0.0) + self.stop_timeout

    @property
    def stop_signum(self) -> signal.Signals:
        return signal.Signals[self.stop_signal]


class Config(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """The whole file. ``path`` is None for the embedded default."""

    supervisor: SupervisorConfig = SupervisorConfig()
    metrics: MetricsConfig = MetricsConfig()
    engine: list[EngineConfig] = msgspec.field(default_factory=list)
    path: str | None = None
    #: set by ``cuzkd run --demo``, never by the file: bundled engines start as demo engines
    demo: bool = False

    @property
    def state_dir(self) -> Path:
        return Path(self.supervisor.state_dir) if self.supervisor.state_dir else default_state_dir()

    @property
    def control_socket(self) -> Path:
        if self.supervisor.control_socket:
            return Path(self.supervisor.control_socket)
        return self.state_dir / "control.sock"

    def engine_command(self, engine: EngineConfig) -> list[str]:
        """argv for ``engine`` (``{binary}`` left in place: resolved at spawn time)."""
        if engine.command is not None:
            return list(engine.command)
        return [sys.executable, "-m", "cuzkd", "engine", "--listen", self._bundled_listen(engine),
                *(["--demo"] if self.demo else [])]

    def status_address(self, engine: EngineConfig) -> str | None:
        """``unix:/path`` (GET /status over the socket) or ``http://host:port/status``; None
        for a ``command`` without ``status_url``, supervised by its process alone."""
        if engine.status_url:
            return engine.status_url
        if not engine.bundled:
            return None
        listen = self._bundled_listen(engine)
        return listen if listen.startswith("unix:") else f"http://{listen}/status"

    def _bundled_listen(self, engine: EngineConfig) -> str:
        if engine.listen:
            return engine.listen
        return f"unix:{self.state_dir / 'engines' / f'{engine.name}.sock'}"


def default_state_dir() -> Path:
    """The directory systemd made for the service (``$STATE_DIRECTORY``, from
    ``StateDirectory=``; a ``DynamicUser=`` service is not root), /var/lib/cuzkd as root, else
    $XDG_STATE_HOME/cuzkd (~/.local/state/cuzkd)."""
    given = os.environ.get("STATE_DIRECTORY", "").split(":")[0]
    if given:
        return Path(given)
    if os.geteuid() == 0:
        return Path("/var/lib/cuzkd")
    xdg = os.environ.get("XDG_STATE_HOME")
    base = Path(xdg) if xdg else Path.home() / ".local" / "state"
    return base / "cuzkd"


def visible_gpu_count(proc_root: Path = Path("/proc/driver/nvidia/gpus")) -> int:
    """GPUs the NVIDIA driver exposes (no CuPy needed in the supervisor)."""
    try:
        return sum(1 for _ in proc_root.iterdir())
    except OSError:
        return 0


def default_engines(gpus: int) -> list[EngineConfig]:
    """One bundled engine per GPU pinned with ``gpus`` (NVML index, PCI bus order like
    /proc/driver/nvidia/gpus), or one CPU engine."""
    if gpus == 0:
        return [EngineConfig(name="cpu0")]
    return [EngineConfig(name=f"gpu{i}", gpus=[str(i)]) for i in range(gpus)]


def default_config() -> Config:
    """The embedded default used when ``cuzkd run`` gets no ``--config``."""
    return Config(engine=default_engines(visible_gpu_count()))


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
        return parse_config({"supervisor": supervisor}, str(path)).control_socket
    except (OSError, ValueError, ConfigError):  # the TOML and UTF-8 errors are ValueErrors
        return Config().control_socket


def load_config(path: str | Path, *, resolve_hosts: bool = True,
                fifo_wait: float | None = None) -> Config:
    """Read, validate and resolve a TOML config file; raise ConfigError naming file and key.

    ``resolve_hosts=False`` skips what only running the daemon needs (the metrics.listen host
    resolving): client commands read the file for the control socket alone, and must keep
    working while DNS does not. ``fifo_wait``: a FIFO is read without blocking in ``open`` and
    must reach its end within that many seconds (a reload's read must end); None waits for a
    writer as ``cat`` does (``--config <(...)``).
    """
    where = str(path)
    try:
        raw = tomllib.loads(_read_config_bytes(path, fifo_wait).decode())
    except TimeoutError:  # an OSError: before the handler below
        raise ConfigError(f"{where}: no writer sent it within {fifo_wait:g}s (a FIFO)") from None
    except FileNotFoundError:
        raise ConfigError(f"{where}: file not found") from None
    except OSError as exc:
        raise ConfigError(f"{where}: cannot read: {exc.strerror}") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{where}: not UTF-8 text (byte {exc.object[exc.start]:#04x} at "
                          f"offset {exc.start}); TOML files must be UTF-8") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{where}: invalid TOML: {exc}") from None
    config = parse_config(raw, where)
    if resolve_hosts:
        try:
            metrics = parse_listen(config.metrics.listen, allow_unix=False)
            _resolve(metrics.host, metrics.port)
        except ValueError as exc:
            raise ConfigError(f"{where}: key `metrics.listen`: {exc}") from None
    return config


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
    _check_deadlines(data.get("metrics"), where)
    for internal in ("path", "demo"):  # fields of Config no file sets
        if internal in data:
            raise ConfigError(f"{where}: key `{internal}`: unknown key")
    defaults = data.pop("engine_defaults", {})
    if not isinstance(defaults, dict):
        raise ConfigError(f"{where}: key `engine_defaults`: expected a table")
    if "name" in defaults:
        raise ConfigError(f"{where}: key `engine_defaults.name`: names must be set per engine")
    # Validate the defaults on their own first so their mistakes name `engine_defaults.*`.
    _convert({"name": "defaults", **defaults}, EngineConfig, where, "engine_defaults")
    engines = data.get("engine", [])
    if isinstance(engines, list):
        data["engine"] = [
            {**defaults, **e} if isinstance(e, dict) else e for e in engines
        ]
    config = _convert(data, Config, where, "")
    if not config.engine:
        config = msgspec.structs.replace(config, engine=default_engines(visible_gpu_count()))
    config = msgspec.structs.replace(config, path=where)
    _check(config, where)
    return config


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


def _check_deadlines(metrics: object, where: str) -> None:
    """Each ``[metrics] proof_deadlines`` value on its own: msgspec names a bad value of a
    table of arbitrary keys only as ``proof_deadlines[...]``, this names its proof kind."""
    deadlines = metrics.get("proof_deadlines") if isinstance(metrics, dict) else None
    if isinstance(deadlines, dict):
        for kind, value in deadlines.items():
            _convert(value, Seconds, where, f"metrics.proof_deadlines.{kind}")


def _convert(data: Any, typ: type[_T], where: str, prefix: str) -> _T:
    try:
        return msgspec.convert(data, typ, dec_hook=_duration_hook)
    except msgspec.ValidationError as exc:
        raise ConfigError(validation.describe(exc, where, prefix)) from None


def _check(config: Config, where: str) -> None:
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
        _check_socket_path(config.control_socket)
    except ValueError as exc:
        raise fail(control_key, str(exc)) from None
    seen: dict[str, int] = {}
    for i, eng in enumerate(config.engine):
        key = f"engine[{i}]"
        if eng.name in seen:
            raise fail(f"{key}.name", f"duplicate engine name {eng.name!r} "
                                      f"(also engine[{seen[eng.name]}])")
        seen[eng.name] = i
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
        address = config.status_address(eng)
        if address is not None and address.startswith("unix:"):
            field = "status_url" if eng.status_url else "listen"
            try:
                _check_socket_path(Path(address.removeprefix("unix:")))
            except ValueError as exc:
                raise fail(f"{key}.{field}", str(exc)) from None
        if eng.stop_signal not in signal.Signals.__members__:
            raise fail(f"{key}.stop_signal", f"unknown signal {eng.stop_signal!r} "
                                             "(use a name such as 'SIGTERM')")
        positive = ("backoff_max", "backoff_reset_after", "start_timeout", "unhealthy_after",
                    "stop_timeout", "drain_timeout", "status_timeout")
        for field in positive:
            if getattr(eng, field) <= 0:
                raise fail(f"{key}.{field}", "must be greater than zero")
        for field in ("health_interval", "backoff_initial"):
            if getattr(eng, field) < MIN_INTERVAL:
                raise fail(f"{key}.{field}", f"{getattr(eng, field):g}s is below the minimum "
                                             f"of {MIN_INTERVAL * 1000:g}ms")
        if eng.backoff_max < eng.backoff_initial:
            raise fail(f"{key}.backoff_max", f"{eng.backoff_max:g}s is less than "
                                             f"backoff_initial ({eng.backoff_initial:g}s)")
        _check_gpus(eng, key, fail)
        if 0 < eng.stall_after < eng.health_interval:
            raise fail(f"{key}.stall_after", f"{eng.stall_after:g}s is shorter than "
                                             f"health_interval ({eng.health_interval:g}s); "
                                             "use '0s' to turn the stall watchdog off")
        if eng.drain_mode != "none" and address is None:
            raise fail(f"{key}.drain", f"{eng.drain_mode!r} needs the engine's status "
                                       "(set status_url, or drain = \"none\")")
        if eng.stop_budget > config.supervisor.shutdown_grace:
            field = "drain_timeout" if eng.drain_mode != "none" else "stop_timeout"
            drain = (f"drain_timeout {eng.drain_timeout:g}s + " if eng.drain_mode != "none"
                     else "")
            raise fail(f"{key}.{field}", f"{drain}stop_timeout {eng.stop_timeout:g}s is more "
                                         f"than supervisor.shutdown_grace "
                                         f"({config.supervisor.shutdown_grace:g}s): a shutdown "
                                         "would SIGKILL the engine before its stop sequence ends")
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


def _check_socket_path(path: Path) -> None:
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
