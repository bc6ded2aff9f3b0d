"""Certificates for tests of TLS on the metrics listener, made by the openssl CLI per test.

No key is ever committed: each call writes a fresh CA, a server certificate for 127.0.0.1 and
localhost signed by it, and a client certificate signed by it, under the directory given, with
a web config file beside them (exporter-toolkit's format). bcrypt hashes are made at cost 4 (the
least bcrypt allows): a test checks behaviour, not the cost.
"""

from __future__ import annotations

import base64
import subprocess
from dataclasses import dataclass
from pathlib import Path

import bcrypt

#: The user and password every made web config accepts.
USER = "prometheus"
PASSWORD = "scrape-secret"


@dataclass(frozen=True)
class TlsFiles:
    """The files one :func:`make_tls_files` call wrote."""

    dir: Path
    ca: Path
    cert: Path
    key: Path
    client_cert: Path
    client_key: Path


def _openssl(*args: str | Path) -> None:
    subprocess.run(["openssl", *map(str, args)], check=True, capture_output=True, timeout=60)


def _signed(directory: Path, name: str, ca: Path, ca_key: Path, extensions: str) -> None:
    """``name``.crt and ``name``.key: an EC P-256 key and a certificate ``ca`` signed."""
    key, csr = directory / f"{name}.key", directory / f"{name}.csr"
    ext = directory / f"{name}.ext"
    ext.write_text(extensions, encoding="utf-8")
    _openssl("req", "-new", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
             "-keyout", key, "-out", csr, "-subj", f"/CN={name}")
    _openssl("x509", "-req", "-in", csr, "-CA", ca, "-CAkey", ca_key, "-CAcreateserial",
             "-days", "2", "-out", directory / f"{name}.crt", "-extfile", ext)


def make_tls_files(directory: Path, name: str = "server") -> TlsFiles:
    """A CA, a server certificate ``name`` (127.0.0.1, ::1, localhost) and a client one."""
    directory.mkdir(parents=True, exist_ok=True)
    ca, ca_key = directory / "ca.crt", directory / "ca.key"
    if not ca.exists():
        _openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256",
                 "-nodes", "-keyout", ca_key, "-out", ca, "-days", "2", "-subj", "/CN=test-ca")
        _signed(directory, "client", ca, ca_key, "extendedKeyUsage=clientAuth\n")
    _signed(directory, name, ca, ca_key, "subjectAltName=IP:127.0.0.1,IP:::1,DNS:localhost\n"
                                         "extendedKeyUsage=serverAuth\n")
    return TlsFiles(directory, ca, directory / f"{name}.crt", directory / f"{name}.key",
                    directory / "client.crt", directory / "client.key")


def basic_auth(password: str = PASSWORD, user: str = USER) -> dict[str, str]:
    """The ``Authorization`` header of ``user`` with ``password``."""
    return {"Authorization": "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()}


def password_hash(password: str = PASSWORD, cost: int = 4) -> str:
    return bcrypt.hashpw(password.encode(), bcrypt.gensalt(cost)).decode()


def write_web_config(path: Path, files: TlsFiles | None, *, users: bool = True,
                     extra: str = "", cost: int = 4) -> Path:
    """A web config at ``path``: TLS with ``files`` (none: plain), USER with PASSWORD hashed
    at ``cost``."""
    lines = []
    if files is not None:
        lines += ["tls_server_config:", f"  cert_file: {files.cert}", f"  key_file: {files.key}"]
    if users:
        lines += ["basic_auth_users:", f"  {USER}: '{password_hash(cost=cost)}'"]
    path.write_text("\n".join(lines) + "\n" + extra, encoding="utf-8")
    return path
