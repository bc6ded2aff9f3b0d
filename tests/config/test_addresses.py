"""Where a config puts things (cuzkd.config.addresses): each derived from the structs alone."""

from __future__ import annotations

from pathlib import Path

import pytest

from cuzkd.config import load_config
from cuzkd.config.addresses import (
    control_socket,
    default_state_dir,
    door_address,
    engine_command,
    grpc_address,
    private_grpc_address,
    state_dir,
    status_address,
)
from cuzkd.config.schema import Config, EngineConfig, SupervisorConfig


def test_every_address_follows_the_state_dir_the_structs_name() -> None:
    """Built from structs, no file: the addresses are functions of the config alone."""
    engine = EngineConfig(name="b0", door="")
    config = Config(supervisor=SupervisorConfig(state_dir="/srv/s"), engine=[engine])
    assert state_dir(config) == Path("/srv/s")
    assert control_socket(config) == Path("/srv/s/control.sock")
    assert door_address(config, engine) == "unix:///srv/s/b0.door.sock"
    assert status_address(config, engine) == "unix:/srv/s/engines/b0.sock"
    assert grpc_address(config, engine) == "unix:///srv/s/engines/b0.grpc.sock"
    assert engine_command(config, engine)[-4:] == [
        "--listen", "unix:/srv/s/engines/b0.sock",
        "--grpc-listen", "unix:///srv/s/engines/b0.grpc.sock"]


def test_a_bundled_engine_has_a_private_grpc_address_it_does_not_serve_by_default(
        tmp_path: Path) -> None:
    """The address a door will dial a bundled engine at; ``cuzkd run`` does not pass it yet."""
    path = tmp_path / "m.toml"
    path.write_text('[supervisor]\nstate_dir = "/srv/cuzkd"\n[[engine]]\nname = "gpu0"\n')
    config = load_config(path)
    (gpu0,) = config.engine
    assert private_grpc_address(config, gpu0) == "unix:///srv/cuzkd/engines/gpu0.grpc.sock"
    assert "--grpc-listen" not in engine_command(config, gpu0)


def test_the_default_state_dir_is_the_one_systemd_made(monkeypatch: pytest.MonkeyPatch,
                                                       tmp_path: Path) -> None:
    monkeypatch.setenv("STATE_DIRECTORY", f"{tmp_path}/cuzkd:{tmp_path}/other")
    assert default_state_dir() == tmp_path / "cuzkd"
    assert control_socket(Config()) == tmp_path / "cuzkd" / "control.sock"
    monkeypatch.delenv("STATE_DIRECTORY")
    assert default_state_dir() != tmp_path / "cuzkd"
