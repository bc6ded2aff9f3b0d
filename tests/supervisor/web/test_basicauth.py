""":class:`BasicAuth` on an event loop, without sockets: real bcrypt rounds (cost 4) in its
thread, a flood of wrong passwords from one address beside a right one from another, and the
users and dummy hash a re-read web config changes.

Where a test needs the queue to stand still while it looks, :func:`gate` gives the loop a
one-thread executor whose thread first waits for an event the test sets: the rounds queue
behind it, and no round ends before the test says so.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import bcrypt
import pytest
from support.tlsfiles import PASSWORD, USER, basic_auth, password_hash, write_web_config
from support.waiting import until

from cuzkd.log.ratelimit import LimitedLog
from cuzkd.supervisor.web.access import WebAccess
from cuzkd.supervisor.web.basicauth import (
    MAX_WAITING,
    PER_SOURCE,
    AuthDecision,
    BasicAuth,
    hash_cost,
)


def _header(password: str = PASSWORD, user: str = USER) -> str:
    return basic_auth(password, user)["Authorization"]


async def test_a_right_password_is_allowed_while_another_address_floods() -> None:
    """Nothing verified yet (a fresh start): 200 distinct wrong passwords from one address
    take its share of places and are throttled beyond it; the right password from another
    address gets a place and its round, and later ones cost none."""
    auth = BasicAuth({USER: password_hash()})
    flood = [asyncio.ensure_future(auth.check(_header(f"guess-{i}"), "192.0.2.66"))
             for i in range(200)]
    await until(lambda: auth.throttled > 0, "the flood throttled beyond its share")
    assert await auth.check(_header(), "192.0.2.1") is AuthDecision.ALLOWED
    verdicts = await asyncio.gather(*flood)
    assert set(verdicts) == {AuthDecision.REFUSED, AuthDecision.THROTTLED}
    # each refused guess had a round, the right one too; the throttled ones none
    assert verdicts.count(AuthDecision.REFUSED) + 1 == auth.bcrypt_rounds
    assert verdicts.count(AuthDecision.THROTTLED) == auth.throttled
    rounds = auth.bcrypt_rounds
    assert await auth.check(_header(), "192.0.2.99") is AuthDecision.ALLOWED  # from the cache
    assert await auth.check(_header("guess-0"), "192.0.2.66") is AuthDecision.REFUSED  # refused
    assert auth.bcrypt_rounds == rounds


@pytest.fixture
async def gate() -> AsyncIterator[threading.Event]:
    """Set it to let the rounds run (see the module)."""
    opened = threading.Event()
    executor = ThreadPoolExecutor(1)
    executor.submit(opened.wait)
    asyncio.get_running_loop().set_default_executor(executor)
    yield opened
    opened.set()
    executor.shutdown(wait=True)


async def test_a_new_address_takes_a_place_from_the_longest_queue(
        gate: threading.Event) -> None:
    """All places taken by sources holding two each: a new address still gets one, and the
    check that lost its place is throttled, not refused."""
    auth = BasicAuth({USER: password_hash()})
    sources = [f"192.0.2.{n}" for n in range(MAX_WAITING // PER_SOURCE + 1)]
    waiting = [asyncio.ensure_future(auth.check(_header(f"{source}-{i}"), source))
               for source in sources for i in range(PER_SOURCE)]
    # one round taken (held at the gate), MAX_WAITING wait: the last source's second is out
    await until(lambda: auth.throttled == 1, "the queue full")
    assert (auth.bcrypt_rounds, auth.waiting) == (1, MAX_WAITING)
    right = asyncio.ensure_future(auth.check(_header(), "198.51.100.1"))
    await until(lambda: auth.throttled == 2, "a place taken for the new address")
    assert auth.waiting == MAX_WAITING
    gate.set()
    assert await right is AuthDecision.ALLOWED
    verdicts = await asyncio.gather(*waiting)
    assert verdicts.count(AuthDecision.THROTTLED) == 2
    assert verdicts.count(AuthDecision.REFUSED) == len(waiting) - 2


async def test_a_check_whose_waiter_went_frees_its_place(gate: threading.Event) -> None:
    """A cancelled request (its client went) leaves the queue at once and its place serves
    another; the round running is not disturbed, and a cancelled check never gets one."""
    auth = BasicAuth({USER: password_hash()})
    first, second, third = (asyncio.ensure_future(auth.check(_header(f"guess-{n}"), "192.0.2.1"))
                            for n in range(3))
    await until(lambda: auth.waiting == PER_SOURCE, "one round taken, two checks waiting")
    assert auth.bcrypt_rounds == 1
    assert await auth.check(_header("guess-x"), "192.0.2.1") is AuthDecision.THROTTLED
    second.cancel()
    await until(lambda: auth.waiting == 1, "the cancelled check's place freed")
    fourth = asyncio.ensure_future(auth.check(_header("guess-4"), "192.0.2.1"))
    await until(lambda: auth.waiting == 2, "the place taken again")
    gate.set()
    assert [await first, await third, await fourth] == [AuthDecision.REFUSED] * 3
    assert second.cancelled()
    assert auth.bcrypt_rounds == 3


async def test_malformed_and_unknown_credentials_are_refused() -> None:
    auth = BasicAuth({USER: password_hash()})
    for header in (None, "Bearer x", "Basic !!!", "Basic " + "bm9jb2xvbg==",
                   _header(PASSWORD, "nobody"), _header("x" * 100)):
        assert await auth.check(header) is AuthDecision.REFUSED, header


async def test_an_unknown_user_is_checked_against_the_highest_cost(tmp_path: Path) -> None:
    """The dummy hash follows the configured costs when the web config is re-read; a changed
    hash is verified anew, an unchanged one is not."""
    path = write_web_config(tmp_path / "web.yml", None, cost=4)
    access = WebAccess(str(path), LimitedLog())
    auth = access.auth
    assert auth is not None and hash_cost(auth.dummy) == 4
    assert await auth.check(_header(), "192.0.2.1") is AuthDecision.ALLOWED
    rounds = auth.bcrypt_rounds
    old_hash = path.read_text().split("'")[1]
    slower = bcrypt.hashpw(b"other", bcrypt.gensalt(6)).decode()
    path.write_text(f"basic_auth_users:\n  {USER}: '{old_hash}'\n  grafana: '{slower}'\n",
                    encoding="utf-8")
    access.refresh()
    assert access.last_reload_ok and access.auth is auth and hash_cost(auth.dummy) == 6
    assert await auth.check(_header(), "192.0.2.1") is AuthDecision.ALLOWED
    assert auth.bcrypt_rounds == rounds  # USER's hash did not change: still verified
    path.write_text(f"basic_auth_users:\n  {USER}: '{password_hash('new', cost=5)}'\n",
                    encoding="utf-8")
    access.refresh()
    assert hash_cost(auth.dummy) == 5
    assert await auth.check(_header(), "192.0.2.1") is AuthDecision.REFUSED  # the old password
    assert await auth.check(_header("new"), "192.0.2.1") is AuthDecision.ALLOWED
    assert auth.bcrypt_rounds == rounds + 2
