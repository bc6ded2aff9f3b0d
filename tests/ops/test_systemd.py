"""systemd/cuzkd.service: systemd's own verifier, its security score, and the settings cuzkd needs.

`systemd-analyze verify` refuses a unit whose ExecStart binary is missing, so it checks a copy
whose ExecStart points at an executable that exists here (the venv's cuzkd). The exposure score
comes from `systemd-analyze security --offline=true` and must stay at or below 3.0 and match
what docs/operations.md tells operators.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest
from support import ops

from cuzkd.cli.dispatch import build_parser
from cuzkd.config import (
    Config,
    door_address,
    grpc_address,
    load_config,
    plan_doors,
    state_dir,
    status_address,
)
from cuzkd.units import parse_duration

UNIT = ops.REPO / "systemd" / "cuzkd.service"
SOCKET_UNIT = ops.REPO / "systemd" / "cuzkd.socket"
UNIT_CONFIG = ops.REPO / "systemd" / "cuzkd.toml"
CUZK_CONFIG = ops.REPO / "systemd" / "cuzk.toml"
INSTALLED_CUZK = "/etc/cuzkd/cuzk.toml"
SHIPPED_BINARY = "/usr/local/bin/cuzkd"
MAX_EXPOSURE = 3.0


def _directives(text: str) -> dict[str, list[str]]:
    """``Section.Key`` → values in order (systemd allows repeated keys)."""
    out: dict[str, list[str]] = defaultdict(list)
    section = ""
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("["):
            section = line.strip("[]")
            continue
        key, _, value = line.partition("=")
        out[f"{section}.{key.strip()}"].append(value.strip())
    return out


def _runnable_copy(tmp_path: Path, text: str | None = None) -> Path:
    """The unit with ExecStart pointing at an existing cuzkd (or /bin/true)."""
    here = Path(sys.executable).parent / "cuzkd"
    binary = str(here) if here.exists() else "/bin/true"
    text = (UNIT.read_text(encoding="utf-8") if text is None else text)
    assert SHIPPED_BINARY in text
    path = tmp_path / "cuzkd.service"
    path.write_text(text.replace(SHIPPED_BINARY, binary), encoding="utf-8")
    shutil.copy(SOCKET_UNIT, tmp_path / SOCKET_UNIT.name)  # Requires= it: found beside it
    return path


def _systemd_analyze(*args: str) -> subprocess.CompletedProcess[str]:
    if shutil.which("systemd-analyze") is None:
        pytest.fail("systemd-analyze not installed (apt-get install systemd)")
    return subprocess.run(["systemd-analyze", *args], capture_output=True, text=True,
                          timeout=60, check=False)


def test_verify_is_clean(tmp_path: Path) -> None:
    service = _runnable_copy(tmp_path)
    result = _systemd_analyze("verify", str(service), str(service.with_suffix(".socket")))
    assert result.returncode == 0, result.stderr
    assert result.stdout + result.stderr == "", "verify printed warnings"


def test_verify_catches_a_broken_socket_unit(tmp_path: Path) -> None:
    service = _runnable_copy(tmp_path)
    socket_unit = service.with_suffix(".socket")
    socket_unit.write_text(socket_unit.read_text().replace("SocketMode=", "SockMode="))
    result = _systemd_analyze("verify", str(service), str(socket_unit))
    assert "SockMode" in result.stdout + result.stderr


def test_the_socket_unit_holds_the_doors_socket_for_the_service() -> None:
    """cuzkd.socket binds Curio's address, which the shipped cuzk engine's door is, and the
    service (of the same name: its fds are passed) takes it at each start without restarting
    it (Wants=, not BindsTo=: a host without a door masks the socket)."""
    sock = _directives(SOCKET_UNIT.read_text(encoding="utf-8"))
    assert sock["Socket.ListenStream"] == ["/run/curio/cuzk.sock"]
    assert sock["Socket.SocketMode"] == ["0660"] and sock["Socket.Accept"] == ["no"]
    assert sock["Socket.FileDescriptorName"] == ["door"]
    service = _directives(UNIT.read_text(encoding="utf-8"))
    for key in ("Unit.Wants", "Unit.After"):
        assert "cuzkd.socket" in " ".join(service[key]).split(), key
    assert SOCKET_UNIT.stem == UNIT.stem, "systemd passes a socket unit's fds by name"
    assert not {"Unit.BindsTo", "Unit.PartOf", "Unit.Requires"} & set(service)
    # a RuntimeDirectory= is removed at every stop: /run/curio must not be one
    assert "curio" not in service["Service.RuntimeDirectory"][0].split()


def test_verify_catches_a_broken_unit(tmp_path: Path) -> None:
    """The check above is not vacuous: a misspelt directive makes verify complain."""
    text = UNIT.read_text(encoding="utf-8").replace("KillMode=mixed", "KilMode=mixed")
    result = _systemd_analyze("verify", str(_runnable_copy(tmp_path, text)))
    assert "KilMode" in result.stdout + result.stderr


def _exposure(tmp_path: Path) -> float:
    result = _systemd_analyze("security", "--offline=true", str(_runnable_copy(tmp_path)))
    if "--offline" in result.stderr and "unrecognized" in result.stderr:
        pytest.skip(f"this systemd has no offline security analysis: {result.stderr.strip()}")
    match = re.search(r"Overall exposure level for cuzkd\.service: (\d+\.\d+)", result.stdout)
    assert match, result.stdout + result.stderr
    return float(match.group(1))


def test_security_exposure_is_low_and_documented(tmp_path: Path) -> None:
    score = _exposure(tmp_path)
    assert score <= MAX_EXPOSURE
    docs = (ops.REPO / "docs" / "operations.md").read_text(encoding="utf-8")
    assert f"exposure score **{score:.1f}**" in docs, f"docs/operations.md must state {score}"
    readme = (ops.REPO / "README.md").read_text(encoding="utf-8")
    assert f"scores **{score:.1f}**" in readme, f"README's Install (systemd) must state {score}"


def test_unit_has_the_settings_cuzkd_relies_on() -> None:
    d = _directives(UNIT.read_text(encoding="utf-8"))
    expected = {
        "Service.Type": "notify", "Service.NotifyAccess": "main",
        "Service.Restart": "on-failure", "Service.KillMode": "mixed",
        "Service.StateDirectory": "cuzkd", "Service.RuntimeDirectory": "cuzkd",
        "Service.ConfigurationDirectory": "cuzkd", "Service.DevicePolicy": "closed",
        "Service.NoNewPrivileges": "yes", "Service.ProtectSystem": "strict",
        "Service.ProtectHome": "yes", "Service.PrivateTmp": "yes",
        "Service.ProtectKernelTunables": "yes", "Service.ProtectKernelModules": "yes",
        "Service.ProtectKernelLogs": "yes", "Install.WantedBy": "multi-user.target",
    }
    for key, value in expected.items():
        assert d[key] == [value], key
    assert parse_duration(d["Service.WatchdogSec"][0]) > 0
    assert d["Service.ExecStart"] == [f"{SHIPPED_BINARY} run --config /etc/cuzkd/cuzkd.toml"]
    args = build_parser().parse_args(d["Service.ExecStart"][0].split()[1:])
    assert args.command == "run" and args.config == "/etc/cuzkd/cuzkd.toml"
    # a reload that waits for its outcome, on the same file (see the unit's comment)
    assert d["Service.ExecReload"] == [f"{SHIPPED_BINARY} reload --config /etc/cuzkd/cuzkd.toml"]
    args = build_parser().parse_args(d["Service.ExecReload"][0].split()[1:])
    assert args.command == "reload" and args.config == "/etc/cuzkd/cuzkd.toml"
    assert d["Service.RestrictAddressFamilies"] == ["AF_UNIX AF_INET AF_INET6"]
    assert d["Service.SystemCallFilter"][0] == "@system-service"
    assert d["Service.CapabilityBoundingSet"] == [""]
    assert all("nvidia" in a for a in d["Service.DeviceAllow"]) and d["Service.DeviceAllow"]
    assert "PrivateDevices" not in {k.split(".")[1] for k in d}, "would hide /dev/nvidia*"


def test_stop_timeout_exceeds_shutdown_grace_of_the_shipped_config() -> None:
    d = _directives(UNIT.read_text(encoding="utf-8"))
    config = load_config(UNIT_CONFIG)
    assert parse_duration(d["Service.TimeoutStopSec"][0]) > config.supervisor.shutdown_grace
    # shutdown_grace caps every engine's stop sequence: a shutdown drains for what the grace
    # leaves after stop_timeout, which check-config keeps within it: so systemd's SIGKILL never
    # cuts a stop sequence short.
    assert all(e.stop_timeout <= config.supervisor.shutdown_grace for e in config.engine)
    assert state_dir(config) == Path("/var/lib/cuzkd"), "the unit's StateDirectory"
    assert config.metrics.listen.startswith("127.0.0.1:")


def _shipped_cuzk_engine(tmp_path: Path) -> Config:
    """systemd/cuzkd.toml with its commented cuzk engine uncommented, reading the shipped
    systemd/cuzk.toml where the install puts it (/etc/cuzkd/cuzk.toml)."""
    lines = UNIT_CONFIG.read_text(encoding="utf-8").splitlines()
    start = lines.index("# [[engine]]")
    block = [line.removeprefix("# ") for line in lines[start:] if line.startswith("# ")]
    text = "\n".join([*lines[:start], *block]).replace(INSTALLED_CUZK, str(CUZK_CONFIG))
    path = tmp_path / "cuzkd.toml"
    path.write_text(text + "\n", encoding="utf-8")
    return load_config(path)


def test_the_shipped_cuzk_engine_runs_as_cuzk_takes_it_where_the_unit_lets_it(
        tmp_path: Path) -> None:
    config = _shipped_cuzk_engine(tmp_path)
    [engine] = config.engine
    assert engine.cuzk and engine.command is not None
    # cuzk-daemon takes -c/--config, -l/--listen and --log-level, each with a value: nothing
    # else (no `run`, no --version: clap's usage error, exit 2).
    flags = engine.command[1::2]
    assert set(flags) <= {"-c", "--config", "-l", "--listen", "--log-level"}, flags
    assert len(engine.command[1:]) == 2 * len(flags)
    assert engine.cuzk_file is not None and engine.cuzk_file.path == str(CUZK_CONFIG)
    assert Path(INSTALLED_CUZK).parent == Path("/etc/cuzkd"), "the ConfigurationDirectory"
    # the door's socket, where Curio dials, is the one cuzkd.socket holds; cuzk's private
    # one in the unit's state dir
    sock = _directives(SOCKET_UNIT.read_text(encoding="utf-8"))
    assert door_address(config, engine) == f"unix://{sock['Socket.ListenStream'][0]}"
    assert grpc_address(config, engine) == "unix:///var/lib/cuzkd/engines/cuzk0.grpc.sock"
    assert plan_doors(config)[0].socket_mode == 0o660  # group-writable: Curio's group connects
    # /status polled on loopback, and the engine's GPUs are cuzk's
    assert status_address(config, engine) == "http://127.0.0.1:9821/status"
    assert [int(g) for g in engine.gpus] == engine.cuzk_file.gpus.devices
    # a shutdown drains for what the grace leaves after stop_timeout: some must be left
    assert engine.stop_timeout < config.supervisor.shutdown_grace


def test_docs_show_the_shipped_units_stop_timeout() -> None:
    """docs/supervisor.md quotes the unit: its TimeoutStopSec must be the shipped one."""
    shipped = _directives(UNIT.read_text(encoding="utf-8"))["Service.TimeoutStopSec"]
    docs = (ops.REPO / "docs" / "supervisor.md").read_text(encoding="utf-8")
    quoted = re.findall(r"^TimeoutStopSec=(\S+)$", docs, flags=re.MULTILINE)
    assert quoted and all(parse_duration(q) == parse_duration(shipped[0]) for q in quoted)
