"""The reload in-process: stand-in engines, a real config file, a real sd_notify socket.

:class:`~cuzkd.supervisor.daemon.reload.ConfigReloader` runs on an ordinary event loop (the file is
read on a thread, which a virtual clock would not wait for); the engines are stand-ins spawned
through the real child table, so a reload's stops and spawns take microseconds. The end-to-end
reload tests (real processes, real SIGHUP, systemd's notify-reload) stay in
``test_reload.py``, ``test_notify.py`` and ``tests/live_systemd``.
"""

from __future__ import annotations

import asyncio
import socket
from dataclasses import dataclass, field
from pathlib import Path

import structlog
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from support.tlsfiles import write_web_config
from support.virtual_engines import Script, StandInEngines, engine_set, running_phase

from cuzkd.config import demo_config, load_config, plan_doors
from cuzkd.httperrors import json_errors
from cuzkd.log.ratelimit import LimitedLog
from cuzkd.states import Phase, State
from cuzkd.supervisor.core.phase import SupervisorPhase
from cuzkd.supervisor.daemon.notify import Notifier
from cuzkd.supervisor.daemon.reload import ConfigReloader, ReloadOutcome
from cuzkd.supervisor.engines.engineset import EngineSet
from cuzkd.supervisor.web.access import WebAccess


def write_config(path: Path, *names: str) -> None:
    lines = [f'[supervisor]\nstate_dir = "{path.parent / "state"}"\n']
    # start_timeout bounds the second a process-only engine must live to count as running
    lines += [f'[[engine]]\nname = "{n}"\ncommand = ["stand-in"]\nstart_timeout = "100ms"\n'
              for n in names]
    path.write_text("\n".join(lines))


def received(sock: socket.socket) -> list[str]:
    messages = []
    while True:
        try:
            messages.append(sock.recv(4096).decode())
        except BlockingIOError:
            return messages


@dataclass
class Rig:
    """An engine set of stand-ins run from ``config_path``, the supervisor's phase
    (``running``) and its reloader, which records each applied engine list in ``applied``."""

    config_path: Path
    notifier: Notifier = field(default_factory=lambda: Notifier({}))
    #: run as ``cuzkd run --demo`` does
    demo: bool = False
    phase: SupervisorPhase = field(default_factory=running_phase)
    engines: StandInEngines = field(init=False)
    group: EngineSet = field(init=False)
    reloader: ConfigReloader = field(init=False)
    applied: list[list[str]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.engines = StandInEngines(Script())
        config = load_config(self.config_path)
        self.group = engine_set(demo_config(config) if self.demo else config,
                                self.engines.table, phase=self.phase)
        self.reloader = ConfigReloader(
            self.group, self.phase, self.notifier, status_line=lambda: "STATUS=test",
            on_applied=lambda: self.applied.append(self.group.names()))

    async def close(self) -> None:
        await self.group.stop_all(30)
        await self.group.close()


def test_a_reload_applies_a_good_file_refuses_a_bad_one_and_tells_systemd(
        tmp_path: Path) -> None:
    config_path = tmp_path / "cuzkd.toml"
    write_config(config_path, "a", "b")
    notify_path = tmp_path / "notify.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as notify:
        notify.bind(str(notify_path))
        notify.setblocking(False)

        async def main() -> None:
            rig = Rig(config_path, Notifier({"NOTIFY_SOCKET": str(notify_path)}))
            rig.group.start_all()
            b = rig.group.runner("b")
            await b.wait_for(lambda: b.state is State.RUNNING)

            config_path.write_bytes(b"[[engine]]\nname = 7\n\xff")  # not TOML, not UTF-8
            await rig.reloader.reload()
            assert not rig.phase.reload_ok and rig.group.names() == ["a", "b"]
            assert not rig.applied and rig.phase.phase is Phase.RUNNING
            refused = received(notify)
            assert refused[0].startswith("RELOADING=1\nMONOTONIC_USEC=")
            assert refused[1].startswith("READY=1\nSTATUS=")

            write_config(config_path, "a", "c")
            await rig.reloader.reload()
            assert rig.phase.reload_ok and rig.applied == [["a", "c"]]
            assert b.state is State.STOPPED and rig.engines.spawned[1].signals
            assert [m.split("\n")[0] for m in received(notify)] == ["RELOADING=1", "READY=1"]

            rig.phase.stop()
            write_config(config_path, "a")
            await rig.reloader.reload()
            assert rig.group.names() == ["a", "c"] and received(notify) == []
            await rig.close()

        asyncio.run(main())


def test_a_storm_of_reloads_during_one_makes_one_more_not_one_each(tmp_path: Path) -> None:
    config_path = tmp_path / "cuzkd.toml"
    write_config(config_path, "a")

    async def main() -> tuple[list[list[str]], set[ReloadOutcome]]:
        rig = Rig(config_path)
        write_config(config_path, "a", "b")
        # the first takes the lock and reads; the second waits for it; the other 48 join the
        # second, which reads the file as it is after the first
        outcomes = await asyncio.gather(*(rig.reloader.reload() for _ in range(50)))
        await rig.close()
        return rig.applied, set(outcomes)

    applied, outcomes = asyncio.run(main())
    assert applied == [["a", "b"], ["a", "b"]]
    assert outcomes == {ReloadOutcome(None, ("a", "b"))}  # each caller hears how its ended


def test_the_reload_route_answers_once_the_file_is_applied_or_refused(tmp_path: Path) -> None:
    """``POST /v1/reload`` (what ``cuzkd reload`` and the unit's ExecReload call): 200 with the
    engines once applied, 422 naming the file and key when refused, 409 while stopping or
    starting."""
    config_path = tmp_path / "cuzkd.toml"
    write_config(config_path, "a")

    async def main() -> None:
        rig = Rig(config_path)
        app = web.Application(middlewares=[json_errors])
        rig.reloader.routes()(app)
        async with TestClient(TestServer(app)) as client:
            write_config(config_path, "a", "b")
            resp = await client.post("/v1/reload")
            assert (resp.status, await resp.json()) == (200, {"applied": True,
                                                              "engines": ["a", "b"]})
            assert rig.group.names() == ["a", "b"]  # already applied when the answer came

            config_path.write_text(config_path.read_text() + '[[engine]]\nname = "a"\n')
            resp = await client.post("/v1/reload")
            body = await resp.json()
            assert resp.status == 422 and body["error"].startswith("reload refused: ")
            assert "duplicate engine name" in body["error"] and "engine[2].name" in body["error"]
            assert rig.group.names() == ["a", "b"]

            rig.phase.stop()
            resp = await client.post("/v1/reload")
            assert resp.status == 409
            assert (await resp.json())["error"] == "reload refused: the supervisor is stopping"
        await rig.close()

        write_config(config_path, "a")
        starting = Rig(config_path, phase=SupervisorPhase(started_at=0.0))
        app = web.Application(middlewares=[json_errors])
        starting.reloader.routes()(app)
        async with TestClient(TestServer(app)) as client:  # engines spawned from the file
            resp = await client.post("/v1/reload")
            assert resp.status == 409
            assert (await resp.json())["error"] == ("reload refused: the supervisor is still "
                                                    "starting")
        await starting.close()

    asyncio.run(main())


def test_a_reload_logs_the_files_old_kind_names_naming_file_and_key(tmp_path: Path) -> None:
    config_path = tmp_path / "cuzkd.toml"
    write_config(config_path, "a")

    async def main() -> list[dict[str, object]]:
        rig = Rig(config_path)
        config_path.write_text('[metrics]\nproof_deadlines = { winning = "15s" }\n'
                               + config_path.read_text())
        with structlog.testing.capture_logs() as logs:
            assert (await rig.reloader.reload()).error is None
        await rig.close()
        return [e for e in logs if e["event"] == "config_warning"]

    warnings = asyncio.run(main())
    assert len(warnings) == 1
    detail = str(warnings[0]["detail"])
    assert detail.startswith(f"{config_path}: key `metrics.proof_deadlines.winning`: ")
    assert "'winning-post'" in detail


def test_a_reload_with_a_broken_web_config_is_refused_and_the_listener_keeps_its_own(
        tmp_path: Path) -> None:
    """``[metrics] web_config`` gone bad (a hash that is not bcrypt): the reload is refused
    naming the web config's key, and the listener's settings stay the last good ones."""
    web_config = write_web_config(tmp_path / "web.yml", None)
    config_path = tmp_path / "cuzkd.toml"
    write_config(config_path, "a")
    config_path.write_text(f'[metrics]\nweb_config = "{web_config}"\n'
                           + config_path.read_text())

    async def main() -> None:
        rig = Rig(config_path)
        access = WebAccess(str(web_config), LimitedLog())
        users = access.web.basic_auth_users
        web_config.write_text("basic_auth_users:\n  prometheus: hunter2\n")
        outcome = await rig.reloader.reload()
        assert outcome.error is not None
        assert "web.yml: key `basic_auth_users.prometheus`: not a bcrypt hash" in outcome.error
        assert "hunter2" not in outcome.error
        assert not rig.phase.reload_ok
        access.refresh()
        assert not access.last_reload_ok and access.web.basic_auth_users == users
        await rig.close()

    asyncio.run(main())


def test_a_reload_that_would_move_an_engine_out_of_its_door_is_refused(tmp_path: Path) -> None:
    """The doors are bound once, before the engines start: an engine a reload moved behind a
    door nobody serves would listen where no caller reaches it, one moved out of its door
    would leave Curio's calls held for nothing. Refused, naming why; a change of the doors'
    bounds alone is applied at the next start (a partial reload)."""
    cuzk_toml = tmp_path / "cuzk.toml"
    cuzk_toml.write_text(f'[daemon]\nlisten = "unix://{tmp_path}/curio.sock"\n'
                         'status_listen = "127.0.0.1:1"\n')
    config_path = tmp_path / "cuzkd.toml"

    def write(door: str, door_table: str = "") -> None:
        config_path.write_text(
            f'[supervisor]\nstate_dir = "{tmp_path}/state"\n{door_table}'
            f'[[engine]]\nname = "cz"\ntype = "cuzk"\ncommand = ["stand-in", "-c", '
            f'"{cuzk_toml}"]\ndoor = "{door}"\n')

    async def main() -> tuple[ReloadOutcome, ReloadOutcome, list[dict[str, object]]]:
        write("")
        rig = Rig(config_path, Notifier({}))
        write("off")
        moved = await rig.reloader.reload()
        write("", "[door]\nhold_max_calls = 5\n")
        with structlog.testing.capture_logs() as logs:
            bounds = await rig.reloader.reload()
        await rig.close()
        return moved, bounds, logs

    moved, bounds, logs = asyncio.run(main())
    assert moved.error is not None and "front doors" in moved.error
    assert f"unix://{tmp_path}/curio.sock (cz)" in moved.error
    assert bounds.error is None
    assert [e["detail"] for e in logs if e["event"] == "supervisor_reload_partial"] == [
        "the front doors' bounds ([door]) change at the next start"]


def test_a_reload_under_demo_keeps_the_doors_the_demo_added(tmp_path: Path) -> None:
    """``--demo`` puts each bundled engine behind a door the file does not name: a reload
    reads the file as ``--demo`` does, so it finds the same doors and is applied (not refused
    as moving the engine out of its door)."""
    config_path = tmp_path / "cuzkd.toml"
    config_path.write_text(f'[supervisor]\nstate_dir = "{tmp_path}/state"\n'
                           '[[engine]]\nname = "b0"\n')

    async def main() -> tuple[ReloadOutcome, Rig]:
        rig = Rig(config_path, demo=True)
        outcome = await rig.reloader.reload()
        await rig.close()
        return outcome, rig

    outcome, rig = asyncio.run(main())
    assert outcome.error is None and rig.applied == [["b0"]]
    config = rig.group.config
    assert config.demo and [(d.address, d.engines) for d in plan_doors(config)] == [
        (f"unix://{tmp_path}/state/b0.door.sock", ("b0",))]
