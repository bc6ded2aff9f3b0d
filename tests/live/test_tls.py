"""cuzkd's listener with TLS and basic auth, scraped and pushed by real Prometheus servers.

One supervisor (one engine serving cuzk's reference document) whose ``[metrics] web_config``
asks for a client certificate (``VerifyClientCertIfGiven``: verified when one is given);
certificates and keys are made per run by openssl (support.tlsfiles), never committed. One
Prometheus scrapes it with the compose stack's TLS job (deploy/prometheus-tls.yml), once per
case: the right credentials and a client certificate, a wrong password, no client
certificate, a certificate of a foreign CA. A Prometheus agent runs
the shipped ``prometheus/prometheus-agent.yml`` (changed only where a test must: target,
files, URLs, 1 s intervals), identity from the environment as its unit gives it, and pushes to
a second Prometheus started with its remote-write receiver behind basic auth (the agent's
own credentials), which evaluates the shipped recording rules over what it received. The
last test rotates the certificate, so it stays last in the file.
"""

from __future__ import annotations

import json
import os
import socket
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from support.live import Prometheus, by_label, file_status_engine
from support.live_stack import RECORDING_RULES, REPO
from support.supervisor_harness import RunningSupervisor, start_supervisor, write_config
from support.tlsfiles import PASSWORD, USER, TlsFiles, make_tls_files, password_hash
from support.waiting import wait_until

AGENT_CONFIG = REPO / "prometheus" / "prometheus-agent.yml"
COMPOSE_TLS_CONFIG = REPO / "deploy" / "prometheus-tls.yml"
HOST = "gpu-host-17"
PUSH = f'job="cuzkd-push", instance="{HOST}"'
#: The agent's own credentials at the central Prometheus (never cuzkd's).
PUSH_USER, PUSH_PASSWORD = "cuzkd-push", "push-secret"


@dataclass
class TlsStack:
    sup: RunningSupervisor
    address: str
    files: TlsFiles
    web_config: Path
    scraper: Prometheus
    central: Prometheus


def _web_config(path: Path, files: TlsFiles, client_auth: str) -> None:
    """Written aside and renamed into place, as an operator's deploy tool would."""
    doc = {"tls_server_config": {"cert_file": str(files.cert), "key_file": str(files.key),
                                 "client_auth_type": client_auth,
                                 "client_ca_file": str(files.ca)},
           "basic_auth_users": {USER: password_hash()}}
    aside = path.with_suffix(".new")
    aside.write_text(yaml.safe_dump(doc), encoding="utf-8")
    os.replace(aside, path)


def _job(name: str, address: str, ca: Path, password_file: Path, *,
         client: TlsFiles | None = None) -> dict[str, Any]:
    """The compose stack's TLS job (deploy/prometheus-tls.yml) with this run's files."""
    (job,) = yaml.safe_load(COMPOSE_TLS_CONFIG.read_text(encoding="utf-8"))["scrape_configs"]
    job |= {"job_name": name, "scrape_timeout": "1s",
            "static_configs": [{"targets": [address]}]}
    job["tls_config"]["ca_file"] = str(ca)
    if client is not None:
        job["tls_config"] |= {"cert_file": str(client.client_cert),
                              "key_file": str(client.client_key)}
    assert job["basic_auth"]["username"] == USER
    job["basic_auth"]["password_file"] = str(password_file)
    return dict(job)


def _agent_config(address: str, files: TlsFiles, central: str, tmp: Path) -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load(AGENT_CONFIG.read_text(encoding="utf-8"))
    doc["global"]["scrape_interval"] = "1s"
    (job,) = doc["scrape_configs"]
    assert job["static_configs"] == [{"targets": ["127.0.0.1:9822"]}], "the local cuzkd"
    assert job["scheme"] == "https" and job["basic_auth"]["username"] == USER
    job["static_configs"] = [{"targets": [address]}]
    job["scrape_timeout"] = "1s"
    job["tls_config"] |= {"ca_file": str(files.ca), "cert_file": str(files.client_cert),
                          "key_file": str(files.client_key)}
    (tmp / "scrape-password").write_text(PASSWORD)
    job["basic_auth"]["password_file"] = str(tmp / "scrape-password")
    (write,) = doc["remote_write"]
    assert write["basic_auth"]["username"] == PUSH_USER
    (tmp / "remote-write-password").write_text(f"{PUSH_PASSWORD}\n")
    write["url"] = f"{central}/api/v1/write"
    write["basic_auth"]["password_file"] = str(tmp / "remote-write-password")
    write["queue_config"] = {"batch_send_deadline": "1s"}  # default 5 s: a slower test only
    return doc


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory, reference_dir: Path) -> Iterator[TlsStack]:
    tmp = tmp_path_factory.mktemp("tls")
    files = make_tls_files(tmp / "tls")
    foreign = make_tls_files(tmp / "foreign")
    web = tmp / "web-config.yml"
    _web_config(web, files, "VerifyClientCertIfGiven")
    engine = file_status_engine(tmp, "example", reference_dir / "cuzk-status.example.json")
    with ExitStack() as cleanup:
        sup = start_supervisor(write_config(tmp, [engine], metrics={"web_config": str(web)}))
        cleanup.callback(sup.stop)
        address = sup.about()["metrics_listen"]
        right, wrong = tmp / "right-password", tmp / "wrong-password"
        right.write_text(PASSWORD)
        wrong.write_text(f"{PASSWORD}x")
        jobs = [_job("cuzkd-tls", address, files.ca, right, client=files),
                _job("cuzkd-tls-wrong-password", address, files.ca, wrong, client=files),
                _job("cuzkd-tls-no-client-cert", address, files.ca, right),
                _job("cuzkd-tls-foreign-client-cert", address, files.ca, right, client=foreign)]
        scraper = Prometheus.start(tmp / "scraper", [], scrape_configs=jobs)
        cleanup.callback(scraper.stop)
        central_web = tmp / "central-web.yml"
        central_web.write_text(yaml.safe_dump(
            {"basic_auth_users": {PUSH_USER: password_hash(PUSH_PASSWORD)}}))
        central = Prometheus.start(tmp / "central", [], rule_files=[RECORDING_RULES],
                                   scrape_configs=[], auth=(PUSH_USER, PUSH_PASSWORD),
                                   flags=["--web.enable-remote-write-receiver",
                                          f"--web.config.file={central_web}"])
        cleanup.callback(central.stop)
        agent = Prometheus.start(tmp / "agent", [], agent=True,
                                 config=_agent_config(address, files, central.url, tmp),
                                 env={**os.environ, "CUZKD_HOST_ID": HOST})
        cleanup.callback(agent.stop)
        yield TlsStack(sup, address, files, web, scraper, central)


def _last_errors(prometheus: Prometheus) -> dict[str, str]:
    targets = prometheus.data("targets")["activeTargets"]
    return {t["labels"]["job"]: t["lastError"] for t in targets}


def test_scraped_over_tls_with_basic_auth_and_client_certificates(stack: TlsStack) -> None:
    up = stack.scraper.wait_for(
        "up", lambda v: len(v) == 4 and by_label(v, "job")["cuzkd-tls"] == 1, 30,
        "every job scraped once")
    assert by_label(up, "job") == {"cuzkd-tls": 1, "cuzkd-tls-no-client-cert": 1,
                                   "cuzkd-tls-wrong-password": 0,
                                   "cuzkd-tls-foreign-client-cert": 0}
    errors = _last_errors(stack.scraper)
    assert "401 Unauthorized" in errors["cuzkd-tls-wrong-password"]
    # refused in the handshake (TLS 1.3: the client reads the alert as a reset), never HTTP
    assert "HTTP status" not in errors["cuzkd-tls-foreign-client-cert"]
    assert stack.scraper.values('cuzkd_engine_up{job="cuzkd-tls", engine="example"}')


def _healthcheck() -> list[str]:
    """The Dockerfile's HEALTHCHECK command (exec form), with this interpreter."""
    text = (REPO / "Dockerfile").read_text(encoding="utf-8").replace("\\\n", " ")
    (line,) = [raw for raw in text.splitlines() if raw.startswith("HEALTHCHECK ")]
    argv: list[str] = json.loads(line.partition(" CMD ")[2])
    assert argv[0] == "python3"
    return ["python3", *argv[1:]]


@pytest.mark.parametrize(("scheme", "healthy"), [("https", True), ("http", False)])
def test_the_images_healthcheck_follows_the_listeners_scheme(stack: TlsStack, scheme: str,
                                                            healthy: bool) -> None:
    env = {**os.environ, "CUZKD_HEALTHZ_URL": f"{scheme}://{stack.address}/healthz"}
    result = subprocess.run(_healthcheck(), env=env, capture_output=True, timeout=30,
                            check=False)
    assert (result.returncode == 0) == healthy, result.stderr


def test_an_agent_pushes_cuzkd_with_the_host_identity(stack: TlsStack) -> None:
    central = stack.central
    # the receiver takes writes with the agent's credentials only
    anonymous = urllib.request.Request(f"{central.url}/api/v1/write", data=b"", method="POST")
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(anonymous, timeout=10)
    assert refused.value.code == 401
    engines = central.wait_for(f"cuzkd_engine_up{{{PUSH}}}",
                               lambda v: "example" in by_label(v, "engine"), 30,
                               "the engine's series pushed under the host identity")
    assert list(engines.values()) == [1.0]
    assert central.values(f"up{{{PUSH}}}") and central.values(f"up{{{PUSH}}}") == {
        frozenset({("job", "cuzkd-push"), ("instance", HOST)}): 1.0}
    # every pushed series, not only these (records, named level:metric:op, are made here):
    # one instance, and the helper label not sent
    pushed = 'count by (instance) ({job="cuzkd-push", __name__!~".+:.+"})'
    assert set(by_label(central.values(pushed), "instance")) == {HOST}
    assert central.values('count({cuzkd_host!=""})') == {}
    central.wait_for(f"instance:cuzkd_engines_up:sum{{{PUSH}}}",
                     lambda v: list(v.values()) == [1.0], 30,
                     "the recording rules over the pushed series")
    central.wait_for('job:cuzkd_hosts_up:sum{job="cuzkd-push"}',
                     lambda v: list(v.values()) == [1.0], 30, "the fleet's hosts up")


def _served_certificate(address: str, files: TlsFiles) -> bytes:
    host, _, port = address.rpartition(":")
    context = ssl.create_default_context(cafile=str(files.ca))
    context.load_cert_chain(files.client_cert, files.client_key)
    with socket.create_connection((host, int(port)), timeout=5) as raw, \
            context.wrap_socket(raw, server_hostname=host) as tls:
        certificate = tls.getpeercert(binary_form=True)
    assert certificate is not None
    return certificate


def _healthz_without_client_certificate(address: str, ca: Path) -> bytes:
    """The first bytes of a /healthz answer on a new connection offering no certificate
    (b"" or an error's name when the server refuses it)."""
    host, _, port = address.rpartition(":")
    context = ssl.create_default_context(cafile=str(ca))
    try:
        with socket.create_connection((host, int(port)), timeout=5) as raw, \
                context.wrap_socket(raw, server_hostname=host) as tls:
            tls.sendall(b"GET /healthz HTTP/1.1\r\nHost: cuzkd\r\nConnection: close\r\n\r\n")
            return tls.recv(64)
    except (ssl.SSLError, ConnectionError) as exc:  # TLS 1.3: the alert arrives on read
        return type(exc).__name__.encode()


def test_a_rotated_certificate_is_served_without_restarting_cuzkd(stack: TlsStack) -> None:
    """The rotation also asks for a client certificate from then on: new connections without
    one are refused, those with one served."""
    pid = stack.sup.proc.pid
    rotated = make_tls_files(stack.files.dir, "rotated")
    new = ssl.PEM_cert_to_DER_cert(rotated.cert.read_text(encoding="utf-8"))
    assert _served_certificate(stack.address, stack.files) != new
    assert _healthz_without_client_certificate(stack.address, stack.files.ca).startswith(
        b"HTTP/1.1 200")
    _web_config(stack.web_config, rotated, "RequireAndVerifyClientCert")
    rotated_at = time.time()
    wait_until(lambda: _served_certificate(stack.address, stack.files) == new, 15,
               "the rotated certificate served")
    assert stack.sup.proc.poll() is None and stack.sup.proc.pid == pid
    refused = _healthz_without_client_certificate(stack.address, stack.files.ca)
    assert not refused.startswith(b"HTTP/"), refused
    # Scrapes go on through it. (Prometheus keeps its connection alive: a connection made
    # before the rotation keeps the settings it was made with, as with any TLS server.)
    stack.scraper.wait_for(f'up{{job="cuzkd-tls"}} and timestamp(up) > {rotated_at + 1}',
                           lambda v: list(v.values()) == [1.0], 30,
                           "a scrape after the rotation")
