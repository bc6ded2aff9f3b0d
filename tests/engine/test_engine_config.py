"""Engine config: defaults, sizes and durations, and errors naming the file and key."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from cuzkd.engine.config import ConfigError, default_config, demo_config, load_config


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "engine.toml"
    path.write_text(text)
    return path


def test_defaults_use_physical_memory_minus_margin() -> None:
    config = default_config()
    assert config.memory_budget_bytes == psutil.virtual_memory().total - 5 * 2**30
    assert config.workers_per_gpu == 2
    assert config.size_log2("snap") >= 10


def test_full_config(tmp_path: Path) -> None:
    config = load_config(write(tmp_path, """
memory_budget = "8GiB"
workers_per_gpu = 3
devices = [0, 2]
backend = "numpy"
synthesis_threads = 4
synthesis_rounds = 50
shutdown_grace = "1m"
[sizes]
snap = 10
"""))
    assert config.memory_budget_bytes == 8 * 2**30
    assert config.workers_per_gpu == 3
    assert config.devices == (0, 2)
    assert config.synthesis_threads == 4
    assert config.synthesis_rounds == 50
    assert config.shutdown_grace_secs == 60.0
    assert config.size_log2("snap") == 10
    assert config.size_log2("porep") == default_config().size_log2("porep")


@pytest.mark.parametrize(("text", "key"), [
    ("memory_budgt = '8GiB'", "memory_budgt"),
    ("memory_budget = '8 gigs'", "memory_budget"),
    ("shutdown_grace = 'soon'", "shutdown_grace"),
    ("workers_per_gpu = 0", "workers_per_gpu"),
    ("synthesis_rounds = 0", "synthesis_rounds"),
    ("[sizes]\nsnap = 99", "sizes.snap"),
    ("[sizes]\nsnapp = 10", "snapp"),
    ("safety_margin = '100TiB'", "safety_margin"),
    ("shutdown_grace = inf", "shutdown_grace"),
    ("shutdown_grace = '9000h'", "shutdown_grace"),
])
def test_errors_name_file_and_key(tmp_path: Path, text: str, key: str) -> None:
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert str(path) in str(info.value)
    assert key in str(info.value)


def test_cli_exits_78_on_bad_config(tmp_path: Path) -> None:
    path = write(tmp_path, "[sizes]\nsnap = 'big'\n")
    proc = subprocess.run(
        [sys.executable, "-m", "cuzkd", "engine", "--config", str(path), "--listen",
         "127.0.0.1:0"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 78
    assert str(path) in proc.stderr and "sizes.snap" in proc.stderr


def test_cli_exits_78_on_a_file_that_is_not_utf8(tmp_path: Path) -> None:
    path = tmp_path / "latin1.toml"
    path.write_bytes(b"# caf\xe9\nworkers_per_gpu = 1\n")
    proc = subprocess.run(
        [sys.executable, "-m", "cuzkd", "engine", "--config", str(path), "--listen",
         "127.0.0.1:0"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 78, proc.stderr
    assert f"{path}: not UTF-8" in proc.stderr and "Traceback" not in proc.stderr


def test_demo_preset_is_small_with_costly_synthesis() -> None:
    """`cuzkd engine --demo`: a budget a burst of jobs fills, at most 2 GiB of real memory."""
    demo, default = demo_config(), default_config()
    assert demo.memory_budget_bytes <= 2 * 2**30
    assert demo.synthesis_rounds > default.synthesis_rounds == 1
