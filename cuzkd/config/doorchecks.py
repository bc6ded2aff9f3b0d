"""The rules a config with front doors must keep, and what it is accepted with but should hear.

A door stands where Curio dials cuzk, so its mistakes cost proofs or open the host: a cuzk
``--listen`` in the command would route Curio around the door, a world-writable socket takes a
``Prove`` from any local user, a ``hold_timeout`` past Curio's 30 min ``ProveTimeout`` holds
calls Curio has given up on. Each is refused at load (exit 78), naming the file and the key;
what is allowed but weak (a hold shorter than an engine's restart, a hold or retry bound
below one maximal request, a TCP door on every address of the host) is a notice (``Config.notices``,
shown by check-config, logged as ``config_warning``). Where two doors or a door and another
listener of cuzkd meet on one address is the sharing rule's, in :mod:`.cuzkchecks`.
"""

from __future__ import annotations

import grp
import os
from collections.abc import Callable
from pathlib import Path

from cuzkd import validation
from cuzkd.config.addresses import grpc_address, state_dir
from cuzkd.config.checks import check_socket_path
from cuzkd.config.cuzkchecks import is_wildcard
from cuzkd.config.doors import (
    CURIO_PROVE_TIMEOUT,
    HOLD_SLACK,
    MAX_MESSAGE_BYTES,
    default_hold_timeout,
    engine_outage,
    parse_door_address,
    parse_socket_mode,
    plan_doors,
)
from cuzkd.config.schema import DOOR_OFF, Config, DrainMode, EngineConfig
from cuzkd.errors import ConfigError
from cuzkd.units import format_bytes

Fail = Callable[[str, str], ConfigError]


def check_doors(config: Config, where: str) -> None:
    """Each engine's ``door`` and ``[door]``; run before the cuzk checks, whose sharing rule
    reads the door addresses."""

    def fail(key: str, problem: str) -> ConfigError:
        return ConfigError(validation.key_error(where, key, problem))

    for i, eng in enumerate(config.engine):
        _check_engine_door(config, eng, f"engine[{i}]", fail)
    table = config.door
    try:
        mode = parse_socket_mode(table.socket_mode)
    except ValueError as exc:
        raise fail("door.socket_mode", str(exc)) from None
    if mode & 0o002:
        raise fail("door.socket_mode", f"{table.socket_mode!r} is world-writable: any user of "
                                       "the host could send a Prove; give Curio's user the "
                                       "group (\"0660\")")
    if not mode & 0o220:
        raise fail("door.socket_mode", f"{table.socket_mode!r} lets neither the owner nor the "
                                       "group connect (a Unix socket needs write permission)")
    _check_deadline_rules(config, fail)
    for field in ("hold_max_bytes", "hold_timeout", "quarantine"):
        value = getattr(table, field)
        if value is not None and value <= 0:
            raise fail(f"door.{field}", "must be greater than zero")
    too_long = (f"is not below Curio's ProveTimeout ({CURIO_PROVE_TIMEOUT / 60:g} min): Curio "
                "would give up on a held call first; set a shorter one")
    if table.hold_timeout is not None and table.hold_timeout >= CURIO_PROVE_TIMEOUT:
        raise fail("door.hold_timeout", f"{table.hold_timeout:g}s {too_long}")
    for plan in plan_doors(config):
        if plan.hold_timeout >= CURIO_PROVE_TIMEOUT:  # unset, computed from its engines
            raise fail("door.hold_timeout",
                       f"unset, it is {plan.hold_timeout:g}s for the door of engine "
                       f"{plan.name!r} (the longest drain_timeout + start_timeout + "
                       f"backoff_max of its engines + {HOLD_SLACK:g}s), which {too_long}")


def _check_deadline_rules(config: Config, fail: Fail) -> None:
    """A proving allowance leaves its kind's deadline some time to be sent in: one as long as
    the deadline would refuse every call of the kind on arrival."""
    deadlines = config.metrics.deadlines()
    for kind, allowance in config.door.allowances().items():
        if allowance < 0:
            raise fail(f"door.proving_allowance.{kind}", "must not be negative")
        if kind in deadlines and allowance >= deadlines[kind]:
            raise fail(f"door.proving_allowance.{kind}", (
                f"{allowance:g}s is not below the kind's deadline ([metrics] proof_deadlines: "
                f"{deadlines[kind]:g}s): the door would refuse every {kind} call on arrival"))


def _check_engine_door(config: Config, eng: EngineConfig, key: str, fail: Fail) -> None:
    if eng.one_post_at_a_time is not None and not (eng.cuzk or eng.bundled):
        raise fail(f"{key}.one_post_at_a_time", "only for type \"cuzk\" or \"bundled\" (the "
                                                "door's PoSt calls); remove it (from "
                                                "[engine_defaults] too)")
    if eng.door is not None and not (eng.cuzk or eng.bundled):
        raise fail(f"{key}.door", "only for type \"cuzk\" or \"bundled\" (the door relays "
                                  "cuzk's gRPC, which only they serve); remove it (from "
                                  "[engine_defaults] too)")
    if eng.drain_mode == DrainMode.DOOR and not eng.door_on:
        raise fail(f"{key}.drain", "'door' waits for the calls of the engine's front door: "
                                   "only for a type \"cuzk\" or \"bundled\" engine whose door "
                                   "is on (use \"cuzk\" or \"http\" with its door off)")
    if not eng.door_on:
        return
    if eng.door not in (None, "", DOOR_OFF):
        try:
            address = parse_door_address(eng.door)
            if address.is_unix:
                check_socket_path(Path(address.path))
        except ValueError as exc:
            raise fail(f"{key}.door", str(exc)) from None
        engines = Path(os.path.normpath(state_dir(config) / "engines"))
        if address.is_unix and engines in Path(address.path).parents:
            raise fail(f"{key}.door", f"{eng.door!r} is among cuzkd's private engine sockets "
                                      f"({engines}, 0700): Curio could not connect; put the "
                                      "door elsewhere")
    override = eng.cuzk_file.listen_override if eng.cuzk_file is not None else None
    if override is not None:
        raise fail(f"{key}.command", f"passes cuzk --listen {override!r}, but the engine's "
                                     "door is on: cuzkd gives cuzk a private address and "
                                     "takes Curio's calls at the door; remove it (set `door` "
                                     "to move the door) or set door = \"off\"")
    state = state_dir(config)
    if not state.is_absolute():
        raise fail("supervisor.state_dir", f"{str(state)!r} is relative: the "
                                           f"private gRPC socket of engine {eng.name!r} (its "
                                           "door is on) must be unix:///ABSOLUTE")
    private = grpc_address(config, eng)
    if private is None:  # no command, so no cuzk file: the general checks refuse it
        return
    try:
        check_socket_path(Path(private.removeprefix("unix://")))
    except ValueError as exc:
        raise fail("supervisor.state_dir", f"engine {eng.name!r}'s private gRPC {exc}") from None


def check_door_groups(config: Config, where: str) -> None:
    """``door.socket_group`` names a group of this host: only the daemon (and check-config)
    needs it, as with the metrics host, so a client command works where the group is not."""
    group = config.door.socket_group
    if not group or not plan_doors(config):
        return
    try:
        grp.getgrnam(group)
    except KeyError:
        raise ConfigError(validation.key_error(
            where, "door.socket_group", f"no group {group!r} on this host (getent group "
                                        f"{group})")) from None


def door_notices(config: Config, where: str) -> list[str]:
    """What the doors are accepted with but an operator should hear, each naming the key."""
    notices: list[str] = []
    table = config.door
    plans = plan_doors(config)
    for plan in plans:
        index = next(i for i, e in enumerate(config.engine) if e.name == plan.name)
        key = f"engine[{index}].door"
        address = parse_door_address(plan.address)
        if is_wildcard(address):
            notices.append(validation.key_error(
                where, key, f"the door of engine {plan.name!r} at {plan.address!r} listens on "
                            "every address of the host, without TLS or authentication: an "
                            "unauthenticated Prove on a rented IP; listen on 127.0.0.1 or a "
                            "Unix socket (or firewall the port)"))
        engines = [e for e in config.engine if e.name in plan.engines]
        slowest = max(engines, key=engine_outage)
        if table.hold_timeout is not None and table.hold_timeout < engine_outage(slowest):
            notices.append(validation.key_error(
                where, "door.hold_timeout",
                f"{table.hold_timeout:g}s is shorter than engine {slowest.name!r}'s "
                f"drain_timeout + start_timeout + backoff_max ({engine_outage(slowest):g}s): "
                "calls held through a whole restart of it fail UNAVAILABLE (unset, it would "
                f"be {default_hold_timeout(engines):g}s)"))
    for field, consequence in (
            ("hold_max_bytes", "held while no engine can take it: it fails UNAVAILABLE"),
            ("retry_max_bytes", "retried when its engine dies under it")):
        if plans and getattr(table, field) < MAX_MESSAGE_BYTES:
            notices.append(validation.key_error(
                where, f"door.{field}",
                f"{format_bytes(getattr(table, field))} is less than one maximal request "
                f"({format_bytes(MAX_MESSAGE_BYTES)}, cuzk's limit): a request that large is "
                f"not {consequence}"))
    return notices
