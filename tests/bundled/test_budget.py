"""The two-phase memory budget: pure accounting, then asynchronous FIFO waiting."""

from __future__ import annotations

import asyncio

import pytest
from support.started import started

from cuzkd.bundled.budget import Ledger, MemoryBudget, Reservation
from cuzkd.errors import BudgetExceededError


def test_ledger_two_phase_release() -> None:
    ledger = Ledger(total_bytes=100)
    ledger.grant("a", Reservation(10, 30))
    assert ledger.used_bytes == 40
    assert ledger.release_synth("a") == 10
    assert ledger.used_bytes == 30
    assert ledger.release("a") == 30
    assert ledger.used_bytes == 0
    assert ledger.release("a") == 0  # idempotent


def test_ledger_fits_and_max_concurrent() -> None:
    ledger = Ledger(total_bytes=100)
    ledger.grant("a", Reservation(10, 40))
    assert ledger.max_concurrent() == 2
    assert ledger.fits(Reservation(10, 40))
    assert not ledger.fits(Reservation(11, 40))
    with pytest.raises(RuntimeError, match="does not fit"):
        ledger.grant("b", Reservation(11, 40))
    with pytest.raises(KeyError):
        ledger.grant("a", Reservation(1, 1))


def test_ledger_rejects_request_larger_than_budget() -> None:
    with pytest.raises(BudgetExceededError, match=r"101 bytes .* whole budget is 100 bytes"):
        Ledger(total_bytes=100).check(Reservation(1, 100))


async def test_acquire_waits_until_release() -> None:
    budget = MemoryBudget(100)
    await budget.acquire("a", 20, 40)
    waiter = await started(budget.acquire("b", 20, 40))
    assert not waiter.done()
    budget.release_synth("a")  # 80 free now: enough
    await asyncio.wait_for(waiter, 1)
    assert budget.used_bytes() == 100
    budget.release("a")
    budget.release("b")
    assert budget.used_bytes() == 0


async def test_waiters_are_served_first_come_first_served() -> None:
    budget = MemoryBudget(100)
    await budget.acquire("a", 0, 100)
    order: list[str] = []

    async def take(key: str, size: int) -> None:
        await budget.acquire(key, 0, size)
        order.append(key)

    big = await started(take("big", 90))
    small = await started(take("small", 10))  # would fit beside "big", must not overtake
    assert order == []
    budget.release("a")
    await asyncio.wait_for(asyncio.gather(big, small), 1)
    assert order == ["big", "small"]


async def test_oversize_request_fails_at_once() -> None:
    budget = MemoryBudget(100)
    await budget.acquire("a", 0, 100)
    with pytest.raises(BudgetExceededError):
        await asyncio.wait_for(budget.acquire("huge", 1, 100), 1)


async def test_cancelled_waiter_holds_nothing_and_unblocks_others() -> None:
    budget = MemoryBudget(100)
    await budget.acquire("a", 0, 60)
    blocked = await started(budget.acquire("big", 0, 80))
    behind = await started(budget.acquire("small", 0, 40))
    assert not behind.done()
    blocked.cancel()
    await asyncio.wait_for(behind, 1)  # the head left; the small one fits now
    assert budget.used_bytes() == 100
    with pytest.raises(asyncio.CancelledError):
        await blocked


def test_pinned_reservations_stay_and_shrink_what_partitions_may_use() -> None:
    ledger = Ledger(total_bytes=100, nominal_request=20)
    ledger.grant(("tables", 0, 10), Reservation(0, 30), pinned=True)
    assert (ledger.used_bytes, ledger.pinned_bytes) == (30, 30)
    assert ledger.release(("tables", 0, 10)) == 0  # pins are not released
    assert ledger.max_concurrent() == 3  # (100 - 30) // 20
    ledger.check(Reservation(20, 50))
    with pytest.raises(BudgetExceededError, match=r"71 bytes .* 100 bytes \(30 of it held by "
                                                  r"cached tables\)"):
        ledger.check(Reservation(21, 50))


async def test_a_waiter_a_pin_made_impossible_fails_instead_of_waiting_forever() -> None:
    budget = MemoryBudget(100)
    await budget.acquire("a", 0, 80)
    pin = await started(budget.acquire("tables", 0, 30, pinned=True))
    waiter = await started(budget.acquire("b", 0, 80))  # fits in 100: it may wait
    assert not pin.done() and not waiter.done()
    budget.release("a")  # the pin is granted; 80 can never fit beside its 30 now
    await asyncio.wait_for(pin, 1)
    with pytest.raises(BudgetExceededError, match="held by cached tables"):
        await asyncio.wait_for(waiter, 1)
    assert budget.used_bytes() == budget.pinned_bytes() == 30
