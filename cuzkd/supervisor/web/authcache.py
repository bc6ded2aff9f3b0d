"""What basic auth remembers between requests: passwords bcrypt accepted, and ones it refused.

Prometheus sends the same credentials with every scrape; a bcrypt round costs tens to hundreds
of milliseconds (cost 10 to 12), more than the whole scrape. So a password bcrypt accepted is
remembered -- as a keyed digest (:meth:`BasicAuth._digest`: an HMAC under a key drawn at start),
never the password -- together with the hash it was verified against, and the next request
with it is answered from here, before and without the queue for bcrypt rounds: however many
wrong passwords wait for a round, a password already verified never waits behind them.

* :class:`Verified` holds one entry per user (only one password matches a hash, short of
  bcrypt's 72-byte truncation), the ``MAX_VERIFIED`` most recently used: memory stays bounded
  whatever the number of users in the file. It is looked up by user, and the digest compared
  with :func:`hmac.compare_digest`, so the time taken does not depend on the password sent.
  An entry counts only while its user's hash is the one it was verified against; a re-read web
  config drops those whose hash changed or whose user went (:meth:`Verified.keep_only`), and
  keeps the others: rotating a certificate does not cost Prometheus a round.
* :class:`Refused` holds digests of (user, hash, password) bcrypt refused, so that a wrong
  password sent again costs no round; it is forgotten all at once when full, so an attacker's
  distinct guesses cannot grow it.

Pure: no event loop, no clock.
"""

from __future__ import annotations

import hmac
from collections import OrderedDict
from collections.abc import Mapping

#: Users whose verified password is remembered (the least recently used is forgotten first).
MAX_VERIFIED = 64
#: Refused credentials remembered (then forgotten all at once).
MAX_REFUSED = 1024


class Verified:
    """user -> (the hash the password was verified against, the password's digest)."""

    def __init__(self, limit: int = MAX_VERIFIED) -> None:
        self.limit = limit
        self._entries: OrderedDict[str, tuple[bytes, bytes]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def holds(self, user: str, hashed: bytes | None, digest: bytes) -> bool:
        """Whether ``digest`` is the password verified for ``user`` against ``hashed`` (its
        current hash; None: no such user)."""
        entry = self._entries.get(user)
        if entry is None or hashed is None or entry[0] != hashed:
            return False
        if not hmac.compare_digest(entry[1], digest):
            return False
        self._entries.move_to_end(user)
        return True

    def remember(self, user: str, hashed: bytes, digest: bytes) -> None:
        """bcrypt accepted the password of ``digest`` for ``user`` against ``hashed``."""
        self._entries[user] = (hashed, digest)
        self._entries.move_to_end(user)
        while len(self._entries) > self.limit:
            self._entries.popitem(last=False)

    def keep_only(self, users: Mapping[str, bytes]) -> None:
        """A re-read file's ``users``: forget entries whose user went or whose hash changed."""
        for user, (hashed, _) in list(self._entries.items()):
            if users.get(user) != hashed:
                del self._entries[user]


class Refused:
    """Digests of credentials bcrypt refused, at most ``limit``."""

    def __init__(self, limit: int = MAX_REFUSED) -> None:
        self.limit = limit
        self._digests: set[bytes] = set()

    def __len__(self) -> int:
        return len(self._digests)

    def __contains__(self, digest: bytes) -> bool:
        return digest in self._digests

    def add(self, digest: bytes) -> None:
        if len(self._digests) >= self.limit:
            self._digests.clear()
        self._digests.add(digest)
