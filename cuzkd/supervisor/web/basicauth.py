"""Basic auth against a web config's ``basic_auth_users``: bcrypt once, then a cached digest.

A bcrypt round costs ~60 ms at cost 10 and ~240 ms at cost 12 (bcrypt's default) -- more than
cuzkd's whole scrape. Prometheus sends the same credentials with every scrape, so a password
bcrypt accepted is remembered as an HMAC of it under a key drawn at start (never the password
itself), one per configured user, and later requests are compared with
:func:`hmac.compare_digest` (constant time): a scrape costs no bcrypt round. The entry holds
the hash it was verified against, so a changed hash in a re-read file is verified anew.

bcrypt runs in a thread (it releases the GIL: the event loop, the engines' polls and the other
scrapes go on), one round at a time. A flood of wrong passwords therefore costs one core at
most; a wrong password already refused is refused again from a bounded cache, and at most
:data:`MAX_WAITING` requests wait for a round.

**When the queue is full** a new request must not simply be refused: the flooder would keep
every place, and a fresh cuzkd (an empty cache, after a restart) would refuse Prometheus's
right password for as long as the flood lasts. Requests are grouped by where they come from
(:func:`source`), then by the user they name. A newcomer whose source has at least two fewer
requests waiting than the source with the most takes the place of that source's newest request
(of its user with the most waiting), which is answered 401 without a round; within its own
source, a newcomer whose user has at least two fewer waiting than the user with the most takes
that user's newest place the same way; otherwise the newcomer is refused. A flooder is thus
refused its newest requests, not the honest caller's: a place is taken only from a group at
least two heavier than the newcomer's, so a caller with one request waiting is never displaced.
The next round goes to the source with the fewest requests waiting (then to its user with the
fewest, then to the oldest request): the honest caller's request is checked next, or after
the few of other sources as light as its own, not behind the flood's. The groups are counted
over the waiting requests only: whatever an attacker sends (random user names, any number of
addresses), the state is the queue of :data:`MAX_WAITING` and the two bounded caches.

Source first, user second: the user is public (Prometheus's job names it) and an attacker can
name the real one, while its address is what it can least choose (loopback's addresses but
127.0.0.1 count as one source, an IPv6 /64 as one). The user's name is grouped as sent, known
or not, so admission tells nothing about which users exist. What this cannot tell apart: a
flood from the honest caller's own source (the same address, or the same /64), and one spread
over :data:`MAX_WAITING` or more sources at once.

An unknown user is checked against a hash of the highest cost among the configured users'
(recomputed when the file is re-read), so it takes as long as the slowest known user: timing
does not tell which users exist (give every user the same cost, or the cheaper ones stand out).
No password or hash is ever logged: the caller logs that a request was refused.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import hashlib
import hmac
import ipaddress
import os
from collections import Counter
from dataclasses import dataclass

import bcrypt

#: Requests that may wait for a bcrypt round (besides the one in it).
MAX_WAITING = 8
#: Wrong credentials remembered (then forgotten all at once: an attacker's distinct guesses
#: must not grow memory).
MAX_REFUSED = 1024
#: The cost of the unknown user's hash when no user is configured (bcrypt's usual 10).
DEFAULT_COST = 10
#: Salt and digest of a real bcrypt hash, behind the cost an unknown user is checked at: bcrypt
#: spends that cost on it and refuses every password (no hashing needed to make one).
_NO_USER_TAIL = b"EbsZMJd5..xbRZiXnTqTme82QFTlDw0HVIBSj56aYe8znqWs0iRoK"
#: Loopback's sources: a local client connects from 127.0.0.1 or ::1; every other address of
#: 127.0.0.0/8 (any process can bind one) is one source, so they cannot each count as one.
_LOOPBACK = ipaddress.ip_address("127.0.0.1")
_OTHER_LOOPBACK = "127.0.0.0/8"


@dataclass(eq=False)
class _Check:
    """A request waiting for a bcrypt round."""

    source: str
    user: str
    password: bytes
    hashed: bytes
    #: whether ``hashed`` is the user's (False: the unknown user's)
    known: bool
    #: its HMAC in the cache of refused credentials
    refusal: bytes
    verdict: asyncio.Future[bool]


class BasicAuth:
    """``users`` (user -> bcrypt hash) checked against ``Authorization`` headers."""

    def __init__(self, users: dict[str, str]) -> None:
        self._key = os.urandom(32)
        #: user -> (the hash verified against, HMAC of the password bcrypt accepted)
        self._verified: dict[str, tuple[bytes, bytes]] = {}
        self._users: dict[str, bytes] = {}
        self.no_user_hash = b""
        self.replace_users(users)
        #: HMACs of (user, hash, password) bcrypt refused
        self._refused: set[bytes] = set()
        self._queue: list[_Check] = []
        self._worker: asyncio.Task[None] | None = None
        self.bcrypt_rounds = 0
        #: requests answered 401 without a round because MAX_WAITING were already waiting
        #: (refused on arrival, or displaced by a lighter source's or user's request)
        self.busy_refused = 0
        #: of those, waiting requests displaced by a newcomer
        self.displaced = 0

    def replace_users(self, users: dict[str, str]) -> None:
        """A re-read file's users; verified passwords stay valid while their hash does, and
        the unknown user's hash takes the highest cost among theirs."""
        self._users = {user: hashed.encode() for user, hashed in users.items()}
        self._verified = {user: entry for user, entry in self._verified.items()
                          if user in self._users}
        self.no_user_hash = no_user_hash(max(map(bcrypt_cost, self._users.values()),
                                             default=DEFAULT_COST))

    @property
    def waiting(self) -> int:
        """Requests waiting for a round now."""
        return len(self._queue)

    async def allows(self, header: str | None, peer: str | None = None) -> bool:
        """Whether ``header`` (an ``Authorization`` value) names a user with its password;
        ``peer``: the client's address, which groups its requests when many wait."""
        credentials = _credentials(header)
        if credentials is None:
            return False
        user, password = credentials
        hashed = self._users.get(user)
        digest = self._digest(password)
        cached = self._verified.get(user)
        if cached is not None and cached[0] == hashed \
                and hmac.compare_digest(cached[1], digest):
            return True
        refusal = self._digest(b"\0".join((user.encode(), hashed or b"", password)))
        if refusal in self._refused:
            return False
        check = _Check(source(peer), user, password, hashed or self.no_user_hash,
                       hashed is not None, refusal, asyncio.get_running_loop().create_future())
        if not self._admit(check):
            self.busy_refused += 1
            return False
        if self._worker is None:
            self._worker = asyncio.create_task(self._work())
        try:
            return await check.verdict
        except asyncio.CancelledError:  # the client went away: its place is freed
            with contextlib.suppress(ValueError):
                self._queue.remove(check)
            raise

    def _admit(self, check: _Check) -> bool:
        """Queue ``check`` if there is room, or in the place of a heavier group's newest
        request (module docstring); False: refused."""
        if len(self._queue) < MAX_WAITING:
            self._queue.append(check)
            return True
        victim = _displaced(self._queue, check)
        if victim is None:
            return False
        self._queue.remove(victim)
        victim.verdict.set_result(False)
        self.busy_refused += 1
        self.displaced += 1
        self._queue.append(check)
        return True

    async def _work(self) -> None:
        """One round at a time while requests wait, the lightest group's first."""
        check: _Check | None = None
        try:
            while self._queue:
                check = _next(self._queue)
                self._queue.remove(check)
                if check.verdict.done():
                    continue
                self.bcrypt_rounds += 1
                ok = await asyncio.to_thread(_checkpw, check.password, check.hashed)
                self._settle(check, ok)
        finally:
            self._worker = None
            for left in (check, *self._queue):  # only when cancelled or bcrypt failed oddly
                if left is not None and not left.verdict.done():
                    left.verdict.set_result(False)
            self._queue.clear()

    def _settle(self, check: _Check, ok: bool) -> None:
        ok = ok and check.known
        if ok:
            self._verified[check.user] = (check.hashed, self._digest(check.password))
        else:
            if len(self._refused) >= MAX_REFUSED:
                self._refused.clear()
            self._refused.add(check.refusal)
        if not check.verdict.done():
            check.verdict.set_result(ok)

    def _digest(self, data: bytes) -> bytes:
        return hmac.new(self._key, data, hashlib.sha256).digest()


def _next(waiting: list[_Check]) -> _Check:
    """The request served next: of the source with the fewest waiting, of its user with the
    fewest, the oldest -- a flood's own requests wait behind everyone else's."""
    by_source = Counter(c.source for c in waiting)
    by_user = Counter((c.source, c.user) for c in waiting)
    return min(waiting, key=lambda c: (by_source[c.source], by_user[c.source, c.user]))


def _displaced(waiting: list[_Check], new: _Check) -> _Check | None:
    """The waiting request ``new`` takes the place of, None if none (module docstring)."""
    by_source = Counter(c.source for c in waiting)
    heaviest = max(by_source.values())
    if by_source[new.source] + 1 < heaviest:
        # the heaviest source whose request came last
        group = next(c.source for c in reversed(waiting) if by_source[c.source] == heaviest)
        mine = [c for c in waiting if c.source == group]
    else:
        mine = [c for c in waiting if c.source == new.source]
        by_user = Counter(c.user for c in mine)
        if by_user[new.user] + 1 >= max(by_user.values(), default=0):
            return None
    by_user = Counter(c.user for c in mine)
    top = max(by_user.values())
    return next(c for c in reversed(mine) if by_user[c.user] == top)


def source(peer: str | None) -> str:
    """The group a client's requests count in: its address; every loopback address but
    127.0.0.1 and ::1 as one; an IPv6 address's /64 (what one host is usually given)."""
    try:
        address = ipaddress.ip_address(peer or "")
    except ValueError:
        return ""
    if isinstance(address, ipaddress.IPv6Address):
        if address.ipv4_mapped is not None:
            address = address.ipv4_mapped
        elif not address.is_loopback:
            return str(ipaddress.IPv6Network((int(address) >> 64 << 64, 64)))
    if isinstance(address, ipaddress.IPv4Address) and address.is_loopback \
            and address != _LOOPBACK:
        return _OTHER_LOOPBACK
    return str(address)


def bcrypt_cost(hashed: bytes) -> int:
    """The cost of a bcrypt hash (``$2b$12$...``: 12), as the web config's check allows."""
    return int(hashed[4:6])


def no_user_hash(cost: int) -> bytes:
    """The hash an unknown user is checked against: bcrypt spends ``cost`` and refuses."""
    return b"$2b$%02d$" % cost + _NO_USER_TAIL


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
