"""Who may use the metrics listener: its ``[metrics] web_config`` (TLS, basic auth, headers),
kept current while cuzkd runs.

:class:`WebAccess` holds the settings in use and re-reads them when one of their files changed,
judged by ``stat`` on each new connection: that is the only moment the TLS context matters and
four stats cost microseconds, so a rotated certificate serves the next connection with no timer
and no restart, where exporter-toolkit reads its file on every request. A re-read that fails
keeps the last good settings. :func:`source_of` is the unit of fairness for the bcrypt queue.
What is protected, rotation and bad input are docs/operations.md, *TLS and basic auth on the
metrics listener*.
"""

from __future__ import annotations

import ipaddress
import ssl
from collections.abc import Awaitable, Callable
from pathlib import Path

import structlog
from aiohttp import hdrs, web

from cuzkd.config.loading import web_config_error
from cuzkd.config.webconfig import WebConfig, read_web_config, tls_context
from cuzkd.errors import ConfigError, WebConfigError
from cuzkd.httperrors import error_response
from cuzkd.log.ratelimit import LimitedLog
from cuzkd.supervisor.web.basicauth import AuthDecision, BasicAuth

log = structlog.get_logger("cuzkd.supervisor")

#: The route a liveness probe calls: open without credentials, since a probe must not need the
#: scrape password in its spec and it says only that the supervisor runs.
OPEN_PATH = "/healthz"
#: What a 401 asks for (RFC 7617); the realm names what the password is for.
CHALLENGE = 'Basic realm="cuzkd", charset="UTF-8"'
#: Seconds a 429 asks a client to wait before it tries again (a round costs ~0.1-0.3 s).
RETRY_AFTER = "1"

_Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
#: A file's identity and content version as ``stat`` tells it; None when it cannot be stat'ed.
_Stamp = tuple[int, int, int, int] | None


def source_of(remote: str | None) -> str:
    """The unit of fairness for a client address: the address, an IPv6 one's /64 (an
    IPv4-mapped one is its IPv4 address: a dual-stack listener sees IPv4 clients so).

    A /64 is the block one host is usually given, so an attacker cannot take a share per
    address of its block."""
    if not remote:
        return ""
    try:
        address = ipaddress.ip_address(remote)
    except ValueError:
        return remote
    if isinstance(address, ipaddress.IPv6Address):
        if address.ipv4_mapped is not None:
            return str(address.ipv4_mapped)
        return str(ipaddress.IPv6Network((address, 64), strict=False))
    return str(address)


def _stamps(files: tuple[str, ...]) -> tuple[_Stamp, ...]:
    stamps: list[_Stamp] = []
    for path in files:
        try:
            st = Path(path).stat()
        except OSError:
            stamps.append(None)
        else:
            # a rename onto the path and an in-place write both change one of these
            stamps.append((st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns))
    return tuple(stamps)


class WebAccess:
    """The listener's current TLS context, credentials and headers for the web config file at
    ``path`` ("": plain HTTP, no auth, nothing re-read). A file that cannot be used at start is
    a ConfigError naming ``where`` (cuzkd's config) and the web config's key."""

    def __init__(self, path: str, limited: LimitedLog, *, where: str = "") -> None:
        self._limited = limited
        self.web = WebConfig(path=path)
        #: the files watched, and their stamps: taken before each is read, so that a file
        #: changing during the reads differs at the next look
        self._watched: tuple[str, ...] = (path,) if path else ()
        self._stamps = _stamps(self._watched)
        try:
            self.web, self.context = self._load() if path else (self.web, None)
        except WebConfigError as exc:
            raise ConfigError(web_config_error(where or "config", path, exc)) from None
        self.auth = BasicAuth(self.web.basic_auth_users) if self.web.basic_auth_users else None
        self.last_reload_ok = True
        #: requests answered 401 (no, malformed or wrong credentials)
        self.refused_total = 0
        #: requests answered 429 (not checked: their address had its share of waiting checks)
        self.throttled_total = 0

    def tls(self) -> ssl.SSLContext | None:
        """The context a new connection is served with, after re-reading changed files."""
        self.refresh()
        return self.context

    def refresh(self) -> None:
        """Re-read the settings if one of their files changed since the last look (a failed
        read is not tried again until one changes again)."""
        if not self.web.path or _stamps(self._watched) == self._stamps:
            return
        self._watched = self.web.files()
        self._stamps = _stamps(self._watched)
        try:
            web, context = self._load()
            if web.tls != self.web.tls:
                raise WebConfigError("tls_server_config", "turning TLS on or off needs a "
                                     "restart of cuzkd")
        except WebConfigError as exc:
            if self.last_reload_ok:
                log.error("metrics_web_config_reload_failed",
                          error=web_config_error("metrics.web_config", self.web.path, exc),
                          detail="keeping the last good TLS and auth settings")
            self.last_reload_ok = False
            return
        self.web, self.context, self.last_reload_ok = web, context, True
        if not web.basic_auth_users:
            self.auth = None
        elif self.auth is None:
            self.auth = BasicAuth(web.basic_auth_users)
        else:
            self.auth.replace_users(web.basic_auth_users)
        log.info("metrics_web_config_reloaded", path=web.path, tls=web.tls,
                 users=len(web.basic_auth_users))

    def _load(self) -> tuple[WebConfig, ssl.SSLContext | None]:
        """The web config file (stamped already) and the context of the files it names, which
        are watched from now on, stamped before they are read."""
        web = read_web_config(self.web.path)
        added = tuple(f for f in web.files() if f not in self._watched)
        self._watched += added
        self._stamps += _stamps(added)
        return web, tls_context(web)

    @web.middleware
    async def guard(self, request: web.Request, handler: _Handler) -> web.StreamResponse:
        """The app's first middleware: a 401 unless the request may pass, or a 429 when its
        password could not be checked yet: unknown paths answer 401 too, so they tell nothing."""
        auth = self.auth
        if auth is None or request.path == OPEN_PATH:
            return await handler(request)
        decision = await auth.check(request.headers.get(hdrs.AUTHORIZATION),
                                    source_of(request.remote))
        if decision is AuthDecision.ALLOWED:
            return await handler(request)
        if decision is AuthDecision.THROTTLED:
            self.throttled_total += 1
            self._limited.log(log, "warning", "metrics_auth_throttled",
                              detail="too many credential checks waiting from this address "
                                     "(429)", peer=request.remote or "")
            response = error_response(429, "too many credential checks waiting: retry later")
            response.headers[hdrs.RETRY_AFTER] = RETRY_AFTER
            return response
        self.refused_total += 1
        self._limited.log(log, "warning", "metrics_auth_refused",
                          detail="missing or wrong basic auth credentials (401)",
                          peer=request.remote or "")
        response = error_response(401, "unauthorized: basic auth credentials required")
        response.headers[hdrs.WWW_AUTHENTICATE] = CHALLENGE
        return response

    async def add_headers(self, request: web.Request, response: web.StreamResponse) -> None:
        """``on_response_prepare``: the web config's headers, on errors and 401s too."""
        del request
        response.headers.update(self.web.http_server_config.headers)
