"""A bundled engine behind a front door: off unless its ``door`` says so (no Curio dials a
bundled engine), on for each bundled engine under ``cuzkd run --demo``; behind it the engine
serves cuzk's gRPC on its private socket (``cuzkd engine --grpc-listen``) and drains by the
door's count. Every mistake refused naming the file and the key."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from cuzkd.config import demo_config, load_config, parse_config
from cuzkd.config.addresses import door_address, engine_command, grpc_address
from cuzkd.config.doors import plan_doors
from cuzkd.errors import ConfigError


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "cuzkd.toml"
    path.write_text(f'[supervisor]\nstate_dir = "{tmp_path}/state"\n{text}')
    return path


def _private(tmp_path: Path, name: str) -> str:
    return f"unix://{tmp_path}/state/engines/{name}.grpc.sock"


@pytest.mark.parametrize(("door", "address"), [
    ("", "unix://{tmp}/state/b.door.sock"),  # on, in the state dir
    ("127.0.0.1:9820", "127.0.0.1:9820"),
    ("unix://{tmp}/curio.sock", "unix://{tmp}/curio.sock"),
])
def test_a_bundled_engine_behind_a_door_serves_grpc_on_its_private_socket(
        tmp_path: Path, door: str, address: str) -> None:
    config = load_config(_write(tmp_path, f'[[engine]]\nname = "b"\n'
                                          f'door = "{door.format(tmp=tmp_path)}"\n'))
    [engine] = config.engine
    assert door_address(config, engine) == address.format(tmp=tmp_path)  # what Curio dials
    assert grpc_address(config, engine) == _private(tmp_path, "b")  # what the door dials
    argv = engine_command(config, engine)
    assert argv[argv.index("--listen") + 1] == f"unix:{tmp_path}/state/engines/b.sock"
    assert argv[argv.index("--grpc-listen") + 1] == _private(tmp_path, "b")
    assert engine.drain_mode == "door"
    assert [(d.address, d.engines) for d in plan_doors(config)] == [
        (address.format(tmp=tmp_path), ("b",))]


def test_the_demo_puts_each_bundled_engine_behind_a_door_of_its_own(tmp_path: Path) -> None:
    config = load_config(_write(tmp_path, (
        '[[engine]]\nname = "b0"\n'
        '[[engine]]\nname = "b1"\ndoor = "off"\n'
        '[[engine]]\nname = "b2"\ndoor = "127.0.0.1:9820"\n'
        '[[engine]]\nname = "p"\ncommand = ["prover"]\n')))
    b0 = config.engine[0]  # without --demo, unset is off: no door, no gRPC, its HTTP drain
    assert door_address(config, b0) is None and grpc_address(config, b0) is None
    assert "--grpc-listen" not in engine_command(config, b0) and b0.drain_mode == "http"
    assert [d.engines for d in plan_doors(config)] == [("b2",)]
    demo = demo_config(config)
    assert demo.demo and not config.demo
    assert [door_address(demo, e) for e in demo.engine] == [
        f"unix://{tmp_path}/state/b0.door.sock", None, "127.0.0.1:9820", None]
    assert engine_command(demo, demo.engine[0])[-3:] == [
        "--grpc-listen", _private(tmp_path, "b0"), "--demo"]
    assert [e.drain_mode for e in demo.engine] == ["door", "http", "door", "none"]
    assert [d.engines for d in plan_doors(demo)] == [("b0",), ("b2",)]
    assert demo_config(demo) == demo  # a reload under --demo: the same doors


def test_the_demos_doors_keep_the_door_rules() -> None:
    """The doors --demo adds are checked as a file's are: the private gRPC socket needs an
    absolute state dir."""
    config = parse_config({"supervisor": {"state_dir": "rel"}, "engine": [{"name": "b"}]},
                          "x.toml")
    with pytest.raises(ConfigError, match=r"^x.toml: key `supervisor.state_dir`: 'rel' is "
                                          "relative: the private gRPC socket of engine 'b'"):
        demo_config(config)


@pytest.mark.parametrize(("keys", "key", "problem"), [
    ('door = "unix://{tmp}/state/engines/b.door.sock"', "engine[0].door",
     "among cuzkd's private engine sockets"),
    ('door = "127.0.0.1:9822"', "engine[0].door", "binds the address .*metrics.listen"),
    ('door = "off"\ndrain = "door"', "engine[0].drain", "whose door is on"),
])
def test_a_bundled_engines_bad_door_is_refused(tmp_path: Path, keys: str, key: str,
                                               problem: str) -> None:
    path = _write(tmp_path, f'[metrics]\nlisten = "127.0.0.1:9822"\n'
                            f'[[engine]]\nname = "b"\n{keys.format(tmp=tmp_path)}\n')
    with pytest.raises(ConfigError, match=rf"^{path}: key `{re.escape(key)}`: .*{problem}"):
        load_config(path)
