"""Config validation: every class of mistake names file and key; the CLI exits 78."""

from __future__ import annotations

import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from cuzkd.cli.dispatch import main as dispatch_main
from cuzkd.config import Config, control_socket_despite_errors, load_config
from cuzkd.config.addresses import control_socket, engine_command, status_address
from cuzkd.config.loading import MAX_CONFIG_BYTES
from cuzkd.config.schema import default_engines, visible_gpu_count
from cuzkd.errors import ConfigError

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
    (GOOD_ENGINE + "health_interval = 0\n", "engine[0].health_interval", "minimum of 10ms"),
    (GOOD_ENGINE + 'health_interval = "5ms"\n', "engine[0].health_interval", "minimum of 10ms"),
    (GOOD_ENGINE + 'grpc_telemetry_interval = "5ms"\n', "engine[0].grpc_telemetry_interval",
     "minimum of 10ms"),
    (GOOD_ENGINE + 'backoff_initial = "9ms"\n', "engine[0].backoff_initial", "minimum of 10ms"),
    (GOOD_ENGINE + "stop_timeout = 0\n", "engine[0].stop_timeout", "greater than zero"),
    # A year is the longest any timer may be: longer is a typo, and overflows some timers.
    (GOOD_ENGINE + 'backoff_max = "8761h"\n', "engine[0].backoff_max", "longer than 365 days"),
    ("[supervisor]\nshutdown_grace = 31622400\n", "supervisor.shutdown_grace",
     "longer than 365 days"),
    # What would only fail at run time: no host to connect to, a host that does not resolve.
    (GOOD_ENGINE + 'command = ["cuzk"]\nstatus_url = "http://:9000/status"\n',
     "engine[0].status_url", "names no host"),
    (GOOD_ENGINE + 'command = ["cuzk"]\nstatus_url = "http:///status"\n',
     "engine[0].status_url", "names no host"),
    (GOOD_ENGINE + 'command = ["cuzk"]\nstatus_url = "http://h:99999/status"\n',
     "engine[0].status_url", "invalid port"),
    ('[metrics]\nlisten = "no-such-host.invalid:9822"\n', "metrics.listen", "does not resolve"),
    ('[metrics]\nlisten = "unix:/run/m.sock"\n', "metrics.listen", "HOST:PORT"),
    (GOOD_ENGINE + 'restart = "sometimes"\n', "engine[0].restart", "sometimes"),
    (GOOD_ENGINE + 'stop_signal = "SIGNOPE"\n', "engine[0].stop_signal", "unknown signal"),
    (GOOD_ENGINE + "command = []\n" + 'status_url = "http://h:1/status"\n',
     "engine[0].command", "non-empty"),
    ('[metrics]\nlisten = "nowhere"\n', "metrics.listen", "HOST:PORT"),
    ("[supervisor]\nkeep_releases = 0\n", "supervisor.keep_releases", ">= 1"),
    # a label budget of 0 would export no kind at all; a million, no bound
    (GOOD_ENGINE + "max_proof_kinds = 0\n", "engine[0].max_proof_kinds", ">= 1"),
    ("[engine_defaults]\nmax_workers = 1000000\n" + GOOD_ENGINE, "engine_defaults.max_workers",
     "<= 100000"),
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
    (GOOD_ENGINE + 'stall_after = "50ms"\n', "engine[0].stall_after", "shorter than"),
    (GOOD_ENGINE + 'stale_job_after = "0s"\n', "engine[0].stale_job_after", "greater than"),
    (GOOD_ENGINE + 'gpus = ["first"]\n', "engine[0].gpus[0]", "NVML index"),
    (GOOD_ENGINE + 'gpus = ["0", "0"]\n', "engine[0].gpus", "twice"),
    (GOOD_ENGINE + 'gpus = ["0"]\nenv = { CUDA_VISIBLE_DEVICES = "1" }\n', "engine[0].env",
     "set from `gpus`"),
    (GOOD_ENGINE + 'gpu_memory_needed = "20GiB"\n', "engine[0].gpu_memory_needed", "needs `gpus`"),
    (GOOD_ENGINE + 'gpus = ["0"]\ngpu_memory_needed = "lots"\n', "engine[0].gpu_memory_needed",
     "invalid size"),
    (GOOD_ENGINE + 'stall_action = "panic"\n', "engine[0].stall_action", "panic"),
    # Output limits: a rate or burst of zero would log nothing, not "no limit".
    (GOOD_ENGINE + 'output_lines_per_second = 0\n', "engine[0].output_lines_per_second", "> 0"),
    (GOOD_ENGINE + 'output_burst_lines = 0\n', "engine[0].output_burst_lines", ">= 1"),
    (GOOD_ENGINE + 'output_bytes_per_second = "0B"\n', "engine[0].output_bytes_per_second",
     "greater than zero"),
    (GOOD_ENGINE + 'output_burst_bytes = "lots"\n', "engine[0].output_burst_bytes",
     "invalid size"),
    # A shutdown drains for what the grace leaves; the stop signal's time must fit in it.
    ('[supervisor]\nshutdown_grace = "5s"\n' + GOOD_ENGINE,
     "engine[0].stop_timeout", "stop_timeout 10s is more than supervisor.shutdown_grace (5s)"),
    (GOOD_ENGINE + 'drain = "cuzk"\n', "engine[0].drain", "only for type = \"cuzk\""),
    (GOOD_ENGINE + 'drain = "slow"\n', "engine[0].drain", "slow"),
    (GOOD_ENGINE + 'drain_timeout = 0\n', "engine[0].drain_timeout", "greater than zero"),
    ('[[engine]]\nname = "c"\ncommand = ["cuzk"]\ndrain = "quiet"\n', "engine[0].drain",
     "needs the engine's status"),
    # An explicit type must fit the keys beside it.
    (GOOD_ENGINE + 'type = "cuzk"\n', "engine[0].type", "needs a `command`"),
    (GOOD_ENGINE + 'type = "bundled"\ncommand = ["x"]\n', "engine[0].command",
     "bundled engine has no `command`"),
    (GOOD_ENGINE + 'type = "http"\ncommand = ["x"]\n', "engine[0].status_url",
     "needs a status_url"),
    (GOOD_ENGINE + 'type = "process"\ncommand = ["x"]\nstatus_url = "http://h:1/status"\n',
     "engine[0].status_url", "has no status"),
    (GOOD_ENGINE + 'type = "rust"\n', "engine[0].type", "rust"),
]


def test_the_engine_type_is_inferred_unless_set(tmp_path: Path) -> None:
    path = tmp_path / "ok.toml"
    path.write_text(GOOD_ENGINE + '[[engine]]\nname = "plain"\ncommand = ["x"]\n'
                    '[[engine]]\nname = "web"\ncommand = ["x"]\nstatus_url = "http://h:1/status"\n'
                    '[[engine]]\nname = "set"\ntype = "http"\ncommand = ["x"]\n'
                    'status_url = "http://h:1/status"\n')
    types = {e.name: e.engine_type for e in load_config(path).engine}
    assert types == {"gpu0": "bundled", "plain": "process", "web": "http", "set": "http"}


def test_drain_defaults_follow_the_kind_of_engine(tmp_path: Path) -> None:
    path = tmp_path / "ok.toml"
    path.write_text(GOOD_ENGINE + '[[engine]]\nname = "cuzk"\ncommand = ["cuzk"]\n'
                    'status_url = "http://127.0.0.1:9821/status"\n'
                    '[[engine]]\nname = "bare"\ncommand = ["cuzk"]\n'
                    '[[engine]]\nname = "mine"\ncommand = ["cuzk"]\ndrain = "http"\n'
                    'status_url = "unix:/run/x.sock"\n')
    modes = {e.name: (e.drain_mode, e.stop_budget) for e in load_config(path).engine}
    assert modes == {"gpu0": ("http", 30.0), "cuzk": ("quiet", 30.0), "bare": ("none", 10.0),
                     "mine": ("http", 30.0)}


def test_a_cuzk_engine_starts_within_30s_by_default(tmp_path: Path) -> None:
    """TYPE_DEFAULTS: 30 s for type cuzk (its /status is up before any SRS load), 60 s for the
    others; [engine_defaults] and the engine's own key still win."""
    def cuzk(n: int) -> str:
        """A cuzk engine's keys, its own cuzk TOML (addresses, a budget) beside them."""
        own = tmp_path / f"cuzk{n}.toml"
        own.write_text(f'[daemon]\nlisten = "unix://{tmp_path}/cuzk{n}.sock"\n'
                       f'status_listen = "127.0.0.1:{19821 + n}"\n'
                       '[memory]\ntotal_budget = "100GiB"\n')
        return f'type = "cuzk"\ncommand = ["cuzk-daemon", "-c", "{own}"]\n'

    path = tmp_path / "ok.toml"
    path.write_text(GOOD_ENGINE + f'[[engine]]\nname = "cuzk"\n{cuzk(0)}'
                    f'[[engine]]\nname = "mine"\n{cuzk(1)}start_timeout = "2m"\n')
    timeouts = {e.name: e.start_timeout for e in load_config(path).engine}
    assert timeouts == {"gpu0": 60.0, "cuzk": 30.0, "mine": 120.0}
    path.write_text('[engine_defaults]\nstart_timeout = "45s"\n'
                    f'[[engine]]\nname = "cuzk"\n{cuzk(0)}')
    assert load_config(path).engine[0].start_timeout == 45.0


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
        'shutdown_grace = "6m"\n'
        '[engine_defaults]\nstop_timeout = "250ms"\nunhealthy_after = 20\n'
        '[[engine]]\nname = "gpu0"\nenv = { CUDA_VISIBLE_DEVICES = "0" }\n'
        '[[engine]]\nname = "real"\ncommand = ["{binary}", "--config", "/etc/c.toml"]\n'
        'status_url = "http://127.0.0.1:9821/status"\nstop_timeout = "5m"\n'
    )
    config = load_config(path)
    gpu0, real = config.engine
    assert gpu0.stop_timeout == 0.25 and gpu0.unhealthy_after == 20.0
    assert real.stop_timeout == 300.0
    assert control_socket(config) == Path("/srv/cuzkd/control.sock")
    assert status_address(config, gpu0) == "unix:/srv/cuzkd/engines/gpu0.sock"
    assert engine_command(config, gpu0)[-2:] == ["--listen", "unix:/srv/cuzkd/engines/gpu0.sock"]
    assert real.uses_binary and not gpu0.uses_binary
    assert config.supervisor.keep_releases == 3


def test_engines_omitted_means_the_embedded_default(tmp_path: Path) -> None:
    path = tmp_path / "m.toml"
    path.write_text('[metrics]\nlisten = "0.0.0.0:9999"\n')
    config = load_config(path)
    assert config.engine == default_engines(visible_gpu_count())
    assert default_engines(0)[0].name == "cpu0"
    assert [e.gpus for e in default_engines(2)] == [["0"], ["1"]]


def test_the_gpus_are_counted_from_the_drivers_proc_entries(tmp_path: Path) -> None:
    proc = tmp_path / "proc"
    assert visible_gpu_count(proc) == 0  # no NVIDIA driver
    gpus = proc / "driver" / "nvidia" / "gpus"
    for bus in ("0000:01:00.0", "0000:41:00.0"):
        (gpus / bus).mkdir(parents=True)
    assert visible_gpu_count(proc) == 2


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


LONG = "/tmp/" + "d" * 100  # with "/engines/NAME.sock" or "/control.sock": > 107 bytes


@pytest.mark.parametrize(("text", "key"), [
    # the bundled engine's socket under a long state_dir, and the default control socket
    (f'[supervisor]\nstate_dir = "{LONG}"\ncontrol_socket = "/tmp/c.sock"\n' + GOOD_ENGINE,
     "engine[0].listen"),
    (f'[supervisor]\nstate_dir = "{LONG}"\n' + GOOD_ENGINE, "supervisor.state_dir"),
    (f'[supervisor]\ncontrol_socket = "{LONG}/c.sock"\n' + GOOD_ENGINE,
     "supervisor.control_socket"),
    (GOOD_ENGINE + f'listen = "unix:{LONG}/e.sock"\n', "engine[0].listen"),
    (GOOD_ENGINE + f'command = ["cuzk"]\nstatus_url = "unix:{LONG}/e.sock"\n',
     "engine[0].status_url"),
])
def test_unix_socket_paths_beyond_the_kernel_limit_are_refused(tmp_path: Path, text: str,
                                                               key: str) -> None:
    path = tmp_path / "long.toml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=rf"key `{re.escape(key)}`: socket path .* 107"):
        load_config(path)


def test_socket_path_at_the_kernel_limit_is_accepted_and_binds(tmp_path: Path) -> None:
    """107 bytes is the longest path bind() takes: the limit refuses nothing that works."""
    sock_path = tmp_path / ("s" * (107 - len(str(tmp_path)) - 1))
    assert len(str(sock_path)) == 107
    path = tmp_path / "ok.toml"
    path.write_text(f'[supervisor]\ncontrol_socket = "{sock_path}"\n' + GOOD_ENGINE)
    assert control_socket(load_config(path)) == sock_path
    with socket.socket(socket.AF_UNIX) as sock:
        sock.bind(str(sock_path))


def test_status_url_is_optional_for_a_command(tmp_path: Path) -> None:
    path = tmp_path / "plain.toml"
    path.write_text(GOOD_ENGINE + 'command = ["sleep", "infinity"]\n')
    assert load_config(path).engine[0].status_url == ""


@pytest.mark.parametrize("subcommand", [["run", "--config"], ["check-config"]])
def test_a_file_that_is_not_utf8_exits_78_naming_it(tmp_path: Path,
                                                    subcommand: list[str]) -> None:
    path = tmp_path / "latin1.toml"
    path.write_bytes(b'# caf\xe9\n[[engine]]\nname = "gpu0"\n')
    proc = subprocess.run([sys.executable, "-m", "cuzkd", *subcommand, str(path)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 78, proc.stderr
    assert f"{path}: not UTF-8" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_a_reader_that_went_away_is_no_traceback(tmp_path: Path) -> None:
    """``cuzkd status | head -1``: the pipe closes before the output is written."""
    path = tmp_path / "ok.toml"
    path.write_text(GOOD_ENGINE)
    proc = subprocess.Popen([sys.executable, "-m", "cuzkd", "check-config", str(path)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()  # the reader is gone before the command writes
    err = proc.stderr.read().decode()
    assert proc.wait(60) == 141, err  # as if SIGPIPE had ended it, like other tools in a pipe
    assert err == ""


def test_a_config_without_end_is_refused_at_the_size_cap(tmp_path: Path) -> None:
    """A config path that names /dev/zero (or a runaway generated file) must not be read into
    memory without end, at start nor on a reload."""
    link = tmp_path / "cuzkd.toml"
    link.symlink_to("/dev/zero")
    for fifo_wait in (None, 1.0):
        with pytest.raises(ConfigError, match=rf"{link}: larger than {MAX_CONFIG_BYTES} bytes"):
            load_config(link, fifo_wait=fifo_wait)
    big = tmp_path / "big.toml"
    big.write_text(GOOD_ENGINE + "#" * MAX_CONFIG_BYTES)
    with pytest.raises(ConfigError, match="larger than"):
        load_config(big)


def test_stall_watchdog_keys(tmp_path: Path) -> None:
    path = tmp_path / "s.toml"
    path.write_text(GOOD_ENGINE + '[[engine]]\nname = "off"\nstall_after = "0s"\n'
                    'stall_action = "alert"\n')
    default, off = load_config(path).engine
    assert (default.stall_after, default.stall_action) == (600.0, "restart")
    assert (off.stall_after, off.stall_action) == (0.0, "alert")


def test_stale_job_after_defaults_to_ten_minutes(tmp_path: Path) -> None:
    path = tmp_path / "s.toml"
    path.write_text(GOOD_ENGINE + '[[engine]]\nname = "quick"\nstale_job_after = "90s"\n')
    default, quick = load_config(path).engine
    assert (default.stale_job_after, quick.stale_job_after) == (600.0, 90.0)


def test_proof_deadlines_default_override_and_drop(tmp_path: Path) -> None:
    path = tmp_path / "d.toml"
    path.write_text('[metrics]\nproof_deadlines = { winning-post = "15s", porep-c2 = "1h", '
                    'window-post = "0s" }\n' + GOOD_ENGINE)
    assert load_config(path).metrics.deadlines() == {"winning-post": 15.0, "porep-c2": 3600.0}
    path.write_text(GOOD_ENGINE)
    assert load_config(path).metrics.deadlines() == {"winning-post": 20.0, "window-post": 1200.0}
    path.write_text('[metrics]\nproof_deadlines = { window-post = "1m", winning-post = "soon" }\n'
                    + GOOD_ENGINE)
    with pytest.raises(ConfigError, match=r"key `metrics\.proof_deadlines\.winning-post`: "
                                          r"invalid duration 'soon'"):
        load_config(path)
    path.write_text('[metrics]\nproof_deadlines = { window-post = "9000h" }\n' + GOOD_ENGINE)
    with pytest.raises(ConfigError,
                       match=r"key `metrics\.proof_deadlines\.window-post`: .*365 days"):
        load_config(path)


def test_proof_deadlines_by_old_names_are_taken_with_a_warning_naming_file_and_key(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """cuzkd's kind names before cuzk's (``winning``, ``wpost``) still work; the loader keeps
    cuzk's name and says where to change the file (``check-config`` on stderr); gRPC's
    spelling is cuzk's own: no warning."""
    path = tmp_path / "old.toml"
    path.write_text('[metrics]\nproof_deadlines = { winning = "15s", wpost = "0s", '
                    'porep_c2 = "1h" }\n' + GOOD_ENGINE)
    config = load_config(path)
    assert config.metrics.deadlines() == {"winning-post": 15.0, "porep-c2": 3600.0}
    assert [n.split(": ")[:2] for n in config.notices] == [
        [str(path), "key `metrics.proof_deadlines.winning`"],
        [str(path), "key `metrics.proof_deadlines.wpost`"]]
    assert dispatch_main(["check-config", str(path)]) == 0
    assert f"warning: {path}: key `metrics.proof_deadlines.winning`: " in capsys.readouterr().err
    path.write_text('[metrics]\nproof_deadlines = { winning = "15s", winning-post = "20s" }\n'
                    + GOOD_ENGINE)
    with pytest.raises(ConfigError, match=r"key `metrics\.proof_deadlines\.winning-post`: "
                                          r"'winning-post' and 'winning' both name"):
        load_config(path)


def test_the_control_socket_of_a_file_that_does_not_validate(tmp_path: Path) -> None:
    """``cuzkd reload`` must reach the supervisor to have it refuse a broken file: the socket
    comes from the ``[supervisor]`` table while the file parses, else the default."""
    path = tmp_path / "cuzkd.toml"
    path.write_text(f'[supervisor]\nstate_dir = "{tmp_path}"\n' + GOOD_ENGINE + "colour = 1\n")
    with pytest.raises(ConfigError):
        load_config(path)
    assert control_socket_despite_errors(path) == tmp_path / "control.sock"
    path.write_text(f'[supervisor]\ncontrol_socket = "{tmp_path}/c.sock"\n[[engine]\n')
    assert control_socket_despite_errors(path) == control_socket(Config())  # not TOML
    path.write_bytes(b"# caf\xe9\n")
    assert control_socket_despite_errors(path) == control_socket(Config())
    assert control_socket_despite_errors(tmp_path / "missing.toml") == control_socket(Config())
