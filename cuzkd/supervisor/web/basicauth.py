"""Basic auth against a web config's ``basic_auth_users``: bcrypt once, then a cached digest.

:class:`BasicAuth` decides a request's credentials cheapest first: a password already verified
for its user is allowed at once, with no bcrypt round and no queue, so Prometheus' scrapes are
answered however many wrong passwords wait; one already refused is refused at once; anything
else waits in a :class:`~.fairqueue.FairQueue` for a bcrypt round, run one at a time in a thread.
A request that gets no place is :attr:`AuthDecision.THROTTLED`, answered 429 and never 401,
since its password was not checked. An unknown user is checked against :func:`dummy_hash` so
timing does not tell which users exist. No password or hash is ever logged. See
docs/operations.md, *TLS and basic auth on the metrics listener*.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import enum
import hashlib
import hmac
import os
from collections.abc import Hashable, Iterable, Mapping
from dataclasses import dataclass, field

import bcrypt

from cuzkd.supervisor.web.authcache import Refused, Verified
from cuzkd.supervisor.web.fairqueue import FairQueue

#: Requests that may wait for a bcrypt round, from all addresses together.
MAX_WAITING = 8
#: Of those, how many one address may hold (see :mod:`.fairqueue`).
PER_SOURCE = 2
#: bcrypt's least cost, the dummy's when no user has a hash (never the case in practice).
MIN_COST = 4
#: The 31 characters of a bcrypt hash after its salt: the digest (see :func:`dummy_hash`).
_DIGEST_CHARS = 31


class AuthDecision(enum.Enum):
    """What :meth:`BasicAuth.check` decided."""

    ALLOWED = "allowed"
    #: no, malformed or wrong credentials, or an unknown user (401)
    REFUSED = "refused"
    #: not checked: too many checks already wait for a round from its address (429)
    THROTTLED = "throttled"


def hash_cost(hashed: bytes) -> int:
    """The cost of a bcrypt hash, ``$2b$12$...`` -> 12 (the web config's loader has checked
    the form)."""
    return int(hashed[4:6])


def dummy_hash(hashes: Iterable[bytes]) -> bytes:
    """A hash no password matches, of the highest cost among ``hashes``.

    checkpw's time is the key setup of the stored salt's cost, whatever digest follows it; so
    the dummy is a fresh salt of that cost and a digest of zeros, made in microseconds: no
    hashing, so it can be made again on the event loop whenever a re-read web config changes
    the users. (A password whose hash under that salt is all zeros would match: 1 in 2**184.)
    """
    cost = max((hash_cost(hashed) for hashed in hashes), default=MIN_COST)
    return bcrypt.gensalt(rounds=cost, prefix=b"2b") + b"." * _DIGEST_CHARS


@dataclass(eq=False)
class _Check:
    """A password waiting for, or in, its bcrypt round; ``verdict`` is bcrypt's (True: it
    matches), or None when its place in the queue was taken (:data:`AuthDecision.THROTTLED`)."""

    password: bytes
    hashed: bytes
    verdict: asyncio.Future[bool | None] = field(repr=False)


class BasicAuth:
    """``users`` (user -> bcrypt hash) checked against ``Authorization`` headers."""

    def __init__(self, users: Mapping[str, str]) -> None:
        self._key = os.urandom(32)
        self._verified = Verified()
        self._refused = Refused()
        self._queue: FairQueue[_Check] = FairQueue(MAX_WAITING, PER_SOURCE)
        self._running = False
        self.bcrypt_rounds = 0
        #: requests not checked because their address had its share of places (429)
        self.throttled = 0
        self.replace_users(users)

    @property
    def waiting(self) -> int:
        """Checks waiting for a round (not the one running)."""
        return len(self._queue)

    def replace_users(self, users: Mapping[str, str]) -> None:
        """A (re-read) file's users: verified passwords stay valid while their hash does, and
        the dummy hash takes the highest cost among the new hashes."""
        self._users = {user: hashed.encode() for user, hashed in users.items()}
        self._verified.keep_only(self._users)
        self.dummy = dummy_hash(self._users.values())

    async def check(self, header: str | None, source: Hashable = "") -> AuthDecision:
        """The verdict on ``header`` (an ``Authorization`` value) sent from ``source`` (the
        client's address, the unit of fairness)."""
        credentials = _credentials(header)
        if credentials is None:
            return AuthDecision.REFUSED
        user, password = credentials
        hashed = self._users.get(user)
        digest = self._digest(password)
        if self._verified.holds(user, hashed, digest):
            return AuthDecision.ALLOWED
        refusal = self._digest(b"\0".join((user.encode(), hashed or b"", password)))
        if refusal in self._refused:
            return AuthDecision.REFUSED
        ok = await self._round(source, password, hashed or self.dummy)
        if ok is None:
            return AuthDecision.THROTTLED
        if ok and hashed is not None:
            self._verified.remember(user, hashed, digest)
            return AuthDecision.ALLOWED
        self._refused.add(refusal)
        return AuthDecision.REFUSED

    async def _round(self, source: Hashable, password: bytes, hashed: bytes) -> bool | None:
        """bcrypt's verdict on ``password`` after waiting for a round in ``source``'s queue;
        None when it got no place or lost it."""
        loop = asyncio.get_running_loop()
        check = _Check(password, hashed, loop.create_future())
        admission = self._queue.admit(source, check)
        if admission.evicted is not None:
            self.throttled += 1
            if not admission.evicted.verdict.done():
                admission.evicted.verdict.set_result(None)
        if not admission.admitted:
            self.throttled += 1
            return None
        self._next_round(loop)
        try:
            return await check.verdict
        finally:
            self._queue.discard(source, check)  # cancelled while waiting: free its place

    def _next_round(self, loop: asyncio.AbstractEventLoop) -> None:
        """Start the next waiting check's round unless one runs. The round's end (not its
        waiter, which may have been cancelled) starts the next, so one runs at a time."""
        if self._running:
            return
        check = self._queue.take()
        while check is not None and check.verdict.done():  # its waiter went
            check = self._queue.take()
        if check is None:
            return
        self._running = True
        self.bcrypt_rounds += 1
        done = loop.run_in_executor(None, _checkpw, check.password, check.hashed)

        def finished(round_: asyncio.Future[bool]) -> None:
            self._running = False
            if not check.verdict.done():
                if round_.cancelled():
                    check.verdict.cancel()
                elif (exc := round_.exception()) is not None:
                    check.verdict.set_exception(exc)
                else:
                    check.verdict.set_result(round_.result())
            self._next_round(loop)

        done.add_done_callback(finished)

    def _digest(self, data: bytes) -> bytes:
        return hmac.new(self._key, data, hashlib.sha256).digest()


def _checkpw(password: bytes, hashed: bytes) -> bool:
    """bcrypt's verdict; a password bcrypt refuses to hash (over 72 bytes) is a wrong one, as
    it is to Go's bcrypt."""
    try:
        return bcrypt.checkpw(password, hashed)
    except ValueError:
        return False


def _credentials(header: str | None) -> tuple[str, bytes] | None:
    """(user, password) of a ``Basic`` header, None when it is missing or malformed."""
    if header is None:
        return None
    scheme, _, encoded = header.partition(" ")
    if scheme.lower() != "basic":
        return None
    try:
        decoded = base64.b64decode(encoded.strip(), validate=True)
    except (binascii.Error, ValueError):
        return None
    user, colon, password = decoded.partition(b":")
    if not colon:
        return None
    try:
        return user.decode(), password
    except UnicodeDecodeError:
        return None
