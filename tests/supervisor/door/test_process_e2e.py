"""The door process, end to end: a real ``cuzkd run`` with the cuzk stand-in behind its door,
the door in a process of its own.

Killed under load, the door process costs only the calls on its connections: the socket stays
the supervisor's (no connection is refused while the next door process starts), the engine is
not touched, and the door's counters carry on. A frozen supervisor costs no call. Every wait is
on an event, never a sleep.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.cuzk_caller import Caller
from support.cuzk_harness import cuzk_engine
from support.door_under_test import Door
from support.supervisor_harness import start_supervisor, write_config
from support.waiting import wait_until

#: a PoRep C2 in ~0.3 s
KNOBS = {"CUZK_STANDIN_SYNTH_SECS": "0.25", "CUZK_STANDIN_GPU_SECS": "0.02"}


@pytest.fixture(scope="module")
def door(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Door]:
    tmp = tmp_path_factory.mktemp("doorprocess")
    table, address = cuzk_engine(tmp, "cz", env=KNOBS, door="", backoff_initial="100ms",
                                 stop_timeout="1s", drain_timeout="5s")
    sup = start_supervisor(write_config(tmp, [table], supervisor={"shutdown_grace": "5s"}))
    try:
        yield Door(tmp, sup, address)
    finally:
        sup.stop()


def door_process(door: Door) -> dict[str, object]:
    out = subprocess.run([sys.executable, "-m", "cuzkd", "door", "--json", "--config",
                          str(door.sup.config)], capture_output=True, text=True, timeout=30)
    return json.loads(out.stdout)["process"] if out.returncode == 0 else {}


def test_a_killed_door_process_costs_only_the_calls_on_its_connections(door: Door) -> None:
    engine = door.running()
    wait_until(lambda: door_process(door).get("ready"), 30, "the door process serving")
    pid = int(door_process(door)["pid"])  # type: ignore[call-overload]
    caller = Caller(door.address)  # no wait_for_ready: a refused connect fails its call
    caller.start()
    try:
        wait_until(lambda: caller.completed() >= 3, 30, "proofs through the door")
        proved = door.metric("cuzkd_door_proofs_total")
        os.kill(pid, signal.SIGKILL)
        wait_until(lambda: door_process(door).get("pid") not in (None, pid)
                   and door_process(door).get("ready"), 30, "the next door process")
        done = caller.completed()
        wait_until(lambda: caller.completed() >= done + 3, 30, "proofs after it")
    finally:
        caller.finish()
    # the call in flight on the killed process's connection, and one the caller sent on it
    # before it saw it close: then every call completes on a new connection
    outcomes = "".join("C" if o == "COMPLETED" else "F" for o in caller.outcomes)
    assert re.fullmatch(r"C+F{1,2}C+", outcomes), caller.outcomes
    failed = [o for o in caller.outcomes if o != "COMPLETED"]
    assert all(o.startswith("UNAVAILABLE: Stream removed") for o in failed), failed
    assert door.running() == engine, "the engine was touched"
    assert door.metric("cuzkd_door_proofs_total") >= proved  # counters carry on
    assert door.metric("cuzkd_door_process_restarts_total") == 1
    assert door.metric("cuzkd_door_process_exits_total", cause="signal_SIGKILL") == 1
    assert door.sup.events("door_process_exited", cause="signal_SIGKILL")
    text = door.cli("status")
    assert f"door process: pid {door_process(door)['pid']}" in text and "restarts 1" in text


def test_a_frozen_supervisor_costs_no_call(door: Door) -> None:
    """cuzkd stopped (SIGSTOP) for as long as three proofs take: the door process serves on
    with the engines as they stood, and once cuzkd runs again nothing was restarted."""
    engine = door.running()
    door_pid = door_process(door)["pid"]
    caller = Caller(door.address)
    caller.start()
    try:
        wait_until(lambda: caller.completed() >= 1, 30, "a proof before the freeze")
        door.sup.proc.send_signal(signal.SIGSTOP)
        try:
            done = caller.completed()
            wait_until(lambda: caller.completed() >= done + 3, 30, "proofs while cuzkd is frozen")
        finally:
            door.sup.proc.send_signal(signal.SIGCONT)
        done = caller.completed()
        wait_until(lambda: caller.completed() >= done + 1, 30, "a proof after it")
    finally:
        caller.finish()
    assert set(caller.outcomes) == {"COMPLETED"}, caller.outcomes
    assert door.running() == engine
    assert door_process(door)["pid"] == door_pid


def test_the_door_process_ends_with_cuzkd_and_leaves_nothing(door: Door) -> None:
    """Last: it ends the module's supervisor."""
    pid = int(door_process(door)["pid"])  # type: ignore[call-overload]
    assert door.sup.stop() == 0
    assert not Path(f"/proc/{pid}").exists() or "Z" in Path(f"/proc/{pid}/stat").read_text()
    assert door.sup.events("door_process_exited")
