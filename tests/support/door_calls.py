"""Calls and books for the door's book's tests (tests/supervisor/core/test_doorbook*.py): plain
values as the shell would make them, Curio's kinds and priorities."""

from __future__ import annotations

from cuzkd.states import DoorRefusal
from cuzkd.supervisor.core.doorbook import Call, Decision, DoorBook, DoorRules, Refuse, Send

LOW, NORMAL, HIGH, CRITICAL = 1, 2, 3, 4
MiB = 1 << 20
#: The kind Curio sends with each priority: WinningPoSt CRITICAL, WindowPoSt HIGH
CURIO_KINDS = {CRITICAL: "winning-post", HIGH: "window-post"}
#: The shipped deadlines and allowances (WinningPoSt 20 s less 5 s of proving, WindowPoSt
#: 20 min less 2 min)
CURIO_RULES = DoorRules(deadlines={"winning-post": 20.0, "window-post": 1200.0},
                        allowances={"winning-post": 5.0, "window-post": 120.0})


def book(*, hold_timeout: float = 600.0, calls: int = 8, nbytes: int = 100 * MiB,
         retry: int = 60 * MiB, engines: tuple[str, ...] = (),
         rules: DoorRules | None = None) -> DoorBook:
    return DoorBook(hold_timeout=hold_timeout, hold_max_calls=calls, hold_max_bytes=nbytes,
                    retry_max_bytes=retry, engines=engines, rules=rules)


def prove(call_id: int, *, priority: int = NORMAL, size: int = 1000, job: str = "",
          kind: str = "", timeout: float | None = None, request: bytes = b"") -> Call:
    """A Prove as Curio sends it: of the kind its priority goes with, unless ``kind`` says;
    its bytes its own unless ``request`` says."""
    return Call(call_id, "Prove", size, priority, job or f"porep-1000-{call_id}",
                kind or CURIO_KINDS.get(priority, "porep-c2"), timeout,
                request or f"req-{call_id}".encode())


def submit(call_id: int, job: str, *, size: int = 1000, kind: str = "snap-update") -> Call:
    return Call(call_id, "SubmitProof", size, NORMAL, job, kind, request=job.encode())


def await_(call_id: int, job: str) -> Call:
    return Call(call_id, "AwaitProof", 10, 0, job)


def sent(decisions: list[Decision]) -> dict[int, str]:
    return {d.call: d.engine for d in decisions if isinstance(d, Send)}


def refused(decisions: list[Decision]) -> dict[int, DoorRefusal]:
    return {d.call: d.reason for d in decisions if isinstance(d, Refuse)}
