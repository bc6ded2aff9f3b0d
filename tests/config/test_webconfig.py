"""``[metrics] web_config``: exporter-toolkit's file read, checked and refused with file and key.

Every refusal names cuzkd's file, ``metrics.web_config``, the web config file and its key;
keys Python's ssl cannot honour are refused by name with the reason; no hash is repeated in a
message. The certificates are made per run by openssl (tests/support/tlsfiles.py).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from support.tlsfiles import TlsFiles, make_tls_files, password_hash, write_web_config

from cuzkd.cli.dispatch import main as dispatch_main
from cuzkd.config import load_config
from cuzkd.config.webconfig import read_web_config, tls_context
from cuzkd.errors import ConfigError


@pytest.fixture(scope="module")
def tls(tmp_path_factory: pytest.TempPathFactory) -> TlsFiles:
    return make_tls_files(tmp_path_factory.mktemp("tls"))


def _cuzkd_toml(tmp_path: Path, web: Path) -> Path:
    path = tmp_path / "cuzkd.toml"
    path.write_text(f'[metrics]\nweb_config = "{web}"\n[[engine]]\nname = "e0"\n',
                    encoding="utf-8")
    return path


def _refusal(tmp_path: Path, web_text: str) -> str:
    web = tmp_path / "web.yml"
    web.write_text(web_text, encoding="utf-8")
    with pytest.raises(ConfigError) as caught:
        load_config(_cuzkd_toml(tmp_path, web))
    message = str(caught.value)
    assert message.startswith(f"{tmp_path / 'cuzkd.toml'}: key `metrics.web_config`: {web}")
    return message


def test_a_good_file_reads_with_exporter_toolkits_defaults(tmp_path: Path,
                                                            tls: TlsFiles) -> None:
    """Relative paths are relative to the file (as exporter-toolkit joins them); TLS 1.2 to
    1.3 unless set; the context loads the pair."""
    (tmp_path / "certs").mkdir()
    for source in (tls.cert, tls.key):
        shutil.copy(source, tmp_path / "certs" / source.name)
    web = tmp_path / "web.yml"
    web.write_text(f"tls_server_config:\n  cert_file: certs/{tls.cert.name}\n"
                   f"  key_file: certs/{tls.key.name}\n"
                   f"basic_auth_users:\n  alice: '{password_hash()}'\n"
                   "http_server_config:\n  headers:\n    X-Frame-Options: deny\n",
                   encoding="utf-8")
    config = read_web_config(str(web))
    assert config.tls_server_config is not None
    assert config.tls_server_config.cert_file == str(tmp_path / "certs" / tls.cert.name)
    context = tls_context(config)
    assert context is not None
    assert context.minimum_version.name == "TLSv1_2"
    assert context.maximum_version.name == "TLSv1_3"
    assert load_config(_cuzkd_toml(tmp_path, web)).metrics.web_config == str(web)


@pytest.mark.parametrize(("text", "key", "reason"), [
    ("tls_server_config:\n  cipher_suites: [TLS_AES_128_GCM_SHA256]\n",
     "tls_server_config.cipher_suites", "OpenSSL cipher strings"),
    ("tls_server_config:\n  curve_preferences: [X25519]\n",
     "tls_server_config.curve_preferences", "one ECDH curve"),
    ("tls_server_config:\n  cert: '-----BEGIN CERTIFICATE-----'\n",
     "tls_server_config.cert", "from files only"),
    ("tls_server_config:\n  client_allowed_sans: [a]\n",
     "tls_server_config.client_allowed_sans", "SANs"),
    ("http_server_config:\n  http2: true\n", "http_server_config.http2", "HTTP/1.1 only"),
    ("rate_limit:\n  interval: 1s\n  burst: 2\n", "rate_limit", "bounds the listener"),
    ("tls_server_config:\n  client_auth_type: RequireAnyClientCert\n",
     "tls_server_config.client_auth_type", "without verifying it"),
])
def test_keys_ssl_cannot_honour_are_refused_by_name_with_the_reason(
        tmp_path: Path, text: str, key: str, reason: str) -> None:
    message = _refusal(tmp_path, text)
    assert f"key `{key}`" in message
    assert reason in message


@pytest.mark.parametrize(("text", "key", "problem"), [
    ("tls_server_confg:\n  cert_file: a\n", "tls_server_confg", "unknown key"),
    ("tls_server_config:\n  cert_file: a\n  key_fil: b\n", "tls_server_config.key_fil",
     "unknown key"),
    ("tls_server_config:\n  key_file: k\n", "tls_server_config.cert_file", "missing"),
    ("tls_server_config:\n  cert_file: c\n  key_file: k\n  min_version: TLS9\n",
     "tls_server_config.min_version", "Invalid enum value 'TLS9'"),
    ("basic_auth_users:\n  alice: hunter2\n", "basic_auth_users.alice", "not a bcrypt hash"),
    ("http_server_config:\n  headers:\n    X-Powered-By: cuzkd\n",
     "http_server_config.headers.X-Powered-By", "cannot be set"),
    ("http_server_config:\n  headers:\n    X-Frame-Options: allow\n",
     "http_server_config.headers.X-Frame-Options", "expected one of deny, sameorigin"),
    ("basic_auth_users:\n  a: x\n  a: y\n", "a", "given twice"),
])
def test_mistakes_name_the_key(tmp_path: Path, text: str, key: str, problem: str) -> None:
    message = _refusal(tmp_path, text)
    assert f"key `{key}`: " in message
    assert problem in message
    assert "hunter2" not in message


def test_a_file_missing_or_not_yaml_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"web\.yml: file not found"):
        load_config(_cuzkd_toml(tmp_path, tmp_path / "web.yml"))
    message = _refusal(tmp_path, "basic_auth_users: {alice: '$2y$10$secret\n")
    assert "not YAML" in message
    assert "secret" not in message  # the document (a hash, a password) is never quoted


def test_a_key_that_does_not_match_its_certificate_or_cannot_be_read(
        tmp_path: Path, tls: TlsFiles) -> None:
    other = make_tls_files(tls.dir, "other")
    web = tmp_path / "web.yml"
    web.write_text(f"tls_server_config:\n  cert_file: {tls.cert}\n  key_file: {other.key}\n",
                   encoding="utf-8")
    with pytest.raises(ConfigError, match=r"key `tls_server_config.key_file`: does not match "
                                          r"the certificate in cert_file"):
        load_config(_cuzkd_toml(tmp_path, web))
    garbage = tmp_path / "garbage.key"
    garbage.write_text("not a key\n", encoding="utf-8")
    web.write_text(f"tls_server_config:\n  cert_file: {tls.cert}\n  key_file: {garbage}\n",
                   encoding="utf-8")
    with pytest.raises(ConfigError, match=r"key `tls_server_config.key_file`: the certificate "
                                          r"or key cannot be loaded"):
        load_config(_cuzkd_toml(tmp_path, web))


def test_check_config_exits_78_and_client_commands_do_not_read_it(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """check-config (and run) read the file; ``cuzkd status`` & co. need only the control
    socket and must not need the listener's private key."""
    path = _cuzkd_toml(tmp_path, tmp_path / "absent.yml")
    assert dispatch_main(["check-config", str(path)]) == 78
    assert "key `metrics.web_config`" in capsys.readouterr().err
    assert load_config(path, resolve_hosts=False).metrics.web_config.endswith("absent.yml")


def test_a_client_ca_without_a_client_auth_policy_is_refused(tmp_path: Path,
                                                              tls: TlsFiles) -> None:
    message = _refusal(tmp_path, write_web_config(
        tmp_path / "w.yml", tls, extra="").read_text(encoding="utf-8").replace(
        "basic_auth_users:", f"  client_ca_file: {tls.ca}\nbasic_auth_users:"))
    assert "key `tls_server_config.client_auth_type`: a client CA is set" in message
