"""The rules a ``type = "cuzk"`` engine's own TOML must keep, alone and beside cuzkd's config.

cuzk takes mistakes quietly: ``/status`` off by default, a budget it cannot parse becomes
50 GiB, a ``[gpus] devices`` left empty means every GPU ``nvidia-smi`` lists. cuzkd is the
one place that can say so before the engine starts, so each of these is refused here, in
``check-config``, ``run`` and every reload, naming cuzk's file and key and what to set.
:func:`cuzk_warnings` lists what is allowed but worth saying (a wildcard status listener): the
loader adds them to `Config.notices`.
"""

from __future__ import annotations

import ipaddress
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from cuzkd.config.addresses import control_socket, door_address
from cuzkd.config.checks import check_socket_path
from cuzkd.config.cuzkfile import CuzkFile, cuzk_size
from cuzkd.config.doors import parse_door_address
from cuzkd.config.schema import Config, EngineConfig
from cuzkd.errors import ConfigError
from cuzkd.units import ListenAddress, parse_listen

#: What the refusals suggest for ``[daemon] status_listen``: loopback, not exposed.
SUGGESTED_STATUS_LISTEN = "127.0.0.1:9821"

Fail = Callable[[str, str], ConfigError]


def cuzk_file_error(path: str, key: str, problem: str, engine: str) -> str:
    """A problem in a cuzk file: ``PATH: key `k` (the cuzk_config of ENGINE): problem``."""
    return f"{_cuzk_key(path, key, engine)}: {problem}"


def _cuzk_key(path: str, key: str, engine: str) -> str:
    where = f"{path}: key `{key}`" if key else path
    return f"{where} (the cuzk_config of {engine})"


def check_cuzk_engines(config: Config, where: str) -> None:
    """Each cuzk engine's file on its own, then the rules between engines. Run before the
    general checks: those read the status address, which a bad file leaves unset."""
    for i, eng in enumerate(config.engine):
        if eng.cuzk_config and not eng.cuzk:
            raise ConfigError(f"{where}: key `engine[{i}].cuzk_config`: only for type \"cuzk\"")
        if eng.cuzk_file is not None:
            _check_engine(eng, eng.cuzk_file, where, i)
    _check_budgets(config, where)
    _check_shared_addresses(config, where)


def cuzk_warnings(config: Config) -> list[str]:
    """What a cuzk engine's file allows but an operator should hear, at start and reload."""
    return [f"engine {eng.name!r}: {eng.cuzk_file.path}: [daemon] status_listen "
            f"{eng.cuzk_file.daemon.status_listen!r} listens on every address of the host: "
            "anyone who reaches it reads the job ids (miner and sector numbers); polled over "
            f"loopback (set {SUGGESTED_STATUS_LISTEN!r} to keep it local)"
            for eng in config.engine
            if eng.cuzk_file is not None and eng.cuzk_file.status_wildcard]


def _check_engine(eng: EngineConfig, cuzk: CuzkFile, where: str, index: int) -> None:
    """Engine ``index`` of the cuzkd config ``where``, whose cuzk file is ``cuzk``."""

    def fail(key: str, problem: str) -> ConfigError:  # a key of cuzk's file
        return ConfigError(cuzk_file_error(cuzk.path, key, problem, f"{where}: engine[{index}]"))

    def fail_engine(key: str, problem: str) -> ConfigError:  # a key of the engine's table
        return ConfigError(f"{where}: key `engine[{index}].{key}`: {problem}")

    status_listen = cuzk.daemon.status_listen
    if not status_listen:
        raise fail("daemon.status_listen", "is empty or missing: cuzk then serves no /status "
                                           "and cuzkd cannot see its work; set status_listen = "
                                           f"\"{SUGGESTED_STATUS_LISTEN}\" under [daemon]")
    try:
        parse_listen(status_listen, allow_unix=False)
    except ValueError as exc:
        raise fail("daemon.status_listen", f"{exc}; cuzk would run without /status") from None
    try:
        socket_path = _grpc_socket_path(cuzk.grpc_listen)
        if socket_path is not None:
            check_socket_path(Path(socket_path))
    except ValueError as exc:
        if cuzk.listen_override is not None:
            raise fail_engine("command", f"cuzk --listen: {exc}") from None
        raise fail("daemon.listen", str(exc)) from None
    _check_budget_spelling(cuzk, fail)
    _check_gpus_agree(eng, cuzk, fail)
    if eng.status_url and (problem := _status_url_disagreement(eng.status_url, status_listen)):
        raise fail_engine("status_url", f"{eng.status_url!r} {problem} {cuzk.path}'s [daemon] "
                                        f"status_listen {status_listen!r}; drop status_url "
                                        "(cuzkd reads it from there) or make them agree")


def _grpc_socket_path(listen: str) -> str | None:
    """The socket path of ``unix:///path``, None for ``IP:PORT``; ValueError for what cuzk
    refuses (it exits 1): ``unix:/path`` with one slash, a host name, no port."""
    if listen.startswith("unix:"):
        path = listen.removeprefix("unix://")
        if not listen.startswith("unix://") or not path.startswith("/"):
            raise ValueError(f"{listen!r}: cuzk wants unix:///ABSOLUTE/PATH")
        return path
    host, sep, port = listen.rpartition(":")
    try:
        ipaddress.ip_address(host.removeprefix("[").removesuffix("]"))
    except ValueError:
        host = ""
    if not sep or not host or not (port.isascii() and port.isdigit()) or int(port) > 65535:
        raise ValueError(f"{listen!r} is neither unix:///PATH nor IP:PORT (cuzk resolves no "
                         "host names here and would exit with an error)")
    return None


def _check_budget_spelling(cuzk: CuzkFile, fail: Fail) -> None:
    memory = cuzk.memory
    spelling = "write \"auto\" or a whole number with GiB, MiB, GB or MB (\"256GiB\")"
    if memory.total_budget != "auto":
        size = cuzk_size(memory.total_budget)
        if size is None:
            raise fail("memory.total_budget", f"{memory.total_budget!r} is not a size cuzk reads "
                                              f"(it would silently use 50 GiB); {spelling}")
        if size == 0:
            raise fail("memory.total_budget", "is 0 bytes: cuzk could prove nothing")
    elif cuzk_size(memory.safety_margin) is None:
        raise fail("memory.safety_margin", f"{memory.safety_margin!r} is not a size cuzk reads "
                                           "(with total_budget \"auto\" it would silently "
                                           "keep 50 GiB back); write a whole number with GiB, "
                                           "MiB, GB or MB (\"5GiB\")")


def _check_gpus_agree(eng: EngineConfig, cuzk: CuzkFile, fail: Fail) -> None:
    """cuzkd's ``gpus`` and cuzk's ``[gpus] devices`` must name the same nvidia-smi indices.

    cuzk picks its GPUs by index itself (``devices``, or every GPU ``nvidia-smi`` lists,
    which ignores CUDA_VISIBLE_DEVICES), so cuzkd's ``gpus`` cannot narrow them: "agree" is
    the same set of indices. With ``gpus`` empty cuzkd watches no GPU and nothing is compared.
    """
    if not eng.gpus:
        return
    devices = sorted(cuzk.gpus.devices)
    wanted = sorted(int(gpu) for gpu in eng.gpus if gpu.isascii() and gpu.isdigit())
    if len(wanted) != len(eng.gpus):
        raise fail("gpus.devices", f"cannot be compared with the engine's gpus {eng.gpus}: give "
                                   "the engine NVML indices (\"0\"), which cuzk's devices are")
    if not devices:
        raise fail("gpus.devices", f"is unset, so cuzk takes every GPU nvidia-smi lists, not "
                                   f"the engine's gpus {eng.gpus}; set devices = {wanted}")
    if devices != wanted:
        raise fail("gpus.devices", f"{devices} disagrees with the engine's gpus {eng.gpus}; "
                                   "cuzk uses its devices (nvidia-smi indices): make them the "
                                   "same")


def _status_url_disagreement(url: str, status_listen: str) -> str | None:
    """How an explicit ``status_url`` misses cuzk's status listener, or None if it reaches it
    (same port, same host or a wildcard listener, a path cuzk answers: ``/status...``)."""
    if not url.startswith("http://"):
        return "is not http://, the only way to reach"
    parts = urlsplit(url)
    listener = parse_listen(status_listen, allow_unix=False)
    if parts.port != listener.port:
        return f"has port {parts.port}, not the port {listener.port} of"
    if not is_wildcard(listener) and parts.hostname != listener.host:
        return f"has host {parts.hostname!r}, not the host {listener.host!r} of"
    if not parts.path.startswith("/status"):
        return f"has path {parts.path!r} (cuzk answers only /status) for"
    return None


def _check_budgets(config: Config, where: str) -> None:
    """At most one cuzk engine on ``total_budget = "auto"``: each would claim all the RAM,
    and running out of memory is cuzk's main failure."""
    auto = [(i, eng.cuzk_file) for i, eng in enumerate(config.engine)
            if eng.cuzk_file is not None and eng.cuzk_file.memory.total_budget == "auto"]
    if len(auto) > 1:
        (first, first_file), (second, second_file) = auto[:2]
        raise ConfigError(cuzk_file_error(
            second_file.path, "memory.total_budget",
            f"\"auto\" (cuzk's default) here and in {first_file.path} (engine[{first}]): each "
            "cuzk would budget all of the host's RAM; give each engine an explicit share "
            "(\"200GiB\")", f"{where}: engine[{second}]"))


#: What a door may not share an address with but another cuzk engine's door: the gRPC listen
#: of a cuzk engine with door = "off", a bundled engine's listen or door (a bundled engine's
#: door is its own), a process or http engine's status_url.
_ENGINE_ROLES = frozenset({"grpc", "engine", "served", "bundled_door"})


@dataclass(frozen=True)
class _Bound:
    """An address something in the config binds, and who: for the one sharing rule."""

    owner: str
    address: ListenAddress
    #: "door": a front door (cuzk engines naming the very same one share it); "grpc": a cuzk
    #: engine's own gRPC listen (its door off); "engine": a bundled engine's listen;
    #: "bundled_door": a bundled engine's door (never shared);
    #: "served": a process or http engine's status_url (cuzkd binds nothing there, but a door
    #: on it would take that engine's port); "": any other listener
    role: str = ""


def _check_shared_addresses(config: Config, where: str) -> None:
    """No two listeners on one address: cuzk engines' ``listen`` (or their doors) and
    ``status_listen``, the bundled engines' explicit ``listen``, cuzkd's own
    ``metrics.listen`` and control socket; and no door where an engine serves its status.
    A wildcard host takes its port on every address.
    (The default sockets in the state dir are one per engine name, names are unique.)

    The one exception: cuzk engines whose doors name the same address share that door (one
    DoorPlan, :func:`cuzkd.config.doors.plan_doors`). Only the very same address: a wildcard
    door and a loopback one on its port would be two servers on one port.
    """
    bound = list(_bound_addresses(config, where))
    for j, later in enumerate(bound):
        for earlier in bound[:j]:
            roles = {earlier.role, later.role}
            if not _overlap(earlier.address, later.address) or (
                    "served" in roles and "door" not in roles):
                continue
            if roles == {"door"}:
                if earlier.address == later.address:
                    continue  # one door, several engines behind it
                raise ConfigError(f"{later.owner}: overlaps the door address of "
                                  f"{earlier.owner} (a wildcard host takes its port on every "
                                  "address): engines share a door only at the very same "
                                  "address; give both the same one, or each its own")
            if "door" in roles and roles & _ENGINE_ROLES:
                raise ConfigError(f"{later.owner}: on the address of {earlier.owner}, and one "
                                  "of them is a front door: a door is shared only by type "
                                  "\"cuzk\" engines whose doors are all on (a cuzk engine with "
                                  "door = \"off\" binds it itself); give each its own address")
            raise ConfigError(f"{later.owner}: binds the address {earlier.owner} binds; "
                              "give each its own")


def _bound_addresses(config: Config, where: str) -> Iterator[_Bound]:
    """What binds where; an address the general checks refuse next is left out here."""
    try:
        metrics = parse_listen(config.metrics.listen, allow_unix=False)
    except ValueError:
        metrics = None  # not an address: the general checks, which run next, say so
    if metrics is not None:
        yield _Bound(f"{where}: key `metrics.listen`", metrics)
    control_key = ("supervisor.control_socket" if config.supervisor.control_socket
                   else "supervisor.state_dir")
    yield _Bound(f"{where}: key `{control_key}` (the control socket)",
                 ListenAddress(path=os.path.normpath(control_socket(config))))
    for i, eng in enumerate(config.engine):
        cuzk = eng.cuzk_file
        if eng.bundled and eng.listen and (listen := _listen_address(eng.listen)):
            yield _Bound(f"{where}: key `engine[{i}].listen`", listen, "engine")
        if not eng.cuzk and not eng.bundled and (served := _served_address(eng.status_url)):
            yield _Bound(f"{where}: key `engine[{i}].status_url`", served, "served")
        if eng.bundled and (door := door_address(config, eng)) is not None:
            yield _Bound(f"{where}: key `engine[{i}].door`", parse_door_address(door),
                         "bundled_door")
        if cuzk is None:
            continue
        engine = f"{where}: engine[{i}]"
        yield _Bound(_cuzk_key(cuzk.path, "daemon.status_listen", engine),
                     parse_listen(cuzk.daemon.status_listen, allow_unix=False))
        door = door_address(config, eng)
        if door is not None:
            owner = (f"{where}: key `engine[{i}].door`" if eng.door else
                     f"{_cuzk_key(cuzk.path, 'daemon.listen', engine)}, the door's address")
            yield _Bound(owner, parse_door_address(door), "door")
            continue
        owner = (f"{where}: key `engine[{i}].command` (cuzk --listen)"
                 if cuzk.listen_override is not None
                 else _cuzk_key(cuzk.path, "daemon.listen", engine))
        yield _Bound(owner, _grpc_address(cuzk.grpc_listen), "grpc")


def _served_address(url: str) -> ListenAddress | None:
    """The ``HOST:PORT`` a process or http engine's ``status_url`` reaches (None: none, or
    no port)."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        return None
    if not parts.hostname or port is None:
        return None
    return ListenAddress(host=parts.hostname, port=port)


def _grpc_address(listen: str) -> ListenAddress:
    """cuzk's gRPC address as a :class:`ListenAddress` (a checked one)."""
    socket_path = _grpc_socket_path(listen)
    return (ListenAddress(path=os.path.normpath(socket_path)) if socket_path is not None
            else parse_listen(listen, allow_unix=False))


def _listen_address(listen: str) -> ListenAddress | None:
    """A bundled engine's ``listen`` as bound; None for what is no address (the general
    checks, which run next, say so)."""
    try:
        address = parse_listen(listen)
    except ValueError:
        return None
    return ListenAddress(path=os.path.normpath(address.path)) if address.is_unix else address


def _overlap(a: ListenAddress, b: ListenAddress) -> bool:
    if a.path or b.path:
        return a.path == b.path
    return a.port == b.port and (a.host == b.host or is_wildcard(a) or is_wildcard(b))


def is_wildcard(address: ListenAddress) -> bool:
    """True for a TCP address on every address of the host."""
    return address.host in ("0.0.0.0", "::")
