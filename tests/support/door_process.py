"""The door process as the in-process tests start it: a :class:`Doors` on a real child table
(the reaper installed on the test's loop), its door process a real one."""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import tempfile
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

from cuzkd.config.doors import DoorPlan
from cuzkd.config.schema import DoorConfig
from cuzkd.supervisor.door.doors import Doors, server_limits
from cuzkd.supervisor.door.inherited import Inherited
from cuzkd.supervisor.proc.children import ChildTable


def door_plan(address: str, *, engines: tuple[str, ...] = ("cz",)) -> DoorPlan:
    """A door at ``address`` with small bounds."""
    return DoorPlan(address=address, engines=engines, hold_timeout=60.0, hold_max_calls=8,
                    hold_max_bytes=1 << 20, retry_max_bytes=1 << 20, socket_mode=0o660,
                    socket_group="")


@contextlib.asynccontextmanager
async def running_doors(plans: Sequence[DoorPlan], *, passed: Sequence[Inherited] = (),
                        door: DoorConfig | None = None) -> AsyncIterator[Doors]:
    """``plans``' doors started (their sockets bound, their door process spawned, its channel
    in a fresh directory), closed at the end."""
    children = ChildTable()
    children.install(asyncio.get_running_loop())
    state = Path(tempfile.mkdtemp(prefix="cuzkd-door-"))
    doors = Doors(plans, asyncio.get_running_loop().time, server_limits(door or DoorConfig()),
                  children=children, channel=state / "channel.sock", passed=passed)
    try:
        await doors.start()
        yield doors
    finally:
        await doors.close(0)
        children.uninstall()
        shutil.rmtree(state, ignore_errors=True)
