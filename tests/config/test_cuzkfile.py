"""Engine type cuzk: its addresses read from cuzk's own TOML, and what cuzk would get wrong
silently refused, naming cuzk's file and key; check-config and run exit 78."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from cuzkd.config import Config, load_config
from cuzkd.config.addresses import door_address, grpc_address, state_dir, status_address
from cuzkd.config.cuzkfile import (
    DEFAULT_CUZK_CONFIG,
    cuzk_config_path,
    cuzk_size,
    synthesis_capacity,
)
from cuzkd.errors import ConfigError

GOOD_CUZK = '[daemon]\nlisten = "unix://{dir}/cuzk.sock"\nstatus_listen = "127.0.0.1:9821"\n'


def _engine(name: str, cuzk: Path, extra: str = "") -> str:
    return (f'[[engine]]\nname = "{name}"\ntype = "cuzk"\n'
            f'command = ["cuzk-daemon", "-c", "{cuzk}"]\n{extra}')


def _load(tmp_path: Path, cuzk_text: str, engine_extra: str = "") -> Config:
    cuzk = tmp_path / "cuzk.toml"
    cuzk.write_text(cuzk_text.format(dir=tmp_path))
    path = tmp_path / "cuzkd.toml"
    path.write_text(_engine("c0", cuzk, engine_extra))
    return load_config(path)


@pytest.mark.parametrize(("status_listen", "polled"), [
    ("127.0.0.1:9821", "http://127.0.0.1:9821/status"),
    ("0.0.0.0:9821", "http://127.0.0.1:9821/status"),
    ("[::]:9821", "http://[::1]:9821/status"),
    ("[::1]:9900", "http://[::1]:9900/status"),
    ("localhost:9821", "http://localhost:9821/status"),
])
def test_the_status_address_comes_from_cuzks_status_listen(tmp_path: Path, status_listen: str,
                                                           polled: str) -> None:
    config = _load(tmp_path, f'[daemon]\nstatus_listen = "{status_listen}"\n')
    engine = config.engine[0]
    assert status_address(config, engine) == polled
    # the door takes cuzk's default gRPC address, as cuzk writes it; cuzk gets a private one
    assert door_address(config, engine) == "unix:///run/curio/cuzk.sock"
    assert grpc_address(config, engine) == f"unix://{state_dir(config)}/engines/c0.grpc.sock"
    assert engine.drain_mode == "door"  # a stop waits until the door has nothing in flight
    door_off = _load(tmp_path, f'[daemon]\nstatus_listen = "{status_listen}"\n', 'door = "off"')
    assert grpc_address(door_off, door_off.engine[0]) == "unix:///run/curio/cuzk.sock"
    assert door_off.engine[0].drain_mode == "cuzk"  # no job held, in /status and gRPC


def test_max_parallel_synthesis_is_read_and_gives_cuzks_real_synthesis_cap(
        tmp_path: Path) -> None:
    """cuzk's cap is min(budget / 14 GiB, [pipeline] max_parallel_synthesis (0: 18)), at
    least 2 -- not the budget / 9 GiB its /status reports as max_concurrent."""
    assert _load(tmp_path, GOOD_CUZK).engine[0].cuzk_file.pipeline.max_parallel_synthesis == 18
    six = _load(tmp_path, GOOD_CUZK + "[pipeline]\nmax_parallel_synthesis = 6\n")
    assert six.engine[0].cuzk_file.pipeline.max_parallel_synthesis == 6
    gib = 2**30
    assert [synthesis_capacity(budget * gib, parallel) for budget, parallel in (
        (140, 18), (2000, 18), (2000, 0), (10, 18), (256, 4), (0, 0))] == [10, 18, 18, 2, 4, 2]


def test_a_wildcard_status_listener_is_warned_about(tmp_path: Path) -> None:
    assert _load(tmp_path, GOOD_CUZK).notices == ()
    warnings = _load(tmp_path, '[daemon]\nstatus_listen = "0.0.0.0:9821"\n').notices
    assert len(warnings) == 1
    assert "every address" in warnings[0] and "job ids" in warnings[0]


def test_the_grpc_address_is_cuzks_listen_or_its_command_override(tmp_path: Path) -> None:
    """With the door off (behind a door see test_door_config)."""
    config = _load(tmp_path, GOOD_CUZK, 'door = "off"')
    assert grpc_address(config, config.engine[0]) == f"unix://{tmp_path}/cuzk.sock"
    cuzk = tmp_path / "cuzk.toml"
    path = tmp_path / "cuzkd.toml"
    path.write_text(f'[[engine]]\nname = "c0"\ntype = "cuzk"\ndoor = "off"\n'
                    f'command = ["cuzk-daemon", "--config={cuzk}", "-l", "127.0.0.1:9820"]\n'
                    '[[engine]]\nname = "demo"\n')
    config = load_config(path)
    cuzk_engine, bundled = config.engine
    assert grpc_address(config, cuzk_engine) == "127.0.0.1:9820"
    assert grpc_address(config, bundled) is None


@pytest.mark.parametrize(("command", "explicit", "path"), [
    (["cuzk-daemon", "-c", "/a.toml"], "", "/a.toml"),
    (["cuzk-daemon", "-c/a.toml"], "", "/a.toml"),
    (["cuzk-daemon", "-c=/a.toml"], "", "/a.toml"),
    (["cuzk-daemon", "--config", "/a.toml", "--log-level", "debug"], "", "/a.toml"),
    (["cuzk-daemon", "--config=/a.toml"], "", "/a.toml"),
    (["cuzk-daemon", "--log-level", "debug"], "", DEFAULT_CUZK_CONFIG),
    (["cuzk-daemon", "--", "-c", "/a.toml"], "", DEFAULT_CUZK_CONFIG),
    (["cuzk-daemon"], "/b.toml", "/b.toml"),
    (["cuzk-daemon", "-c", "/b.toml"], "/b.toml", "/b.toml"),
])
def test_the_cuzk_file_is_the_one_cuzk_reads(command: list[str], explicit: str,
                                             path: str) -> None:
    assert cuzk_config_path(explicit, command) == path


@pytest.mark.parametrize(("text", "size"), [
    ("256GiB", 256 * 2**30), (" 256 GiB ", 256 * 2**30), ("+2GiB", 2 * 2**30),
    ("626MiB", 626 * 2**20), ("500GB", 500 * 10**9), ("20MB", 20 * 10**6), ("1024", 1024),
    # What cuzk's parse_size does not read: it substitutes 50 GiB (0 for MiB/MB) silently.
    ("256G", None), ("1TiB", None), ("256gib", None), ("1.5GiB", None), ("", None),
    ("-1GiB", None), ("GiB", None), ("12 MiB x", None), (str(2**64) + "MB", None),
    (str(2**34) + "GiB", None),  # overflows u64 (wraps in a release build)
])
def test_sizes_are_read_with_cuzks_grammar(text: str, size: int | None) -> None:
    assert cuzk_size(text) == size


# (cuzk file, cuzkd engine's extra keys, where the message starts, key named, words)
CUZK = "{cuzk}"  # the cuzk file's path in the message
ENGINE = "{cuzkd}"  # the cuzkd file's
MISTAKES = [
    ("[daemon]\n", "", CUZK, "daemon.status_listen", "empty or missing"),
    ('[daemon]\nstatus_listen = ""\n', "", CUZK, "daemon.status_listen",
     'set status_listen = "127.0.0.1:9821"'),
    ('[daemon]\nstatus_listen = "9821"\n', "", CUZK, "daemon.status_listen", "HOST:PORT"),
    ("[daemon]\nstatus_listen = 9821\n", "", CUZK, "daemon.status_listen", "Expected str"),
    ('[daemon]\nstatus_listen = "127.0.0.1:9821"\nlisten = "unix:/run/c.sock"\n', "", CUZK,
     "daemon.listen", "unix:///ABSOLUTE/PATH"),
    ('[daemon]\nstatus_listen = "127.0.0.1:9821"\nlisten = "localhost:9820"\n', "", CUZK,
     "daemon.listen", "no host names"),
    ('[daemon]\nstatus_listen = "127.0.0.1:9821"\nlisten = "unix:///' + "s" * 110 + '"\n', "",
     CUZK, "daemon.listen", "the kernel's limit is 107"),
    (GOOD_CUZK + '[memory]\ntotal_budget = "256G"\n', "", CUZK, "memory.total_budget",
     "silently use 50 GiB"),
    (GOOD_CUZK + '[memory]\ntotal_budget = "1TiB"\n', "", CUZK, "memory.total_budget",
     '"256GiB"'),
    (GOOD_CUZK + '[memory]\ntotal_budget = "0GiB"\n', "", CUZK, "memory.total_budget",
     "0 bytes"),
    (GOOD_CUZK + '[memory]\nsafety_margin = "5G"\n', "", CUZK, "memory.safety_margin",
     "50 GiB back"),
    (GOOD_CUZK + "[gpus]\ndevices = [-1]\n", "", CUZK, "gpus.devices[0]", ">= 0"),
    (GOOD_CUZK, 'gpus = ["0"]\n', CUZK, "gpus.devices", "every GPU nvidia-smi lists"),
    (GOOD_CUZK + "[gpus]\ndevices = [1]\n", 'gpus = ["0"]\n', CUZK, "gpus.devices",
     "disagrees with the engine's gpus"),
    (GOOD_CUZK + "[gpus]\ndevices = [0]\n", 'gpus = ["GPU-1234"]\n', CUZK, "gpus.devices",
     "NVML indices"),
    (GOOD_CUZK, 'status_url = "http://127.0.0.1:9999/status"\n', ENGINE, "engine[0].status_url",
     "port 9999, not the port 9821"),
    (GOOD_CUZK, 'status_url = "http://10.0.0.1:9821/status"\n', ENGINE, "engine[0].status_url",
     "host '10.0.0.1'"),
    (GOOD_CUZK, 'status_url = "http://127.0.0.1:9821/metrics"\n', ENGINE,
     "engine[0].status_url", "only /status"),
    (GOOD_CUZK, 'status_url = "unix:/run/x.sock"\n', ENGINE, "engine[0].status_url",
     "not http://"),
    (GOOD_CUZK, 'cuzk_config = "/elsewhere.toml"\n', ENGINE, "engine[0].cuzk_config",
     "the command passes cuzk --config"),
    ('[daemon]\nstatus_listen = "127.0.0.1:9822"\n', "", CUZK, "daemon.status_listen",
     "binds the address " + ENGINE + ": key `metrics.listen` binds"),
    ('[daemon]\nstatus_listen = "127.0.0.1:9821"\nlisten = "0.0.0.0:9821"\n', "", CUZK,
     "daemon.listen", "binds the address"),
    ("[daemon\n", "", CUZK, "", "invalid TOML"),
    ("a = " + "[" * 100_000 + "\n", "", CUZK, "", "nested too deeply"),
    ('[daemon]\nstatus_listen = "127.0.0.1:\u0669\u0668\u0662\u0661"\n', "", CUZK,
     "daemon.status_listen", "HOST:PORT"),  # Arabic-Indic digits: not a port to cuzk
    ('[daemon]\nstatus_listen = "127.0.0.1:9821"\nlisten = "127.0.0.1:\u0669\u0668"\n', "",
     CUZK, "daemon.listen", "IP:PORT"),
    (b"[daemon]\nstatus_listen = \"\xff\"\n", "", CUZK, "", "not UTF-8"),
]


@pytest.mark.parametrize(("cuzk_text", "extra", "where", "key", "problem"), MISTAKES)
def test_each_cuzk_mistake_names_its_file_and_key(tmp_path: Path, cuzk_text: str | bytes,
                                                  extra: str, where: str, key: str,
                                                  problem: str) -> None:
    cuzk = tmp_path / "cuzk.toml"
    if isinstance(cuzk_text, bytes):
        cuzk.write_bytes(cuzk_text)
    else:
        cuzk.write_text(cuzk_text.format(dir=tmp_path))
    path = tmp_path / "cuzkd.toml"
    path.write_text(_engine("c0", cuzk, extra))
    with pytest.raises(ConfigError) as err:
        load_config(path)
    msg = str(err.value)
    start = where.format(cuzk=cuzk, cuzkd=path)
    assert msg.startswith(f"{start}: key `{key}`" if key else start), msg
    assert problem.format(cuzk=cuzk, cuzkd=path) in msg, msg
    if where == CUZK:  # and which cuzkd engine it belongs to
        assert f"the cuzk_config of {path}: engine[0]" in msg, msg


def test_a_missing_or_unreadable_cuzk_file_is_refused(tmp_path: Path) -> None:
    missing = tmp_path / "none.toml"
    path = tmp_path / "cuzkd.toml"
    path.write_text(_engine("c0", missing))
    with pytest.raises(ConfigError, match=f"^{missing} .*file not found"):
        load_config(path)
    path.write_text(_engine("c0", tmp_path))  # a directory
    with pytest.raises(ConfigError, match="not a regular file"):
        load_config(path)
    fifo = tmp_path / "fifo.toml"
    os.mkfifo(fifo)  # never opened for writing: the read must not wait for a writer
    path.write_text(_engine("c0", fifo))
    with pytest.raises(ConfigError, match="not a regular file"):
        load_config(path)


@pytest.mark.parametrize(("command", "key", "problem"), [
    ('["cuzk-daemon", "-c", "/a.toml", "--config", "/b.toml"]', "command", "2 times"),
    ('["cuzk-daemon", "-c"]', "command", "has no value"),
    ('["cuzk-daemon", "-c", "cuzk.toml"]', "cuzk_config", "relative"),
    ('["cuzk-daemon", "-c", "/a\\u0000b"]', "command", "NUL"),
    ('["cuzk-daemon", "-l", "a", "-l", "b"]', "command", "2 times"),
])
def test_a_command_cuzk_would_refuse_is_refused(tmp_path: Path, command: str, key: str,
                                                problem: str) -> None:
    path = tmp_path / "cuzkd.toml"
    path.write_text(f'[[engine]]\nname = "c0"\ntype = "cuzk"\ncommand = {command}\n')
    with pytest.raises(ConfigError, match=f"^{path}: key `engine\\[0\\].{key}`: .*{problem}"):
        load_config(path)


def _two_engines(tmp_path: Path, first: str, second: str) -> Path:
    files = []
    for name, text in (("a", first), ("b", second)):
        cuzk = tmp_path / f"{name}.toml"
        cuzk.write_text(text.format(dir=tmp_path, name=name))
        files.append(_engine(name, cuzk))
    path = tmp_path / "cuzkd.toml"
    path.write_text("".join(files))
    return path


OWN = ('[daemon]\nlisten = "unix://{dir}/{name}.sock"\nstatus_listen = "127.0.0.1:98{n}"\n'
       '[memory]\ntotal_budget = "{budget}"\n')


@pytest.mark.parametrize(("first", "second", "key", "problem"), [
    (OWN.format(dir="{dir}", name="{name}", n=21, budget="100GiB"),
     OWN.format(dir="{dir}", name="{name}", n=21, budget="100GiB"),
     "daemon.status_listen", "binds the address {dir}/a.toml: key `daemon.status_listen`"),
    (OWN.format(dir="{dir}", name="{name}", n=21, budget="100GiB"),
     '[daemon]\nstatus_listen = "0.0.0.0:9821"\nlisten = "unix://{dir}/b.sock"\n'
     '[memory]\ntotal_budget = "100GiB"\n',
     "daemon.status_listen", "binds the address"),
    (OWN.format(dir="{dir}", name="{name}", n=21, budget="auto"),
     OWN.format(dir="{dir}", name="{name}", n=31, budget="auto"),
     "memory.total_budget", "each cuzk would budget all of the host's RAM"),
])
def test_two_cuzk_engines_may_not_share(tmp_path: Path, first: str, second: str, key: str,
                                        problem: str) -> None:
    path = _two_engines(tmp_path, first, second)
    with pytest.raises(ConfigError) as err:
        load_config(path)
    msg = str(err.value)
    assert msg.startswith(f"{tmp_path}/b.toml: key `{key}` (the cuzk_config of {path}: "
                          "engine[1])"), msg
    assert problem.format(dir=tmp_path) in msg, msg


def test_two_cuzk_engines_with_their_own_addresses_and_budgets_load(tmp_path: Path) -> None:
    path = _two_engines(tmp_path, OWN.format(dir="{dir}", name="{name}", n=21, budget="auto"),
                        OWN.format(dir="{dir}", name="{name}", n=31, budget="200GiB"))
    config = load_config(path)
    assert [status_address(config, e) for e in config.engine] == [
        "http://127.0.0.1:9821/status", "http://127.0.0.1:9831/status"]


def test_cuzk_file_is_no_key_a_file_sets(tmp_path: Path) -> None:
    path = tmp_path / "cuzkd.toml"
    path.write_text('[[engine]]\nname = "c0"\ncuzk_file = { path = "/x" }\n')
    with pytest.raises(ConfigError, match=r"engine\[0\].cuzk_file`: unknown key"):
        load_config(path)
    path.write_text('[[engine]]\nname = "c0"\ncuzk_config = "/x.toml"\n')
    with pytest.raises(ConfigError, match=r"engine\[0\].cuzk_config`: only for type"):
        load_config(path)


@pytest.mark.parametrize("subcommand", [["run", "--config"], ["check-config"]])
def test_the_cli_exits_78_naming_cuzks_file_and_key(tmp_path: Path,
                                                    subcommand: list[str]) -> None:
    cuzk = tmp_path / "cuzk.toml"
    cuzk.write_text("[daemon]\n")
    path = tmp_path / "cuzkd.toml"
    path.write_text(_engine("c0", cuzk))
    proc = subprocess.run([sys.executable, "-m", "cuzkd", *subcommand, str(path)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 78, proc.stderr
    assert f"{cuzk}: key `daemon.status_listen`" in proc.stderr


def test_check_config_prints_the_wildcard_warning(tmp_path: Path) -> None:
    cuzk = tmp_path / "cuzk.toml"
    cuzk.write_text('[daemon]\nstatus_listen = "0.0.0.0:9821"\n')
    path = tmp_path / "cuzkd.toml"
    path.write_text(_engine("c0", cuzk))
    proc = subprocess.run([sys.executable, "-m", "cuzkd", "check-config", str(path)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "warning:" in proc.stderr and "job ids" in proc.stderr


def test_a_deeply_nested_file_is_refused_not_a_crash(tmp_path: Path) -> None:
    # tomllib recurses into nested arrays: a RecursionError escaped load_config before.
    path = tmp_path / "cuzkd.toml"
    path.write_text("a = " + "[" * 100_000 + "\n")
    with pytest.raises(ConfigError, match="nested too deeply"):
        load_config(path)
