"""The shutdown waits on nothing unbounded: a restart the shutdown overtakes returns, and the
servers close within what is left of ``shutdown_grace`` whatever their handlers do.

Once, a swap's engine restart waited for a spawn the shutdown had called off, the swap's
request handler waited on the swap, and aiohttp waited 60 s for the handler and 60 s more for it
to end cancelled: 126 s with the state dir locked. The whole case with real processes is in
tests/swap/test_shutdown.py.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from aiohttp import ClientTimeout, web
from support.virtual_clock import run_virtual
from support.virtual_engines import (
    Script,
    StandInEngines,
    config_of,
    engine_set,
    in_state,
    running_phase,
)

from cuzkd.cli.control_client import BASE_URL, control_session
from cuzkd.log.ratelimit import LimitedLog
from cuzkd.states import State
from cuzkd.supervisor.engines.runclock import RunClock
from cuzkd.supervisor.web.servers import Servers


def test_a_restart_that_the_shutdown_overtakes_returns(tmp_path: Path) -> None:
    async def main() -> tuple[str | None, int]:
        engines = StandInEngines(Script(ignores_stop=True))
        group = engine_set(config_of(tmp_path, {"name": "e", "stop_timeout": "10s"}),
                           engines.table, clock=RunClock(asyncio.get_running_loop().time))
        group.start_all()
        runner = group.runner("e")
        await in_state(runner, State.RUNNING)
        restart = asyncio.ensure_future(group.restart_engine("e", swap=True))  # as a swap does
        await in_state(runner, State.STOPPING)
        await group.stop_all(grace=30)  # the shutdown: the stop wins, no spawn follows
        await asyncio.wait_for(restart, 1)  # on virtual time: fails at once if it waits on
        problem = await group.wait_running("e")
        await group.close()
        return problem, len(engines.spawned)

    problem, spawned = run_virtual(main)
    assert spawned == 1
    assert problem is not None and problem.startswith("did not start: engine is stopped")


def test_the_servers_close_within_the_time_given_whatever_the_handlers_do(
        tmp_path: Path) -> None:
    """One handler never ends, another swallows its cancellation: close() still returns."""
    async def main() -> float:
        entered: list[str] = []
        both_in, release = asyncio.Event(), asyncio.Event()

        def enter(name: str) -> None:
            entered.append(name)
            if len(entered) == 2:
                both_in.set()

        async def endless(request: web.Request) -> web.Response:
            enter("endless")
            await asyncio.Event().wait()
            raise AssertionError("never")

        async def obstinate(request: web.Request) -> web.Response:
            enter("obstinate")
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                await release.wait()  # refuses to end until the test is done
            return web.Response()

        app = web.Application()
        app.router.add_get("/endless", endless)
        app.router.add_get("/obstinate", obstinate)
        servers = Servers(LimitedLog())
        sock = tmp_path / "control.sock"
        await servers.start(app, sock, web.Application(), "127.0.0.1:0", lambda: 64)
        async with control_session(sock, ClientTimeout(total=None)) as session:
            requests = [asyncio.ensure_future(session.get(f"{BASE_URL}/{path}"))
                        for path in ("endless", "obstinate")]
            await both_in.wait()
            loop = asyncio.get_running_loop()
            began = loop.time()
            await asyncio.wait_for(servers.close(within=1.0), 30)
            took = loop.time() - began
            release.set()
            await asyncio.gather(*requests, return_exceptions=True)
        return took

    took = asyncio.run(main())
    assert took < 3  # about 1 s (half to end, half to end cancelled); aiohttp's default: 120 s


def test_a_reload_the_shutdown_overtakes_starts_no_engine(tmp_path: Path) -> None:
    """``POST /v1/reload`` still stopping a changed engine when SIGTERM comes: once that stop
    ends, neither the changed engine nor an added one may start behind the shutdown's back."""
    async def main() -> tuple[int, list[State]]:
        engines = StandInEngines(Script(ignores_stop=True))
        phase = running_phase()
        group = engine_set(config_of(tmp_path, {"name": "e", "stop_timeout": "10s"}),
                           engines.table, phase=phase,
                           clock=RunClock(asyncio.get_running_loop().time))
        group.start_all()
        await in_state(group.runner("e"), State.RUNNING)
        new = config_of(tmp_path, {"name": "e", "stop_timeout": "9s"}, {"name": "added"})
        reload = asyncio.ensure_future(group.apply(new))
        await in_state(group.runner("e"), State.STOPPING)
        phase.stop()  # the first stop signal
        await group.stop_all(grace=30)
        await reload
        states = [group.runner(n).state for n in group.names()]
        await group.stop_all(grace=30)
        await group.close()
        return len(engines.spawned), states

    spawned, states = run_virtual(main)
    assert spawned == 1 and states == [State.STOPPED, State.STOPPED]
