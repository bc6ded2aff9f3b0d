"""The upgrade's steps in-process, through its seams (the new program, the hand-over, the
listeners, the log): what is refused changes nothing, what is accepted is answered whole
before the exec, the exec happens with every signal blocked, and an exec that fails leaves the
supervisor as it was. The real exec is ``test_upgrade_e2e.py``'s."""

from __future__ import annotations

import signal
import subprocess
import sys
from collections.abc import Sequence
from typing import Any

import msgspec
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from cuzkd import __version__
from cuzkd.metrics.carry import CarriedSample
from cuzkd.states import Phase
from cuzkd.supervisor.core.handover import FORMAT, Handover, Listeners, Locks, Verdict, decode
from cuzkd.supervisor.core.phase import SupervisorPhase
from cuzkd.supervisor.daemon.upgrade import Upgrader

DROPPED = CarriedSample("cuzkd_log_lines_dropped", "cuzkd_log_lines_dropped_total",
                        {"reason": "upgrade"}, 2.0)


class Program:
    """A new program: its dry run's verdict, and an exec that fails (as a vanished file's)."""

    def __init__(self, verdict: Verdict) -> None:
        self.name = "/usr/local/bin/cuzkd"
        self.verdict = verdict
        self.checked: list[Handover] = []
        self.replaced: list[tuple[Handover, list[int], bool]] = []

    async def check(self, handover: bytes, timeout: float) -> Verdict:
        self.checked.append(decode(handover))
        return self.verdict

    def replace(self, handover: bytes, keep: Sequence[int]) -> OSError:
        blocked = signal.SIGTERM in signal.pthread_sigmask(signal.SIG_BLOCK, [])
        self.replaced.append((decode(handover), list(keep), blocked))
        return FileNotFoundError(2, "No such file or directory")


class Notifier:
    def __init__(self) -> None:
        self.sent: list[str] = []

    def send(self, *fields: str) -> None:
        self.sent.extend(fields)

    def reloading(self) -> None:
        self.sent.append("RELOADING=1")


class Shell:
    """What the supervisor gives the upgrader, recorded."""

    def __init__(self, refusal: str | None = None) -> None:
        self.refusal = refusal
        self.held: list[str] = []
        self.on_quiesce: Any = None
        #: the hand-over taken for the exec (the second) fails with this
        self.breaks: Exception | None = None
        self._taken = 0

    def refuse(self, phase: Phase) -> str | None:
        return self.refusal if phase is Phase.RUNNING else f"the supervisor is {phase}"

    async def handover(self, upgrade_id: str, mask: list[int]) -> Handover:
        self._taken += 1
        if self._taken == 2 and self.breaks is not None:
            raise self.breaks
        return Handover(format=FORMAT, version=__version__, upgrade_id=upgrade_id,
                        config_text="", config_path="/etc/cuzkd/cuzkd.toml", demo=False,
                        signal_mask=mask, handed_at=0.0, frozen_seconds=0.0, freezes=0,
                        started_at=0.0, reload_ok=True, reload_success_at=0.0,
                        locks=Locks(3, 4), listeners=Listeners(5, [6]), engines=[], door=None,
                        samples=[DROPPED])

    async def quiesce(self, within: float) -> None:
        self.held.append("held")
        if self.on_quiesce is not None:
            self.on_quiesce()

    async def resume(self) -> None:
        self.held.append("accepting")


def upgrader(verdict: Verdict, shell: Shell) -> tuple[Upgrader, SupervisorPhase, Program,
                                                      Notifier]:
    phase = SupervisorPhase(started_at=0.0)
    phase.started()
    program, notifier = Program(verdict), Notifier()
    up = Upgrader(phase, notifier, program, refusal=shell.refuse, handover=shell.handover,
                  quiesce=shell.quiesce, resume=shell.resume, flush_log=lambda bound: 3,
                  status_line=lambda: "STATUS=2 engines running")
    return up, phase, program, notifier


async def post(up: Upgrader, body: dict[str, Any] | None = None) -> tuple[int, Any]:
    app = web.Application()
    up.routes()(app)
    async with TestClient(TestServer(app)) as client:
        resp = await client.post("/v1/upgrade", json=body or {})
        answer = (resp.status, await resp.json())
        last = await (await client.get("/v1/upgrade")).json()
    return answer[0], {"answer": answer[1], "last": last["last"]}


OK = Verdict(True, "2.0.0")


async def test_a_moment_the_gate_refuses_changes_nothing_and_asks_no_program() -> None:
    up, phase, program, notifier = upgrader(OK, Shell(refusal="engine a is stopping"))
    status, body = await post(up)
    assert status == 409 and "engine a is stopping" in body["answer"]["error"]
    assert (program.checked, program.replaced, notifier.sent) == ([], [], [])
    assert phase.phase is Phase.RUNNING and body["last"] is None


async def test_a_program_that_refuses_the_handover_changes_nothing() -> None:
    up, phase, program, notifier = upgrader(Verdict(False, "0.9", "format 2 only"), Shell())
    status, body = await post(up)
    assert status == 422
    assert body["answer"]["error"] == "upgrade refused by the new program: format 2 only"
    assert len(program.checked) == 1 and program.replaced == [] and notifier.sent == []
    assert phase.phase is Phase.RUNNING


async def test_check_asks_the_program_and_nothing_more() -> None:
    shell = Shell()
    up, phase, program, notifier = upgrader(OK, shell)
    status, body = await post(up, {"check": True})
    assert notifier.sent == []
    assert status == 200
    assert body["answer"] | {"id": "-"} == {"id": "-", "old": __version__, "new": "2.0.0",
                                            "program": "/usr/local/bin/cuzkd", "check": True}
    assert program.replaced == [] and shell.held == [] and phase.phase is Phase.RUNNING


async def test_an_accepted_upgrade_execs_with_signals_blocked_and_a_failed_exec_undoes_it(
) -> None:
    shell = Shell()
    up, phase, program, notifier = upgrader(OK, shell)
    status, body = await post(up)
    assert status == 202 and body["answer"]["new"] == "2.0.0"
    [(handover, keep, blocked)] = program.replaced
    assert blocked, "signals blocked across the exec"
    assert handover.upgrade_id == body["answer"]["id"]
    assert sorted(keep) == [3, 4, 5, 6]
    assert handover.samples == [msgspec.structs.replace(DROPPED, value=5.0)]  # 3 unwritten
    assert signal.SIGTERM not in signal.pthread_sigmask(signal.SIG_BLOCK, [])
    # the exec failed: the old code runs on, accepting again, READY=1 again
    assert shell.held == ["held", "accepting"]
    assert notifier.sent == ["RELOADING=1", "READY=1", "STATUS=2 engines running"]
    assert phase.phase is Phase.RUNNING
    assert body["last"]["outcome"] == "failed" and "No such file" in body["last"]["error"]


async def test_a_stop_during_the_wait_refuses_at_the_last_moment() -> None:
    shell = Shell()
    up, phase, program, notifier = upgrader(OK, shell)
    shell.on_quiesce = phase.stop
    status, body = await post(up)
    assert status == 202
    assert program.replaced == [] and "RELOADING=1" not in notifier.sent
    assert body["last"]["outcome"] == "refused"
    assert body["last"]["error"] == "the supervisor is stopping"
    assert phase.phase is Phase.STOPPING
    assert signal.SIGTERM not in signal.pthread_sigmask(signal.SIG_BLOCK, [])


async def test_whatever_breaks_with_signals_blocked_leaves_the_old_code_running() -> None:
    shell = Shell()
    shell.breaks = RuntimeError("a scrape's sample failed")
    up, phase, program, notifier = upgrader(OK, shell)
    status, body = await post(up)
    assert status == 202 and program.replaced == []
    assert body["last"]["outcome"] == "failed"
    assert body["last"]["error"] == "RuntimeError: a scrape's sample failed"
    assert signal.SIGTERM not in signal.pthread_sigmask(signal.SIG_BLOCK, [])
    assert shell.held == ["held", "accepting"] and phase.phase is Phase.RUNNING
    assert notifier.sent == ["READY=1", "STATUS=2 engines running"]


@pytest.mark.parametrize("body", [b"{", b"[1]", b'{"check": "yes"}'])
async def test_a_body_that_is_not_the_request_is_a_400_and_changes_nothing(body: bytes) -> None:
    up, phase, program, notifier = upgrader(OK, Shell())
    app = web.Application()
    up.routes()(app)
    async with TestClient(TestServer(app)) as client:
        resp = await client.post("/v1/upgrade", data=body,
                                 headers={"Content-Type": "application/json"})
        assert resp.status == 400
        assert "error" in await resp.json()
    assert program.checked == [] and notifier.sent == [] and phase.phase is Phase.RUNNING


@pytest.fixture(autouse=True)
def _mask_restored() -> Any:
    before = signal.pthread_sigmask(signal.SIG_BLOCK, [])
    yield
    signal.pthread_sigmask(signal.SIG_SETMASK, before)


@pytest.mark.parametrize(("args", "said"), [
    (["--handover", "77"], "no hand-over to read in descriptor 77"),
    (["--handover-check", "garbage"], "expected DOC:ANSWER"),
    (["--handover-check", "77:78"], "cannot answer on descriptor 78")])
def test_the_exec_options_given_garbage_say_so_and_exit_1(args: list[str], said: str) -> None:
    """``run --handover``/``--handover-check`` are the upgrade's own, never typed: given
    what is not a hand-over they still end with a line that says why, not a traceback."""
    done = subprocess.run([sys.executable, "-m", "cuzkd", "run", *args], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 1
    assert said in done.stderr and "Traceback" not in done.stderr, done.stderr
