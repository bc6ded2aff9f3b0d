"""Config validation: every class of mistake names file and key; the CLI exits 78."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from cuzkd.config import ConfigError, default_engines, load_config, visible_gpu_count

REPO = Path(__file__).resolve().parents[2]

GOOD_ENGINE = '[[engine]]\nname = "gpu0"\n'

MISTAKES = [
    # (toml, key named in the message, words of the problem)
    ('[supervisor]\nstate_dirr = "/x"\n', "supervisor.state_dirr", "unknown key"),
    (GOOD_ENGINE + 'colour = "red"\n', "engine[0].colour", "unknown key"),
    ('[engine_defaults]\nbogus = 1\n' + GOOD_ENGINE, "engine_defaults.bogus", "unknown key"),
    (GOOD_ENGINE + "restart = 3\n", "engine[0].restart", "Expected"),
    (GOOD_ENGINE + 'backoff_max = "soon"\n', "engine[0].backoff_max", "invalid duration"),
    ('[engine_defaults]\nstop_timeout = "x"\n' + GOOD_ENGINE, "engine_defaults.stop_timeout",
     "invalid duration"),
    (GOOD_ENGINE + GOOD_ENGINE, "engine[1].name", "duplicate engine name"),
    ('[[engine]]\nname = "GPU 0"\n', "engine[0].name", "regex"),
    (GOOD_ENGINE + 'backoff_initial = "10s"\nbackoff_max = "1s"\n', "engine[0].backoff_max",
     "less than backoff_initial"),
    (GOOD_ENGINE + "backoff_multiplier = 0.5\n", "engine[0].backoff_multiplier", ">= 1"),
    (GOOD_ENGINE + "health_interval = 0\n", "engine[0].health_interval", "greater than zero"),
    (GOOD_ENGINE + 'restart = "sometimes"\n', "engine[0].restart", "sometimes"),
    (GOOD_ENGINE + 'stop_signal = "SIGNOPE"\n', "engine[0].stop_signal", "unknown signal"),
    (GOOD_ENGINE + 'command = ["cuzk"]\n', "engine[0].status_url", "required"),
    (GOOD_ENGINE + "command = []\n" + 'status_url = "http://h:1/status"\n',
     "engine[0].command", "non-empty"),
    ('[metrics]\nlisten = "nowhere"\n', "metrics.listen", "HOST:PORT"),
    ("[supervisor]\nkeep_releases = 0\n", "supervisor.keep_releases", ">= 1"),
    # TOML has inf and nan; a nan passes every `<= 0` check and breaks timers later.
    (GOOD_ENGINE + "health_interval = nan\n", "engine[0].health_interval", "finite"),
    (GOOD_ENGINE + "stop_timeout = inf\n", "engine[0].stop_timeout", "finite"),
    ("[supervisor]\nshutdown_grace = nan\n", "supervisor.shutdown_grace", "finite"),
    # execve refuses these: caught at spawn they would only surface after a reload.
    (GOOD_ENGINE + 'env = { "A=B" = "1" }\n', "engine[0].env", "'A=B'"),
    (GOOD_ENGINE + 'env = { A = "x\\u0000y" }\n', "engine[0].env", "NUL"),
    (GOOD_ENGINE + 'command = ["cuzk", "a\\u0000b"]\nstatus_url = "http://h:1/status"\n',
     "engine[0].command[1]", "NUL"),
    (GOOD_ENGINE + 'listen = "unix:"\n', "engine[0].listen", "socket path"),
    (GOOD_ENGINE + 'status_url = "unix:"\n', "engine[0].status_url", "socket path"),
]


@pytest.mark.parametrize(("text", "key", "problem"), MISTAKES)
def test_each_mistake_names_file_and_key(tmp_path: Path, text: str, key: str,
                                         problem: str) -> None:
    path = tmp_path / "bad.toml"
    path.write_text(text)
    with pytest.raises(ConfigError) as err:
        load_config(path)
    msg = str(err.value)
    assert msg.startswith(f"{path}: key `{key}`:"), msg
    assert problem in msg


def test_defaults_durations_and_placeholders(tmp_path: Path) -> None:
    path = tmp_path / "ok.toml"
    path.write_text(
        '[supervisor]\nstate_dir = "/srv/cuzkd"\ninitial_binary = "/opt/cuzk"\n'
        '[engine_defaults]\nstop_timeout = "250ms"\nunhealthy_after = 20\n'
        '[[engine]]\nname = "gpu0"\nenv = { CUDA_VISIBLE_DEVICES = "0" }\n'
        '[[engine]]\nname = "real"\ncommand = ["{binary}", "--config", "/etc/c.toml"]\n'
        'status_url = "http://127.0.0.1:9821/status"\nstop_timeout = "5m"\n'
    )
    config = load_config(path)
    gpu0, real = config.engine
    assert gpu0.stop_timeout == 0.25 and gpu0.unhealthy_after == 20.0
    assert real.stop_timeout == 300.0
    assert config.control_socket == Path("/srv/cuzkd/control.sock")
    assert config.status_address(gpu0) == "unix:/srv/cuzkd/engines/gpu0.sock"
    assert config.engine_command(gpu0)[-2:] == ["--listen", "unix:/srv/cuzkd/engines/gpu0.sock"]
    assert real.uses_binary and not gpu0.uses_binary
    assert config.supervisor.keep_releases == 3


def test_engines_omitted_means_the_embedded_default(tmp_path: Path) -> None:
    path = tmp_path / "m.toml"
    path.write_text('[metrics]\nlisten = "0.0.0.0:9999"\n')
    config = load_config(path)
    assert config.engine == default_engines(visible_gpu_count())
    assert default_engines(0)[0].name == "cpu0"
    assert [e.env for e in default_engines(2)] == [{"CUDA_VISIBLE_DEVICES": "0"},
                                                   {"CUDA_VISIBLE_DEVICES": "1"}]


def test_example_config_is_valid() -> None:
    config = load_config(REPO / "cuzkd.example.toml")
    assert config.engine


@pytest.mark.parametrize("subcommand", [["run", "--config"], ["check-config"]])
def test_cli_exits_78_naming_the_key(tmp_path: Path, subcommand: list[str]) -> None:
    path = tmp_path / "bad.toml"
    path.write_text(GOOD_ENGINE + 'backoff_max = "soon"\n')
    proc = subprocess.run([sys.executable, "-m", "cuzkd", *subcommand, str(path)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 78
    assert "engine[0].backoff_max" in proc.stderr
    assert str(path) in proc.stderr


def test_check_config_accepts_a_good_file(tmp_path: Path) -> None:
    path = tmp_path / "good.toml"
    path.write_text(GOOD_ENGINE)
    proc = subprocess.run([sys.executable, "-m", "cuzkd", "check-config", str(path)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "gpu0" in proc.stdout
