"""Basic auth against a web config's ``basic_auth_users``: bcrypt once, then a cached digest.

A bcrypt round costs ~70 ms at cost 10 -- more than cuzkd's whole scrape. Prometheus sends the
same credentials with every scrape, so a password bcrypt accepted is remembered as an HMAC of
it under a key drawn at start (never the password itself), and later requests are compared
with :func:`hmac.compare_digest` (constant time): a scrape costs no bcrypt round. The entry
holds the hash it was verified against, so a changed hash in a re-read file is verified anew.

bcrypt runs in a thread (it releases the GIL: the event loop, the engines' polls and the other
scrapes go on), one round at a time. A flood of wrong passwords therefore costs one core at
most; requests waiting for a round are bounded (:data:`MAX_WAITING`), those beyond it are
refused at once without one, and a wrong password already refused is refused again from a
bounded cache. An unknown user is checked against a fixed hash, so timing does not tell which
users exist. No password or hash is ever logged: the caller logs that a request was refused.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import hashlib
import hmac
import os

import bcrypt

#: Requests that may wait for a bcrypt round; more are refused without one.
MAX_WAITING = 8
#: Wrong credentials remembered (then forgotten all at once: an attacker's distinct guesses
#: must not grow memory).
MAX_REFUSED = 1024
#: Checked for an unknown user so that it costs what a known one costs (cost 10, the usual).
_NO_USER_HASH = b"$2b$10$EbsZMJd5..xbRZiXnTqTme82QFTlDw0HVIBSj56aYe8znqWs0iRoK"


class BasicAuth:
    """``users`` (user -> bcrypt hash) checked against ``Authorization`` headers."""

    def __init__(self, users: dict[str, str]) -> None:
        self._users = {user: hashed.encode() for user, hashed in users.items()}
        self._key = os.urandom(32)
        #: user -> (the hash verified against, HMAC of the password bcrypt accepted)
        self._verified: dict[str, tuple[bytes, bytes]] = {}
        #: HMACs of (user, hash, password) bcrypt refused
        self._refused: set[bytes] = set()
        self._round = asyncio.Lock()
        self._waiting = 0
        self.bcrypt_rounds = 0
        #: requests refused because MAX_WAITING were already waiting
        self.busy_refused = 0

    def replace_users(self, users: dict[str, str]) -> None:
        """A re-read file's users; verified passwords stay valid while their hash does."""
        self._users = {user: hashed.encode() for user, hashed in users.items()}

    async def allows(self, header: str | None) -> bool:
        """Whether ``header`` (an ``Authorization`` value) names a user with its password."""
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
        if self._waiting >= MAX_WAITING:
            self.busy_refused += 1
            return False
        self._waiting += 1
        try:
            async with self._round:
                self.bcrypt_rounds += 1
                ok = await asyncio.to_thread(_checkpw, password, hashed or _NO_USER_HASH)
        finally:
            self._waiting -= 1
        if ok and hashed is not None:
            self._verified[user] = (hashed, digest)
            return True
        if len(self._refused) >= MAX_REFUSED:
            self._refused.clear()
        self._refused.add(refusal)
        return False

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
