"""``[metrics] web_config``: the web configuration file node_exporter reads with
``--web.config.file``, read the way Prometheus' exporter-toolkit v0.17.1 reads it.

Operators already keep one such YAML file per host for every exporter built on exporter-toolkit
(its ``docs/web-configuration.md`` at v0.17.1 is the reference for every key here): TLS on the
listener (``tls_server_config``), basic auth (``basic_auth_users``: user -> bcrypt hash) and
extra response headers (``http_server_config.headers``). cuzkd accepts that release's keys with
its semantics -- TLS 1.2 minimum and 1.3 maximum by default, relative paths relative to the
file, ``client_auth_type`` by Go's names -- and refuses, by name and with the reason, the ones
Python's :mod:`ssl` (or aiohttp) cannot honour; a key that release does not have is refused as
unknown, as exporter-toolkit's strict YAML decoding does. Nothing is silently ignored: an
operator who asked for a cipher list must not believe they have one.

:func:`read_web_config` reads and checks the file, :func:`tls_context` builds the
:class:`ssl.SSLContext` it describes (loading the certificate and key proves they exist, are
readable and match). Both raise :class:`WebConfigError` (key, problem); the config loader words
it as a ConfigError naming both files, and the metrics listener re-reads with the same two
functions when the files change (:mod:`cuzkd.supervisor.web.access`).
"""

from __future__ import annotations

import enum
import re
import ssl
from pathlib import Path
from typing import Any

import msgspec
import yaml

from cuzkd import validation
from cuzkd.errors import WebConfigError

#: The exporter-toolkit release whose web configuration keys cuzkd accepts.
EXPORTER_TOOLKIT_RELEASE = "v0.17.1"
#: Largest web config read: a real one is well under a KiB per user.
MAX_WEB_CONFIG_BYTES = 1 * 2**20



class TlsVersionName(enum.StrEnum):
    """exporter-toolkit's TLS version names (``min_version``, ``max_version``)."""

    TLS10 = "TLS10"
    TLS11 = "TLS11"
    TLS12 = "TLS12"
    TLS13 = "TLS13"


_VERSIONS: dict[TlsVersionName, ssl.TLSVersion] = {
    TlsVersionName.TLS10: ssl.TLSVersion.TLSv1, TlsVersionName.TLS11: ssl.TLSVersion.TLSv1_1,
    TlsVersionName.TLS12: ssl.TLSVersion.TLSv1_2, TlsVersionName.TLS13: ssl.TLSVersion.TLSv1_3}


class ClientAuthName(enum.StrEnum):
    """Go's client auth policies Python's ssl can enforce (``client_auth_type``): it verifies a
    certificate it receives (optional or required), or asks for none. ``RequestClientCert`` and
    ``RequireAnyClientCert`` (alias ``RequireClientCert``) accept a certificate *without*
    verifying it, which ssl cannot do: refused in :data:`_REFUSED`."""

    NO_CLIENT_CERT = "NoClientCert"
    VERIFY_CLIENT_CERT_IF_GIVEN = "VerifyClientCertIfGiven"
    REQUIRE_AND_VERIFY_CLIENT_CERT = "RequireAndVerifyClientCert"


_CLIENT_AUTH: dict[ClientAuthName, ssl.VerifyMode] = {
    ClientAuthName.NO_CLIENT_CERT: ssl.CERT_NONE,
    ClientAuthName.VERIFY_CLIENT_CERT_IF_GIVEN: ssl.CERT_OPTIONAL,
    ClientAuthName.REQUIRE_AND_VERIFY_CLIENT_CERT: ssl.CERT_REQUIRED}
_UNVERIFIED_CLIENT_AUTH = ("RequestClientCert", "RequireAnyClientCert", "RequireClientCert")

#: Keys of that release cuzkd refuses, and why (the reason is the operator's message).
_REFUSED = {
    "tls_server_config.cert": "Python's ssl loads a certificate chain from files only: use "
                              "cert_file",
    "tls_server_config.key": "Python's ssl loads a private key from files only: use key_file",
    "tls_server_config.cipher_suites": "Python's ssl takes OpenSSL cipher strings, not Go's "
                                       "names, and cannot set TLS 1.3 suites: cuzkd keeps "
                                       "OpenSSL's defaults (leave the key out)",
    "tls_server_config.curve_preferences": "Python's ssl sets one ECDH curve, not a preference "
                                           "list: cuzkd keeps OpenSSL's defaults (leave the key "
                                           "out)",
    "tls_server_config.client_allowed_sans": "Python's ssl has no hook to check a client "
                                             "certificate's SANs during the handshake: use a "
                                             "client CA that signs only the allowed clients",
    "http_server_config.http2": "cuzkd's HTTP server (aiohttp) speaks HTTP/1.1 only "
                                "(Prometheus scrapes over HTTP/1.1): leave the key out",
    "rate_limit": "not supported: cuzkd bounds the listener's connections and bcrypt rounds "
                  "itself (leave the key out)",
}
#: exporter-toolkit's settable response headers, with the values it allows (None: any).
_HEADERS: dict[str, tuple[str, ...] | None] = {
    "Strict-Transport-Security": None, "X-Content-Type-Options": ("nosniff",),
    "X-Frame-Options": ("deny", "sameorigin"), "X-XSS-Protection": None,
    "Content-Security-Policy": None}
#: A bcrypt hash Go's ``bcrypt.Cost`` and Python's bcrypt both accept: version 2a, 2b, 2x or
#: 2y, cost 4..31, 22 characters of salt and 31 of hash in bcrypt's base64 alphabet.
_BCRYPT = re.compile(r"\$2[abxy]\$(0[4-9]|[12][0-9]|3[01])\$[./A-Za-z0-9]{53}")
#: A header value must not end the header (CR, LF) or carry NUL.
_HEADER_VALUE = re.compile(r"[^\r\n\0]*")


class TlsServerConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """``tls_server_config``; paths as resolved against the file's directory."""

    cert_file: str = ""
    key_file: str = ""
    client_auth_type: ClientAuthName = ClientAuthName.NO_CLIENT_CERT
    client_ca_file: str = ""
    #: a PEM bundle given inline (exporter-toolkit's ``client_ca``)
    client_ca: str = ""
    min_version: TlsVersionName = TlsVersionName.TLS12
    max_version: TlsVersionName = TlsVersionName.TLS13
    prefer_server_cipher_suites: bool = True


class HttpServerConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """``http_server_config``: headers added to every response of the listener."""

    headers: dict[str, str] = msgspec.field(default_factory=dict)


class WebConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """One web config file as read; ``path`` is where it was read from."""

    path: str = ""
    tls_server_config: TlsServerConfig | None = None
    http_server_config: HttpServerConfig = HttpServerConfig()
    #: user -> bcrypt hash; empty: no basic auth
    basic_auth_users: dict[str, str] = msgspec.field(default_factory=dict)

    @property
    def tls(self) -> bool:
        return self.tls_server_config is not None

    def files(self) -> tuple[str, ...]:
        """The files this configuration reads: watched for changes by the listener."""
        tls = self.tls_server_config
        named = (tls.cert_file, tls.key_file, tls.client_ca_file) if tls else ()
        return (self.path, *(f for f in named if f))


class _UniqueKeyLoader(yaml.SafeLoader):
    """YAML's safe loader refusing a key given twice (exporter-toolkit's strict decoding
    does; the safe loader would keep the last one silently)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if key in seen:
                raise WebConfigError(str(key), "given twice")
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def read_web_config(path: str) -> WebConfig:
    """The web config at ``path``, checked: every key known and honourable, every hash a
    bcrypt hash, every header one exporter-toolkit allows. Raises WebConfigError."""
    if "\0" in path:  # no file has such a name (open would raise ValueError)
        raise WebConfigError("", "the path contains a NUL character")
    try:
        with Path(path).open("rb") as fh:
            data = fh.read(MAX_WEB_CONFIG_BYTES + 1)
    except FileNotFoundError:
        raise WebConfigError("", "file not found") from None
    except OSError as exc:
        raise WebConfigError("", f"cannot read: {exc.strerror}") from None
    if len(data) > MAX_WEB_CONFIG_BYTES:
        raise WebConfigError("", f"larger than {MAX_WEB_CONFIG_BYTES} bytes; not a web config")
    try:
        raw = yaml.load(data, Loader=_UniqueKeyLoader)  # noqa: S506 -- a SafeLoader
    except yaml.YAMLError as exc:
        raise WebConfigError("", f"not YAML: {_yaml_problem(exc)}") from None
    except RecursionError:
        raise WebConfigError("", "not YAML: nested too deeply") from None
    if raw is None:  # an empty file: exporter-toolkit serves plain HTTP without auth
        raw = {}
    if not isinstance(raw, dict):
        raise WebConfigError("", "expected a mapping of keys at the top level")
    _refuse_unhonourable(raw)
    try:
        config = msgspec.convert({**raw, "path": path}, WebConfig)
    except msgspec.ValidationError as exc:
        key, problem = validation.key_and_message(exc)
        raise WebConfigError(key, problem) from None
    _check(config)
    return _resolved(config)


def _yaml_problem(exc: yaml.YAMLError) -> str:
    """PyYAML's message without the quoted document (a secret may sit in it)."""
    mark = getattr(exc, "problem_mark", None)
    problem = getattr(exc, "problem", None) or "cannot be parsed"
    return f"{problem} (line {mark.line + 1})" if mark is not None else str(problem)


def _refuse_unhonourable(raw: dict[str, Any]) -> None:
    for dotted, reason in _REFUSED.items():
        table, _, key = dotted.rpartition(".")
        section = raw.get(table) if table else raw
        if isinstance(section, dict) and key in section:
            raise WebConfigError(dotted, f"not supported: {reason}")
    tls = raw.get("tls_server_config")
    auth = tls.get("client_auth_type") if isinstance(tls, dict) else None
    if auth in _UNVERIFIED_CLIENT_AUTH:
        raise WebConfigError("tls_server_config.client_auth_type",
                             f"{auth} accepts a client certificate without verifying it, which "
                             "Python's ssl cannot do: use RequireAndVerifyClientCert (or "
                             "VerifyClientCertIfGiven) with client_ca_file")


def _check(config: WebConfig) -> None:
    """The rules between keys, and the values exporter-toolkit checks."""
    tls = config.tls_server_config
    if tls is not None:
        if not tls.cert_file:
            raise WebConfigError("tls_server_config.cert_file", "missing (TLS needs a "
                                 "certificate and its key)")
        if not tls.key_file:
            raise WebConfigError("tls_server_config.key_file", "missing (TLS needs a "
                                 "certificate and its key)")
        if tls.client_ca_file and tls.client_ca:
            raise WebConfigError("tls_server_config.client_ca", "give client_ca or "
                                 "client_ca_file, not both")
        if ((tls.client_ca_file or tls.client_ca)
                and tls.client_auth_type == ClientAuthName.NO_CLIENT_CERT):
            raise WebConfigError("tls_server_config.client_auth_type", "a client CA is set "
                                 "but NoClientCert asks for no client certificate")
        if _VERSIONS[tls.min_version] > _VERSIONS[tls.max_version]:
            raise WebConfigError("tls_server_config.min_version",
                                 f"{tls.min_version} is above max_version {tls.max_version}")
    for user, hashed in config.basic_auth_users.items():
        if not _BCRYPT.fullmatch(hashed):  # the hash itself is never repeated in a message
            raise WebConfigError(f"basic_auth_users.{user}", "not a bcrypt hash (make one "
                                 "with `htpasswd -nBC 10 \"\" | tr -d ':\\n'`)")
    for name, value in config.http_server_config.headers.items():
        allowed = _HEADERS.get(name, ())
        key = f"http_server_config.headers.{name}"
        if name not in _HEADERS:
            raise WebConfigError(key, f"cannot be set (one of {', '.join(_HEADERS)})")
        if allowed is not None and value not in allowed:
            raise WebConfigError(key, f"{value!r}: expected one of {', '.join(allowed)}")
        if not _HEADER_VALUE.fullmatch(value):
            raise WebConfigError(key, "must not contain CR, LF or NUL")


def _resolved(config: WebConfig) -> WebConfig:
    """Paths relative to the file's directory, as exporter-toolkit joins them."""
    tls = config.tls_server_config
    if tls is None:
        return config
    base = Path(config.path).parent

    def join(name: str) -> str:
        return str(base / name) if name else ""

    return msgspec.structs.replace(config, tls_server_config=msgspec.structs.replace(
        tls, cert_file=join(tls.cert_file), key_file=join(tls.key_file),
        client_ca_file=join(tls.client_ca_file)))


def tls_context(config: WebConfig) -> ssl.SSLContext | None:
    """The server context ``config`` describes (None without ``tls_server_config``): loading
    the certificate, key and client CAs now proves they are there, readable and match."""
    tls = config.tls_server_config
    if tls is None:
        return None
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = _VERSIONS[tls.min_version]
    context.maximum_version = _VERSIONS[tls.max_version]
    if not tls.prefer_server_cipher_suites:
        context.options &= ~ssl.OP_CIPHER_SERVER_PREFERENCE
    try:
        context.load_cert_chain(tls.cert_file, tls.key_file)
    except FileNotFoundError as exc:
        key = "cert_file" if exc.filename in (None, tls.cert_file) else "key_file"
        raise WebConfigError(f"tls_server_config.{key}", "file not found") from None
    except ssl.SSLError as exc:
        raise WebConfigError("tls_server_config.key_file", _pair_problem(exc)) from None
    except OSError as exc:
        raise WebConfigError("tls_server_config.cert_file", f"cannot read the certificate or "
                             f"its key: {exc.strerror}") from None
    context.verify_mode = _CLIENT_AUTH[tls.client_auth_type]
    if context.verify_mode != ssl.CERT_NONE:
        _load_client_cas(context, tls)
    return context


def _pair_problem(exc: ssl.SSLError) -> str:
    """OpenSSL's reason for a certificate and key it refused, in the operator's words."""
    if exc.reason == "KEY_VALUES_MISMATCH":
        return "does not match the certificate in cert_file"
    return f"the certificate or key cannot be loaded ({exc.reason or exc})"


def _load_client_cas(context: ssl.SSLContext, tls: TlsServerConfig) -> None:
    """The CAs client certificates are verified against: the file or the inline bundle, else
    the system's (as Go verifies against the system pool without ``ClientCAs``)."""
    key = "tls_server_config.client_ca_file" if tls.client_ca_file else \
        "tls_server_config.client_ca"
    try:
        if tls.client_ca_file:
            context.load_verify_locations(cafile=tls.client_ca_file)
        elif tls.client_ca:
            context.load_verify_locations(cadata=tls.client_ca)
        else:
            context.load_default_certs(ssl.Purpose.CLIENT_AUTH)
    except FileNotFoundError:
        raise WebConfigError(key, "file not found") from None
    except ssl.SSLError as exc:
        raise WebConfigError(key, f"no CA certificate could be loaded ({exc.reason})") from None
    except OSError as exc:
        raise WebConfigError(key, f"cannot read: {exc.strerror}") from None
