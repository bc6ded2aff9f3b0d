"""The shipped Dockerfile, built with podman on a local Debian base and run for real.

The build takes the host's CA bundle as a build secret (the package index may sit behind a
TLS-intercepting proxy); the bundle the test passes carries a canary line, and the final image
is searched for it and for the host's locally added CAs. The container runs with no network
(``--network=none``: only loopback), so everything it serves is fetched from inside with
``podman exec``.
"""

from __future__ import annotations

import contextlib
import json
import re
import subprocess
import sys
import tarfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from support import podman as pm
from support.inline_http import GET_SCRIPT, parse_get_output
from support.live import Exposition, parse_exposition
from support.waiting import wait_until

from cuzkd.units import parse_duration

REPO = Path(__file__).resolve().parents[2]
HOST_CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")
HOST_LOCAL_CAS = Path("/usr/local/share/ca-certificates")
IMAGE = "localhost/cuzkd-live-test:latest"
IMAGE_UID = 10001
STOP_TIMEOUT = "45s"  # docs/operations.md: run with --stop-timeout 45
ORPHANS = 200

pytestmark = pytest.mark.timeout(600)


@pytest.fixture(scope="module")
def canary() -> str:
    return f"cuzkd-build-secret-canary-{uuid.uuid4().hex}"


@pytest.fixture(scope="module")
def image(tmp_path_factory: pytest.TempPathFactory, canary: str) -> str:
    reason = pm.not_root()
    if reason is not None:
        print(f"\nlive container tests skipped: {reason}", file=sys.stderr)
        pytest.skip(reason)
    missing = pm.tools_missing()
    if missing is not None:
        pytest.fail(missing)
    bundle = tmp_path_factory.mktemp("secret") / "pip_cert.pem"
    host = HOST_CA_BUNDLE.read_text() if HOST_CA_BUNDLE.exists() else ""
    bundle.write_text(f"{host}\n# {canary}\n")  # PEM readers skip text between certificates
    pm.podman("build", "--format", "docker", "--network=host",
              "--build-arg", f"BASE_IMAGE={pm.base_image()}",
              "--secret", f"id=pip_cert,src={bundle}", "-t", IMAGE, str(REPO), timeout=900)
    return IMAGE


@pytest.fixture(scope="module")
def container(image: str) -> Iterator[str]:
    name = f"cuzkd-live-{uuid.uuid4().hex[:8]}"
    # --health-interval=disable: no systemd to run the HEALTHCHECK timer; the test runs it.
    pm.podman("run", "-d", "--name", name, "--network=none", "--health-interval=disable",
              *pm.RUN_ULIMITS,
              "--stop-timeout", str(int(parse_duration(STOP_TIMEOUT))), image)
    try:
        yield name
    finally:
        pm.podman("rm", "--force", "--time", "0", name, check=False)


def _exec(name: str, *argv: str) -> str:
    return pm.podman("exec", name, *argv, timeout=60).stdout


def _scrape(name: str) -> Exposition:
    code, body = parse_get_output(_exec(name, "python3", "-c", GET_SCRIPT,
                                        "http://127.0.0.1:9822/metrics", "10"))
    assert code == 200, body
    return parse_exposition(body)


def _inspect(name: str) -> dict[str, object]:
    (info,) = json.loads(pm.podman("inspect", name).stdout)
    return dict(info)


def _state(name: str) -> dict[str, object]:
    return dict(_inspect(name)["State"])  # type: ignore[call-overload]


def _host_tree(pid: int) -> set[int]:
    """``pid`` and its descendants (host PIDs)."""
    found, todo = set(), [pid]
    while todo:
        current = todo.pop()
        found.add(current)
        with contextlib.suppress(OSError):
            children = Path(f"/proc/{current}/task/{current}/children").read_text().split()
            todo.extend(int(c) for c in children)
    return found


def test_cuzkd_is_pid1_as_the_image_user_and_healthy(container: str) -> None:
    pid1 = int(_state(container)["Pid"])  # type: ignore[call-overload]
    argv = Path(f"/proc/{pid1}/cmdline").read_bytes().split(b"\0")
    assert b"run" in argv and any(a.endswith(b"/cuzkd") for a in argv), argv
    assert Path(f"/proc/{pid1}").stat().st_uid == IMAGE_UID
    assert _exec(container, "cat", "/proc/1/cmdline") == Path(f"/proc/{pid1}/cmdline").read_text()
    wait_until(lambda: pm.podman("healthcheck", "run", container, check=False).returncode == 0,
               60, "the image's HEALTHCHECK to pass", interval=0.5)
    wait_until(lambda: _scrape(container).value("cuzkd_engine_up", engine="cpu0") == 1, 60,
               "the default CPU engine up", interval=0.5)


def test_an_orphan_storm_leaves_no_zombie(container: str) -> None:
    wait_until(lambda: _scrape(container).value("cuzkd_engine_up", engine="cpu0") == 1, 60,
               "the default CPU engine up", interval=0.5)
    before = _scrape(container).value("cuzkd_zombies_reaped_total") or 0
    # The exec'd process forks and exits at once: its children are orphans that PID 1 inherits
    # and must reap when they exit a moment later.
    storm = ("import os, time\n"
             f"for _ in range({ORPHANS}):\n"
             "    if os.fork() == 0:\n"
             "        time.sleep(0.5)\n"
             "        os._exit(0)\n"
             "os._exit(0)\n")
    _exec(container, "python3", "-c", storm)
    wait_until(lambda: (_scrape(container).value("cuzkd_zombies_reaped_total") or 0)
               >= before + ORPHANS, 60, f"{ORPHANS} orphans reaped", interval=0.2)
    pid1 = int(_state(container)["Pid"])  # type: ignore[call-overload]
    states = {}
    for pid in _host_tree(pid1):
        with contextlib.suppress(OSError):
            states[pid] = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    assert "Z" not in states.values(), states
    assert len(states) >= 2, "cuzkd and its engine"


def test_stop_ends_everything_within_the_stop_timeout_with_exit_0(container: str) -> None:
    wait_until(lambda: _scrape(container).value("cuzkd_engine_up", engine="cpu0") == 1, 60,
               "the default CPU engine up", interval=0.5)
    tree = _host_tree(int(_state(container)["Pid"]))  # type: ignore[call-overload]
    assert len(tree) >= 2, "cuzkd and its engine"
    started = time.monotonic()
    pm.podman("stop", container, timeout=120)
    elapsed = time.monotonic() - started
    state = _state(container)
    assert elapsed < parse_duration(STOP_TIMEOUT)
    assert (state["Status"], state["ExitCode"], state["OOMKilled"]) == ("exited", 0, False)
    assert not [pid for pid in tree if Path(f"/proc/{pid}").exists()]


def test_the_image_holds_no_build_secret_and_nothing_of_the_host(image: str, canary: str) -> None:
    inspect = pm.podman("image", "inspect", image).stdout
    history = pm.podman("history", "--no-trunc", "--format", "json", image).stdout
    assert canary not in inspect and canary not in history
    config = json.loads(inspect)[0]["Config"]
    env = dict(e.split("=", 1) for e in config.get("Env") or [])
    assert not {"PIP_CERT", "REQUESTS_CA_BUNDLE", "SSL_CERT_FILE"} & env.keys(), env
    needles = {canary.encode(): "the build secret"}
    for cert in sorted(HOST_LOCAL_CAS.glob("*.crt")) if HOST_LOCAL_CAS.is_dir() else []:
        body = re.search(rb"-----BEGIN CERTIFICATE-----\s*(\S{64})", cert.read_bytes())
        if body:
            needles[body.group(1)] = f"the host's local CA {cert.name}"
    found = _search_image(image, needles)
    assert not found, found


def _search_image(image: str, needles: dict[bytes, str]) -> dict[str, str]:
    """``path -> what`` for every file of the image's file system that contains a needle."""
    name = f"cuzkd-live-export-{uuid.uuid4().hex[:8]}"
    pm.podman("create", "--name", name, image)
    found: dict[str, str] = {}
    try:
        export = subprocess.Popen([*pm.PODMAN, "export", name], stdout=subprocess.PIPE)
        assert export.stdout is not None
        with tarfile.open(fileobj=export.stdout, mode="r|") as tar:
            for member in tar:
                if member.name.lstrip("./") in {"etc/hostname", "etc/resolv.conf"}:
                    # Run-time files podman mounts; the image must not bring its own.
                    assert member.size == 0, f"{member.name} is baked into the image"
                if member.name.lstrip("./").startswith("run/secrets/"):
                    found[member.name] = "a secret mount point left in the image"
                if not member.isfile():
                    continue
                handle = tar.extractfile(member)
                assert handle is not None
                data = handle.read()
                hits = [what for needle, what in needles.items() if needle in data]
                if hits:
                    found[member.name] = ", ".join(hits)
        assert export.wait(timeout=120) == 0
    finally:
        pm.podman("rm", "--force", name, check=False)
    return found
