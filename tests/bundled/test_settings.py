"""Engine config: defaults, sizes and durations, and errors naming the file and key."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from cuzkd.bundled.memlimit import cgroup_memory_limit, usable_memory_bytes
from cuzkd.bundled.settings import (
    PARTITIONS,
    _RawConfig,
    default_config,
    demo_config,
    load_config,
    resolve,
)
from cuzkd.config import load_config as load_supervisor_config
from cuzkd.errors import ConfigError, ProverConfigError


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "engine.toml"
    path.write_text(text)
    return path


def test_defaults_use_usable_memory_minus_margin() -> None:
    config = default_config()
    assert config.memory_budget_bytes == usable_memory_bytes() - 5 * 2**30
    assert usable_memory_bytes() <= psutil.virtual_memory().total
    assert config.workers_per_gpu == 2
    assert config.size_log2("snap-update") >= 10


def test_full_config(tmp_path: Path) -> None:
    config = load_config(write(tmp_path, """
memory_budget = "8GiB"
workers_per_gpu = 3
devices = [0, 2]
backend = "numpy"
synthesis_threads = 4
synthesis_rounds = 50
drain_timeout = "1m"
[sizes]
snap-update = 10
"""))
    assert config.memory_budget_bytes == 8 * 2**30
    assert config.workers_per_gpu == 3
    assert config.devices == (0, 2)
    assert config.synthesis_threads == 4
    assert config.synthesis_rounds == 50
    assert config.drain_timeout_secs == 60.0
    assert config.size_log2("snap-update") == 10
    assert config.size_log2("porep-c2") == default_config().size_log2("porep-c2")


@pytest.mark.parametrize(("text", "key"), [
    ("memory_budgt = '8GiB'", "memory_budgt"),
    ("memory_budget = '8 gigs'", "memory_budget"),
    ("drain_timeout = 'soon'", "drain_timeout"),
    ("workers_per_gpu = 0", "workers_per_gpu"),
    ("synthesis_rounds = 0", "synthesis_rounds"),
    ("[sizes]\nsnap-update = 99", "sizes.snap-update"),
    ("[sizes]\nsnapp = 10", "snapp"),
    ("safety_margin = '100TiB'", "safety_margin"),
    ("drain_timeout = inf", "drain_timeout"),
    ("drain_timeout = '9000h'", "drain_timeout"),
])
def test_errors_name_file_and_key(tmp_path: Path, text: str, key: str) -> None:
    path = write(tmp_path, text)
    with pytest.raises(ProverConfigError) as info:
        load_config(path)
    assert str(path) in str(info.value)
    assert key in str(info.value)


def test_cli_exits_78_on_bad_config(tmp_path: Path) -> None:
    path = write(tmp_path, "[sizes]\nsnap-update = 'big'\n")
    proc = subprocess.run(
        [sys.executable, "-m", "cuzkd", "engine", "--config", str(path), "--listen",
         "127.0.0.1:0"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 78
    assert str(path) in proc.stderr and "sizes.snap-update" in proc.stderr


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


def cgroup_tree(tmp_path: Path, membership: str, files: dict[str, str]) -> tuple[Path, Path]:
    """A fake /proc/self/cgroup and /sys/fs/cgroup: ``files`` maps paths under the root to
    their content."""
    proc = tmp_path / "cgroup"
    proc.write_text(membership)
    root = tmp_path / "sys-fs-cgroup"
    for rel, content in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(content + "\n")
    return proc, root


@pytest.mark.parametrize(("membership", "files", "limit"), [
    # cgroup v2, a systemd unit with MemoryMax=, its slice unlimited
    ("0::/system.slice/cuzkd.service\n",
     {"system.slice/cuzkd.service/memory.max": str(6 * 2**30),
      "system.slice/memory.max": "max"}, 6 * 2**30),
    # v2: a parent's lower limit binds the child
    ("0::/a/b\n", {"a/b/memory.max": str(8 * 2**30), "a/memory.max": str(3 * 2**30)},
     3 * 2**30),
    # v2 inside a container: the mount's root is the container's own cgroup
    ("0::/kubepods/pod1/c1\n", {"memory.max": str(2 * 2**30)}, 2 * 2**30),
    ("0::/\n", {"memory.max": "max"}, None),
    # cgroup v1 (docker on an older host), and hybrid hosts
    ("12:cpu,cpuacct:/docker/abc\n4:memory:/docker/abc\n0::/docker/abc\n",
     {"memory/docker/abc/memory.limit_in_bytes": str(4 * 2**30),
      "memory/memory.limit_in_bytes": "9223372036854771712"}, 4 * 2**30),
    ("4:memory:/docker/abc\n", {"memory/memory.limit_in_bytes": str(5 * 2**30)}, 5 * 2**30),
    ("4:memory:/\n", {}, None),
])
def test_cgroup_memory_limit_v1_and_v2(tmp_path: Path, membership: str, files: dict[str, str],
                                      limit: int | None) -> None:
    proc, root = cgroup_tree(tmp_path, membership, files)
    assert cgroup_memory_limit(proc, root) == limit


def test_auto_budget_respects_the_cgroup_limit(tmp_path: Path) -> None:
    proc, root = cgroup_tree(tmp_path, "0::/cuzkd\n", {"cuzkd/memory.max": str(8 * 2**30)})
    usable = usable_memory_bytes(proc, root)
    assert usable == min(8 * 2**30, psutil.virtual_memory().total)
    config = resolve(_RawConfig(safety_margin="1GiB"), "t.toml", usable_memory=lambda: usable)
    assert config.memory_budget_bytes == usable - 2**30
    with pytest.raises(ProverConfigError, match="cgroup"):
        resolve(_RawConfig(safety_margin="9GiB"), "t.toml",
                usable_memory=lambda: 8 * 2**30)


def test_engine_and_supervisor_configs_word_a_bad_key_alike(tmp_path: Path) -> None:
    """One formatting of msgspec's errors (cuzkd/validation.py) for both config files."""
    engine = tmp_path / "engine.toml"
    engine.write_text("[sizes]\nsnap-update = 'big'\n")
    supervisor = tmp_path / "supervisor.toml"
    supervisor.write_text("[[engine]]\nname = 'a'\nhealth_interval = 'soon'\nrestart = 3\n")
    with pytest.raises(ProverConfigError) as engine_error:
        load_config(engine)
    with pytest.raises(ConfigError) as supervisor_error:
        load_supervisor_config(supervisor)
    assert str(engine_error.value) == f"{engine}: key `sizes.snap-update`: Expected int, got str"
    assert str(supervisor_error.value).startswith(f"{supervisor}: key `engine[0].")


def test_sizes_by_old_kind_names_are_taken_with_a_warning_naming_file_and_key(
        tmp_path: Path) -> None:
    path = write(tmp_path, "[sizes]\nsnap = 9\nwinning_post = 7\nporep-c2 = 8\n")
    config = load_config(path)
    assert [config.size_log2(kind) for kind in PARTITIONS] == [8, 9, 14, 7]
    assert [n.split(": ")[:2] for n in config.notices] == [[str(path), "key `sizes.snap`"]]
    assert "'snap-update'" in config.notices[0]
    with pytest.raises(ProverConfigError,
                       match=r"key `sizes\.snap-update`: 'snap-update' and 'snap' both name"):
        load_config(write(tmp_path, "[sizes]\nsnap = 9\nsnap-update = 10\n"))
