"""Where a config puts things: the state dir, the control socket, each engine's door, status
and gRPC addresses, and the argv that hands an engine its own.

Each is derived here, once, from the structs of :mod:`cuzkd.config.schema`, so the schema
stays plain data and every caller (the checks, the door plan, the launch) reads one answer.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from cuzkd.config.schema import Config, EngineConfig


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


def state_dir(config: Config) -> Path:
    """``[supervisor] state_dir``, or :func:`default_state_dir` when unset."""
    given = config.supervisor.state_dir
    return Path(given) if given else default_state_dir()


def control_socket(config: Config) -> Path:
    """``[supervisor] control_socket``, or ``control.sock`` in the state dir when unset."""
    if config.supervisor.control_socket:
        return Path(config.supervisor.control_socket)
    return state_dir(config) / "control.sock"


def door_address(config: Config, engine: EngineConfig) -> str | None:
    """Where ``engine``'s door listens, as Curio dials it (``unix:///PATH`` or
    ``HOST:PORT``); None for an engine without a door."""
    if not engine.door_on:
        return None
    if engine.door:
        return engine.door
    if engine.bundled:
        return f"unix://{state_dir(config) / f'{engine.name}.door.sock'}"
    return engine.cuzk_file.daemon.listen if engine.cuzk_file is not None else None


def engine_command(config: Config, engine: EngineConfig) -> list[str]:
    """argv for ``engine`` (``{binary}`` left in place: resolved at spawn time). An engine
    behind a door gets its private address: a cuzk engine as ``--listen`` (cuzk's flag
    overrides its file's ``[daemon] listen``), before a ``--``, after which cuzk takes no
    options; a bundled one as ``--grpc-listen`` (its ``--listen`` is its HTTP API)."""
    door = door_address(config, engine) is not None
    if engine.command is not None:
        if not door:
            return list(engine.command)
        end = engine.command.index("--", 1) if "--" in engine.command[1:] else None
        head = engine.command[:end]
        return [*head, "--listen", private_grpc_address(config, engine),
                *engine.command[len(head):]]
    return [sys.executable, "-m", "cuzkd", "engine", "--listen", _bundled_listen(config, engine),
            *(["--grpc-listen", private_grpc_address(config, engine)] if door else []),
            *(["--demo"] if config.demo else [])]


def status_address(config: Config, engine: EngineConfig) -> str | None:
    """``unix:/path`` (GET /status over the socket) or ``http://host:port/status``; None
    for a ``command`` without ``status_url``, supervised by its process alone. A cuzk
    engine's comes from its file's ``[daemon] status_listen`` (a wildcard polled over
    loopback), unless ``status_url`` names it (checks make the two agree)."""
    if engine.status_url:
        return engine.status_url
    if engine.cuzk:
        return engine.cuzk_file.status_url if engine.cuzk_file is not None else None
    if not engine.bundled:
        return None
    listen = _bundled_listen(config, engine)
    return listen if listen.startswith("unix:") else f"http://{listen}/status"


def grpc_address(config: Config, engine: EngineConfig) -> str | None:
    """An engine's cuzk gRPC address as the engine binds it (``unix:///path`` or
    ``IP:PORT``): behind a door its private socket in the state dir (passed as
    ``--listen`` or ``--grpc-listen``), else a cuzk engine's ``-l/--listen`` or
    ``[daemon] listen``; None for other engines (a bundled one serves no gRPC then)."""
    if door_address(config, engine) is not None:
        return private_grpc_address(config, engine)
    if not engine.cuzk or engine.cuzk_file is None:
        return None
    return engine.cuzk_file.grpc_listen


def private_grpc_address(config: Config, engine: EngineConfig) -> str:
    """Where an engine behind a door serves cuzk's gRPC: a socket only cuzkd reaches (the
    state dir is the service's alone), so Curio can only reach the engine through the door:
    ``unix://{state_dir}/engines/{name}.grpc.sock``."""
    return f"unix://{state_dir(config) / 'engines' / f'{engine.name}.grpc.sock'}"


def _bundled_listen(config: Config, engine: EngineConfig) -> str:
    """A bundled engine's HTTP API: its ``listen``, else a socket in the state dir."""
    if engine.listen:
        return engine.listen
    return f"unix:{state_dir(config) / 'engines' / f'{engine.name}.sock'}"
