"""The supervisor's configuration: TOML in, typed and fully validated structs out.

Everything an operator can get wrong is caught before any engine starts: unknown keys, wrong
types, duplicate names and impossible values all raise :class:`~cuzkd.errors.ConfigError` naming
the file, the key and the problem. Four modules, one job each: :mod:`.schema` (the structs,
their defaults, the placeholder constants), :mod:`.addresses` (the addresses, paths and engine
argv the structs imply), :mod:`.loading` (reading the file safely -- size cap, FIFO -- and
decoding it, its errors turned into messages) and :mod:`.checks` (the rules between fields); a
cuzk engine's own TOML has :mod:`.cuzkfile` (reading it as cuzk does) and :mod:`.cuzkchecks`
(its rules), its front door :mod:`.doors` (the plan, :func:`.plan_doors`) and :mod:`.doorchecks`
(its rules). This front names what the rest of cuzkd uses.
"""

from cuzkd.config.addresses import (
    control_socket,
    door_address,
    engine_command,
    grpc_address,
    state_dir,
    status_address,
)
from cuzkd.config.doors import DoorPlan, describe_deadlines, plan_doors
from cuzkd.config.loading import (
    config_from_text,
    control_socket_despite_errors,
    demo_config,
    load_config,
    load_or_default,
    parse_config,
)
from cuzkd.config.schema import (
    BINARY_PLACEHOLDER,
    START_WAIT_SLACK,
    Config,
    EngineConfig,
    SupervisorConfig,
    default_config,
)

__all__ = [
    "BINARY_PLACEHOLDER",
    "START_WAIT_SLACK",
    "Config",
    "DoorPlan",
    "EngineConfig",
    "SupervisorConfig",
    "config_from_text",
    "control_socket",
    "control_socket_despite_errors",
    "default_config",
    "demo_config",
    "describe_deadlines",
    "door_address",
    "engine_command",
    "grpc_address",
    "load_config",
    "load_or_default",
    "parse_config",
    "plan_doors",
    "state_dir",
    "status_address",
]
