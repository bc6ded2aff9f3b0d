"""The front doors a config asks for: one :class:`DoorPlan` per address Curio dials.

A cuzk engine's door (``[[engine]] door``) is cuzkd's gRPC server at the address Curio already
dials, in front of the engine's private socket (a bundled engine's, which serves cuzk's gRPC
too, when its ``door`` is set or under ``--demo``); ``[door]`` says how every door holds and
retries calls. The door shell (``cuzkd.supervisor.door``) serves what this module plans; the
rules a plan keeps are :mod:`cuzkd.config.doorchecks`'s, run at load, so a plan is built only
from a config that holds them.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from cuzkd.config.addresses import door_address
from cuzkd.config.schema import Config, EngineConfig
from cuzkd.units import ListenAddress, parse_listen

#: cuzk's gRPC message limit each way (a PoRep C1 input is ~51 MB); the door relays as much.
MAX_MESSAGE_BYTES = 128 * 2**20
#: Added to an engine's drain_timeout + start_timeout + backoff_max for the default
#: hold_timeout: the stop's signal and the first answer after the start wait, with room.
HOLD_SLACK = 60.0
#: Curio's ProveTimeout: a call held longer is one Curio has given up on.
CURIO_PROVE_TIMEOUT = 30 * 60.0
#: A host a TCP door may name: an IP literal (``[::1]``) or a DNS name.
_HOST = re.compile(r"^(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9.-]+)$")


@dataclass(frozen=True)
class DoorPlan:
    """One door: where it listens and which engines are behind it, with its bounds."""

    #: as Curio dials it: ``unix:///PATH`` or ``HOST:PORT``
    address: str
    #: the names of the engines behind it, in config order
    engines: tuple[str, ...]
    #: seconds a call may wait in the door for an engine to take it
    hold_timeout: float
    hold_max_calls: int
    hold_max_bytes: int
    #: request bytes kept for a retry after an engine dies under them
    retry_max_bytes: int
    #: a Unix door's socket mode and group ("" = cuzkd's own)
    socket_mode: int
    socket_group: str
    #: proof kind -> seconds from a call's arrival to its deadline ([metrics] proof_deadlines)
    deadlines: Mapping[str, float] = field(default_factory=dict)
    #: proof kind -> seconds its proof may take on an engine ([door] proving_allowance)
    allowances: Mapping[str, float] = field(default_factory=dict)
    #: seconds a poison request's id stays quarantined
    quarantine: float = 3600.0
    #: the engines sent one PoSt at a time (``one_post_at_a_time``)
    one_post: frozenset[str] = frozenset()
    max_message_bytes: int = MAX_MESSAGE_BYTES

    @property
    def name(self) -> str:
        """The door's bounded, readable name (its metrics' ``door`` label): its first
        engine's."""
        return self.engines[0]


def plan_doors(config: Config) -> tuple[DoorPlan, ...]:
    """The doors of ``config``: its engines grouped by door address (as bound: ``./`` and
    ``//`` in a socket path do not make another door), in config order; a door's address is
    spelled as its first engine names it."""
    behind: dict[ListenAddress | str, tuple[str, list[EngineConfig]]] = {}
    for engine in config.engine:
        address = door_address(config, engine)
        if address is not None:
            behind.setdefault(_door_key(address), (address, []))[1].append(engine)
    table = config.door
    return tuple(DoorPlan(
        address=address,
        engines=tuple(e.name for e in engines),
        hold_timeout=(table.hold_timeout if table.hold_timeout is not None
                      else default_hold_timeout(engines)),
        hold_max_calls=table.hold_max_calls,
        hold_max_bytes=table.hold_max_bytes,
        retry_max_bytes=table.retry_max_bytes,
        socket_mode=parse_socket_mode(table.socket_mode),
        socket_group=table.socket_group,
        deadlines=config.metrics.deadlines(),
        allowances=table.allowances(),
        quarantine=table.quarantine,
        one_post=frozenset(e.name for e in engines if e.one_post),
    ) for address, engines in behind.values())


def describe_deadlines(plan: DoorPlan) -> str:
    """The door's deadline calls in words: ``winning-post within 20s (sent by 15s), ...``."""
    if not plan.deadlines:
        return "none: no call is refused for its deadline"
    return ", ".join(
        f"{kind} within {limit:g}s (sent by {limit - plan.allowances.get(kind, 0.0):g}s)"
        for kind, limit in sorted(plan.deadlines.items(), key=lambda item: (item[1], item[0])))


def _door_key(address: str) -> ListenAddress | str:
    """What makes two door addresses one door: the address as bound, or (for an address the
    checks refuse next) its spelling."""
    try:
        return parse_door_address(address)
    except ValueError:
        return address


def engine_outage(engine: EngineConfig) -> float:
    """The longest an engine may take no calls while restarting: its drain, the backoff
    before the new process, the start up to its first answer."""
    return engine.drain_timeout + engine.backoff_max + engine.start_timeout


def default_hold_timeout(engines: list[EngineConfig]) -> float:
    """Long enough to outlast any one of ``engines``' restarts, with :data:`HOLD_SLACK`."""
    return max(engine_outage(e) for e in engines) + HOLD_SLACK


def parse_socket_mode(text: str) -> int:
    """``"0660"`` -> 0o660; ValueError unless an octal permission mode (at most 0o777)."""
    if not re.fullmatch(r"0?[0-7]{3}", text):
        raise ValueError(f"{text!r} is not an octal permission mode such as \"0660\"")
    return int(text, 8)


def parse_door_address(text: str) -> ListenAddress:
    """``unix:///ABSOLUTE/PATH`` (gRPC's spelling, as Curio dials it) or ``HOST:PORT`` with a
    port that is not 0 (Curio could not know it); ValueError otherwise."""
    if text.startswith("unix:"):
        path = text.removeprefix("unix://")
        if not text.startswith("unix://") or not path.startswith("/") or "\0" in path:
            raise ValueError(f"{text!r}: a Unix door is unix:///ABSOLUTE/PATH")
        return ListenAddress(path=os.path.normpath(path))
    host, _, _ = text.rpartition(":")
    try:
        address = parse_listen(text, allow_unix=False)
    except ValueError:
        address = None
    if address is None or not _HOST.match(host) or address.port == 0:
        raise ValueError(f"{text!r} is neither unix:///PATH nor HOST:PORT (a port above 0)")
    return address
