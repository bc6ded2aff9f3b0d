"""The front door's configuration: a cuzk engine's door on by default at cuzk's ``[daemon]
listen``, the engine moved to a private socket with ``--listen``, the plan each door is served
from, and every mistake refused (exit 78) or noticed naming the file and the key."""

from __future__ import annotations

import grp
import os
import stat
from pathlib import Path

import pytest

from cuzkd.cli.dispatch import main as dispatch_main
from cuzkd.config import Config, load_config
from cuzkd.config.addresses import door_address, engine_command, grpc_address
from cuzkd.config.doors import DoorPlan, plan_doors
from cuzkd.errors import ConfigError
from cuzkd.supervisor.engines.launch import EngineLaunch

MIB = 2**20


def _cuzk_file(tmp_path: Path, name: str, status_port: int) -> Path:
    path = tmp_path / f"{name}.toml"
    path.write_text(f'[daemon]\nlisten = "unix://{tmp_path}/{name}.sock"\n'
                    f'status_listen = "127.0.0.1:{status_port}"\n'
                    '[memory]\ntotal_budget = "100GiB"\n')
    return path


def _cuzk_engine(tmp_path: Path, extra: str = "", *, name: str = "c0", args: str = "",
                 status_port: int = 9821) -> str:
    cuzk = _cuzk_file(tmp_path, name, status_port)
    return (f'[[engine]]\nname = "{name}"\ntype = "cuzk"\n'
            f'command = ["cuzk-daemon", "-c", "{cuzk}"{args}]\n{extra}\n')


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "cuzkd.toml"
    path.write_text(f'[supervisor]\nstate_dir = "{tmp_path}/state"\n{text}')
    return path


def _load(tmp_path: Path, text: str) -> Config:
    return load_config(_write(tmp_path, text))


def test_a_cuzk_engines_door_is_on_at_cuzks_listen_and_cuzk_moves_to_a_private_socket(
        tmp_path: Path) -> None:
    config = _load(tmp_path, _cuzk_engine(tmp_path, args=', "--log-level", "debug"'))
    [engine] = config.engine
    private = f"unix://{tmp_path}/state/engines/c0.grpc.sock"
    assert door_address(config, engine) == f"unix://{tmp_path}/c0.sock"  # what Curio dials
    assert grpc_address(config, engine) == private  # what the runner polls and the door dials
    assert engine_command(config, engine) == [
        "cuzk-daemon", "-c", str(tmp_path / "c0.toml"), "--log-level", "debug",
        "--listen", private]
    assert engine.drain_mode == "door"
    # drain_timeout 180 + start_timeout 30 (cuzk's type defaults) + backoff_max 30 + 60
    assert plan_doors(config) == (DoorPlan(
        address=f"unix://{tmp_path}/c0.sock", engines=("c0",), hold_timeout=300.0,
        hold_max_calls=1024, hold_max_bytes=2 << 30, retry_max_bytes=1 << 30,
        socket_mode=0o660, socket_group="",
        deadlines={"winning-post": 20.0, "window-post": 1200.0},
        allowances={"winning-post": 5.0, "window-post": 120.0}, quarantine=3600.0,
        one_post=frozenset({"c0"}), max_message_bytes=128 * MIB),)
    assert plan_doors(config)[0].name == "c0"
    assert config.notices == ()


@pytest.mark.parametrize("bundled", [False, True])
def test_a_spawn_behind_a_door_readies_the_private_sockets_directory(
        tmp_path: Path, bundled: bool) -> None:
    """cuzk binds its --listen socket but makes no directory for it, nor does a bundled
    engine for its --grpc-listen one (its HTTP API on TCP here, so no status socket makes
    it): each spawn makes the state dir's engines/ (private) and removes a stale socket."""
    name = "b" if bundled else "c0"
    engine = (f'[[engine]]\nname = "{name}"\nlisten = "127.0.0.1:0"\ndoor = ""\n' if bundled
              else _cuzk_engine(tmp_path))
    config = _load(tmp_path, engine)
    launch = EngineLaunch(config.engine[0], config, lambda: "cuzk-daemon", None)
    assert launch.argv == engine_command(config, config.engine[0])
    launch.prepare()
    engines = tmp_path / "state" / "engines"
    assert stat.S_IMODE(engines.stat().st_mode) == 0o700
    (engines / f"{name}.grpc.sock").write_text("stale")
    launch.prepare()
    assert list(engines.iterdir()) == []


def test_door_off_leaves_the_engine_where_cuzk_listens(tmp_path: Path) -> None:
    config = _load(tmp_path, _cuzk_engine(tmp_path, 'door = "off"',
                                          args=', "-l", "127.0.0.1:9820"'))
    [engine] = config.engine
    assert door_address(config, engine) is None and plan_doors(config) == ()
    assert grpc_address(config, engine) == "127.0.0.1:9820"
    assert engine_command(config, engine)[-2:] == ["-l", "127.0.0.1:9820"]
    assert engine.drain_mode == "cuzk"


def test_another_door_address_and_the_door_table(tmp_path: Path) -> None:
    group = grp.getgrgid(os.getgid()).gr_name
    config = _load(tmp_path, (
        f'[door]\nhold_timeout = "10m"\nhold_max_calls = 8\nhold_max_bytes = "1GiB"\n'
        f'retry_max_bytes = "512MiB"\nsocket_mode = "0600"\nsocket_group = "{group}"\n'
        + _cuzk_engine(tmp_path, 'door = "127.0.0.1:9820"', args=', "--", "x"')
        + _cuzk_engine(tmp_path, f'door = "unix://{tmp_path}/run/../c1door.sock"\n'
                                 'drain_timeout = "20m"', name="c1", status_port=9831)))
    first, second = config.engine
    assert [door_address(config, e) for e in config.engine] == [
        "127.0.0.1:9820", f"unix://{tmp_path}/run/../c1door.sock"]
    # cuzk takes no options after `--`: the private address goes before it
    assert engine_command(config, first)[-4:] == [
        "--listen", f"unix://{tmp_path}/state/engines/c0.grpc.sock", "--", "x"]
    assert grpc_address(config, second) == f"unix://{tmp_path}/state/engines/c1.grpc.sock"
    assert [(d.address, d.engines, d.hold_timeout, d.hold_max_calls, d.hold_max_bytes,
             d.retry_max_bytes, d.socket_mode, d.socket_group) for d in plan_doors(config)] == [
        ("127.0.0.1:9820", ("c0",), 600.0, 8, 1 << 30, 512 * MIB, 0o600, group),
        (f"unix://{tmp_path}/run/../c1door.sock", ("c1",), 600.0, 8, 1 << 30, 512 * MIB,
         0o600, group)]
    # unset, each door's hold outlasts a restart of its own engine
    unset = _load(tmp_path, _cuzk_engine(tmp_path) + _cuzk_engine(
        tmp_path, f'door = "unix://{tmp_path}/c1door.sock"\ndrain_timeout = "20m"', name="c1",
        status_port=9831))
    assert [d.hold_timeout for d in plan_doors(unset)] == [300.0, 1200.0 + 30 + 30 + 60]


# (engine's extra keys, other tables, key named, words) -- every refusal exits 78
REFUSED = [
    ('door = "unix:/run/x.sock"', "", "engine[0].door", "unix:///ABSOLUTE/PATH"),
    ('door = "unix://run/x.sock"', "", "engine[0].door", "unix:///ABSOLUTE/PATH"),
    ('door = "unix:///' + "x" * 120 + '"', "", "engine[0].door", "the kernel's limit"),
    ('door = "localhost"', "", "engine[0].door", "neither unix:///PATH nor HOST:PORT"),
    ('door = "127.0.0.1:0"', "", "engine[0].door", "a port above 0"),
    ('door = "a host:9820"', "", "engine[0].door", "neither unix:///PATH nor HOST:PORT"),
    ('door = "127.0.0.1:9822"', "", "engine[0].door",
     "binds the address {path}: key `metrics.listen`"),
    ('door = "0.0.0.0:9822"', "", "engine[0].door", "binds the address"),
    ('door = "127.0.0.1:9821"', "", "engine[0].door",  # its own cuzk's status listener
     "binds the address {dir}/c0.toml: key `daemon.status_listen`"),
    ('door = "unix://{dir}/state/engines/c1.sock"', "", "engine[0].door",
     "among cuzkd's private engine sockets"),
    ('door = "unix://{dir}/state/control.sock"', "", "engine[0].door",
     "binds the address {path}: key `supervisor.state_dir` (the control socket)"),
    ('door = "unix://{dir}/b.sock"', '[[engine]]\nname = "b"\nlisten = "unix:{dir}/b.sock"\n',
     "engine[1].listen", "on the address of {path}: key `engine[0].door`, and one of them is "
                         "a front door"),
    ("", "[door]\nhold_timeout = \"30m\"\n", "door.hold_timeout", "Curio's ProveTimeout"),
    ('door = "off"', "[door]\nhold_timeout = \"1h\"\n", "door.hold_timeout",
     "3600s is not below Curio's ProveTimeout"),  # wrong with or without a door
    ('drain_timeout = "1700s"', "", "door.hold_timeout",
     "unset, it is 1820s for the door of engine 'c0' (the longest drain_timeout"),
    ("", "[door]\nhold_timeout = \"0s\"\n", "door.hold_timeout", "greater than zero"),
    ("", "[door]\nhold_max_bytes = 0\n", "door.hold_max_bytes", "greater than zero"),
    ("", "[door]\nhold_max_calls = 0\n", "door.hold_max_calls", ">= 1"),
    ("", "[door]\nsocket_mode = \"0666\"\n", "door.socket_mode", "world-writable"),
    ("", "[door]\nsocket_mode = \"777\"\n", "door.socket_mode", "world-writable"),
    ("", "[door]\nsocket_mode = \"0440\"\n", "door.socket_mode", "neither the owner nor"),
    ("", "[door]\nsocket_mode = \"0o660\"\n", "door.socket_mode", "not an octal"),
    ("", "[door]\nsocket_mode = \"4660\"\n", "door.socket_mode", "not an octal"),
    ("", "[door]\nsocket_mode = \"rw\"\n", "door.socket_mode", "not an octal"),
    ("", "[door]\nbacklog = 5\n", "door.backlog", "unknown key"),
    ('door = "off"\ndrain = "door"', "", "engine[0].drain", "whose door is on"),
]


@pytest.mark.parametrize(("extra", "tables", "key", "words"), REFUSED)
def test_each_door_mistake_is_refused_naming_file_and_key(tmp_path: Path, extra: str,
                                                          tables: str, key: str,
                                                          words: str) -> None:
    path = _write(tmp_path, _cuzk_engine(tmp_path, extra.format(dir=tmp_path))
                  + tables.format(dir=tmp_path))
    with pytest.raises(ConfigError) as err:
        load_config(path)
    msg = str(err.value)
    assert msg.startswith(f"{path}: key `{key}`"), msg
    assert words.format(dir=tmp_path, path=path) in msg, msg


@pytest.mark.parametrize("args", [
    ', "-l", "127.0.0.1:9820"', ', "--listen", "127.0.0.1:9820"',
    ', "--listen=unix:///tmp/x.sock"', ', "-lunix:///tmp/x.sock"'])
def test_a_command_with_its_own_listen_is_refused_while_the_door_is_on(tmp_path: Path,
                                                                       args: str) -> None:
    path = _write(tmp_path, _cuzk_engine(tmp_path, args=args))
    with pytest.raises(ConfigError, match=rf"^{path}: key `engine\[0\]\.command`: passes cuzk "
                                          r"--listen .* door is on.*door = \"off\""):
        load_config(path)


@pytest.mark.parametrize("engine", [
    '[[engine]]\nname = "p"\ncommand = ["prover"]\ndoor = "off"\n',
    '[[engine]]\nname = "p"\ncommand = ["prover"]\ndoor = "127.0.0.1:9820"\n'])
def test_a_door_on_an_engine_that_is_not_cuzk_is_refused(tmp_path: Path, engine: str) -> None:
    path = _write(tmp_path, engine)
    with pytest.raises(ConfigError, match=rf"^{path}: key `engine\[0\]\.door`: only for type "
                                          "\"cuzk\" or \"bundled\""):
        load_config(path)


def test_engines_naming_one_door_share_it_with_the_longest_hold(tmp_path: Path) -> None:
    """One cuzk per GPU, each pinned with its own config (the same proof kinds), all naming
    Curio's address: one door (one plan, in config order), its hold outlasting the slowest."""
    door = f'door = "unix://{tmp_path}/curio.sock"'
    config = _load(tmp_path, _cuzk_engine(tmp_path, door) + _cuzk_engine(
        tmp_path, door.replace("curio.sock", "./curio.sock") + "\nstart_timeout = 100",
        name="c1", status_port=9831))
    [plan] = plan_doors(config)
    assert (plan.address, plan.engines, plan.name) == (
        f"unix://{tmp_path}/curio.sock", ("c0", "c1"), "c0")
    assert plan.hold_timeout == 180 + 100 + 30 + 60  # c1's restart is the longer
    assert [door_address(config, e) for e in config.engine] == [
        f"unix://{tmp_path}/curio.sock", f"unix://{tmp_path}/./curio.sock"]
    assert len({grpc_address(config, e) for e in config.engine}) == 2  # private: one each


def test_engines_whose_cuzk_files_name_one_listen_share_its_door(tmp_path: Path) -> None:
    shared = f'listen = "unix://{tmp_path}/curio.sock"'
    for name, port in (("c0", 9821), ("c1", 9831)):
        (tmp_path / f"{name}.toml").write_text(
            f'[daemon]\n{shared}\nstatus_listen = "127.0.0.1:{port}"\n'
            f'[gpus]\ndevices = [{name[1]}]\n[memory]\ntotal_budget = "100GiB"\n')
    engines = "".join(f'[[engine]]\nname = "{n}"\ntype = "cuzk"\n'
                      f'command = ["cuzk-daemon", "-c", "{tmp_path}/{n}.toml"]\n'
                      for n in ("c0", "c1"))
    config = load_config(_write(tmp_path, engines))
    assert [p.engines for p in plan_doors(config)] == [("c0", "c1")]


@pytest.mark.parametrize(("second", "problem"), [
    # the door off on one: its cuzk binds the very address the other's door does
    ('door = "off"', r"key `daemon\.listen` \(the cuzk_config of .*: engine\[1\]\): on the "
                     r"address of .*key `engine\[0\]\.door`, and one of them is a front "
                     r"door: a door is shared only by type \"cuzk\" engines whose doors are "
                     "all on"),
    # a wildcard door on the port of a loopback one: two servers, not one door
    ('door = "0.0.0.0:9900"', r"key `engine\[1\]\.door`: overlaps the door address of .*"
                              r"key `engine\[0\]\.door`.*only at the very same address"),
])
def test_a_door_shared_with_a_door_turned_off_or_a_near_address_is_refused(
        tmp_path: Path, second: str, problem: str) -> None:
    first = ('door = "127.0.0.1:9900"' if "0.0.0.0" in second
             else f'door = "unix://{tmp_path}/c1.sock"')
    path = _write(tmp_path, _cuzk_engine(tmp_path, first) + _cuzk_engine(
        tmp_path, second, name="c1", status_port=9831))
    with pytest.raises(ConfigError, match=problem):
        load_config(path)


@pytest.mark.parametrize(("other", "key"), [
    ('[[engine]]\nname = "b"\nlisten = "unix:{dir}/curio.sock"\n', "listen"),
    ('[[engine]]\nname = "p"\ncommand = ["prover"]\n'
     'status_url = "http://127.0.0.1:9900/status"\n', "status_url"),
])
def test_a_door_shared_with_an_engine_not_of_type_cuzk_is_refused_naming_both(
        tmp_path: Path, other: str, key: str) -> None:
    door = ('"127.0.0.1:9900"' if key == "status_url" else f'"unix://{tmp_path}/curio.sock"')
    path = _write(tmp_path, _cuzk_engine(tmp_path, f"door = {door}")
                  + other.format(dir=tmp_path))
    with pytest.raises(ConfigError, match=rf"^{path}: key `engine\[1\]\.{key}`: on the address"
                                          rf" of {path}: key `engine\[0\]\.door`, and one of "
                                          r"them is a front door: .* only by type \"cuzk\""):
        load_config(path)
    assert dispatch_main(["check-config", str(path)]) == 78


def test_a_state_dir_the_private_socket_cannot_live_in_is_refused_behind_a_door(
        tmp_path: Path) -> None:
    path = tmp_path / "cuzkd.toml"
    path.write_text('[supervisor]\nstate_dir = "state"\n' + _cuzk_engine(tmp_path))
    with pytest.raises(ConfigError, match=rf"^{path}: key `supervisor\.state_dir`: 'state' "
                                          "is relative"):
        load_config(path)
    path.write_text('[supervisor]\nstate_dir = "state"\n'
                    + _cuzk_engine(tmp_path, 'door = "off"'))
    assert plan_doors(load_config(path)) == ()
    path.write_text(f'[supervisor]\nstate_dir = "/{"s" * 90}"\n' + _cuzk_engine(tmp_path))
    with pytest.raises(ConfigError, match=rf"^{path}: key `supervisor\.state_dir`: engine 'c0''s "
                                          "private gRPC socket path .* the kernel's limit"):
        load_config(path)


def test_a_socket_group_is_looked_up_by_the_daemon_not_by_client_commands(
        tmp_path: Path) -> None:
    path = _write(tmp_path, '[door]\nsocket_group = "no-such-group-cuzkd"\n'
                  + _cuzk_engine(tmp_path))
    with pytest.raises(ConfigError, match=rf"^{path}: key `door\.socket_group`: no group "
                                          "'no-such-group-cuzkd' on this host"):
        load_config(path)
    doors = plan_doors(load_config(path, resolve_hosts=False))
    assert doors[0].socket_group == "no-such-group-cuzkd"


@pytest.mark.parametrize(("extra", "tables", "key", "words"), [
    ('door = "0.0.0.0:9820"', "", "engine[0].door", "an unauthenticated Prove on a rented IP"),
    ('door = "[::]:9820"', "", "engine[0].door", "an unauthenticated Prove on a rented IP"),
    ("", '[door]\nhold_timeout = "100s"\n', "door.hold_timeout",
     "100s is shorter than engine 'c0''s drain_timeout + start_timeout + backoff_max (240s)"),
    ("", '[door]\nretry_max_bytes = "64MiB"\n', "door.retry_max_bytes",
     "64.0 MiB is less than one maximal request (128.0 MiB, cuzk's limit): a request that "
     "large is not retried"),
    ("", '[door]\nhold_max_bytes = "100MiB"\n', "door.hold_max_bytes",
     "100.0 MiB is less than one maximal request (128.0 MiB, cuzk's limit): a request that "
     "large is not held"),
])
def test_what_a_door_is_accepted_with_is_noticed(tmp_path: Path, extra: str, tables: str,
                                                 key: str, words: str) -> None:
    config = _load(tmp_path, tables + _cuzk_engine(tmp_path, extra))
    [notice] = config.notices
    assert notice.startswith(f"{tmp_path}/cuzkd.toml: key `{key}`: "), notice
    assert words in notice, notice
    # no door, nothing to say about [door]
    off = _load(tmp_path, tables + _cuzk_engine(tmp_path, 'door = "off"'))
    assert off.notices == ()


#: what check-config says of each door's deadline calls by default
DEADLINES = ("  deadlines ([metrics] proof_deadlines, [door] proving_allowance): winning-post "
             "within 20s (sent by 15s), window-post within 1200s (sent by 1080s)")


def test_check_config_shows_each_door_and_its_notices(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _write(tmp_path, _cuzk_engine(tmp_path, 'door = "0.0.0.0:9820"')
                  + _cuzk_engine(tmp_path, name="c1", status_port=9831))
    assert dispatch_main(["check-config", str(path)]) == 0
    out, err = capsys.readouterr()
    assert out.splitlines() == [
        f"{path}: OK (2 engine(s): c0, c1)",
        "door 0.0.0.0:9820 -> c0 (hold_timeout 300s)",
        DEADLINES,
        "  one PoSt at a time: c0",
        f"door unix://{tmp_path}/c1.sock -> c1 (hold_timeout 300s)",
        DEADLINES,
        "  one PoSt at a time: c1"]
    assert f"warning: {path}: key `engine[0].door`: " in err
    path.write_text(path.read_text() + '[door]\nsocket_mode = "0666"\n')
    assert dispatch_main(["check-config", str(path)]) == 78
    assert "key `door.socket_mode`" in capsys.readouterr().err
