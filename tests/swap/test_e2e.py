"""The binary swap end to end: a real ``cuzkd run``, real engine executables, ``cuzkd swap``.

The ``{binary}`` engines run ``fake_cuzk.c`` compiled with gcc (one build per version), so a
running engine's ``/proc/PID/exe`` is the release binary itself: that file, and the version the
engine serves on ``/version``, are what every check trusts. A third engine (the Python fake
engine, no ``{binary}``) must never be touched by a swap.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from support.ports import free_port
from support.supervisor_harness import (
    RunningSupervisor,
    pid_alive,
    scripted_engine,
    start_supervisor,
    write_config,
)
from support.waiting import wait_until

from cuzkd.status.document import decode_status
from cuzkd.swap.releases import ReleaseStore, source_release_id

FAKE_CUZK = Path(__file__).with_name("fake_cuzk.c")
BINARY_ENGINES = ("gpu0", "gpu1")
SETTLE = "0.3s"
ENGINE_DEFAULTS = {"health_interval": "0.1s", "start_timeout": "5s", "stop_timeout": "3s",
                   "backoff_initial": "0.1s", "unhealthy_after": "3s"}


@pytest.fixture(scope="session")
def builds(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """fake_cuzk compiled as ``v1``, ``v2`` and ``crash`` (exits 1 at start)."""
    gcc = shutil.which("gcc")
    if gcc is None:
        pytest.skip("gcc is needed to build the fake cuzk engine binary (apt-get install gcc)")
    out = tmp_path_factory.mktemp("fake_cuzk")
    variants = {"v1": ["-DVERSION=\"v1\""], "v2": ["-DVERSION=\"v2\""],
                "crash": ["-DVERSION=\"v3\"", "-DCRASH=1"]}
    for name, flags in variants.items():
        subprocess.run([gcc, "-O1", "-Wall", "-Werror", *flags, "-o", str(out / name),
                        str(FAKE_CUZK)], check=True)
    return {name: out / name for name in variants}


@dataclass
class Fleet:
    """A running supervisor with two ``{binary}`` engines and one plain engine."""

    sup: RunningSupervisor
    tmp: Path
    ports: dict[str, int]
    src: dict[str, Path]  # this test's own copies of the builds, named ``cuzk``
    ids: dict[str, str]  # build -> release id, from before any test touches the copies
    store: ReleaseStore

    def swap(self, *args: str, settle: str = SETTLE) -> subprocess.CompletedProcess[str]:
        return subprocess.run(self.swap_argv(*args, settle=settle), capture_output=True,
                              text=True, timeout=90)

    def swap_argv(self, *args: str, settle: str = SETTLE) -> list[str]:
        return [sys.executable, "-m", "cuzkd", "swap", "--config", str(self.sup.config),
                "--settle", settle, *args]

    def history(self) -> dict[str, Any]:
        status, body = self.sup.request("GET", "/v1/swap/history")
        assert status == 200, body
        return body  # type: ignore[no-any-return]

    def verdicts(self) -> dict[str, str]:
        """build name -> verdict, for the builds the history knows."""
        names = {rid: name for name, rid in self.ids.items()}
        return {names[r["release"]]: r["verdict"] for r in self.history()["records"]}

    def wait_accepted(self, version: str) -> None:
        wait_until(lambda: self.verdicts().get(version) == "accepted", 15,
                   f"release {version} accepted")

    def pids(self) -> dict[str, int | None]:
        return {name: eng["pid"] for name, eng in self.sup.engines().items()}

    def wait_running(self, names: tuple[str, ...] = (*BINARY_ENGINES, "py")) -> None:
        for name in names:
            self.sup.wait_engine(name, lambda e: e["state"] == "running", what=f"{name} running")

    def assert_engines_on(self, version: str) -> None:
        """Every ``{binary}`` engine runs the active release, and it is build ``version``."""
        active = self.store.active()
        assert active is not None
        assert active.id == self.ids[version]
        engines = self.sup.engines()
        for name in BINARY_ENGINES:
            eng = engines[name]
            assert eng["state"] == "running", eng
            assert os.path.realpath(f"/proc/{eng['pid']}/exe") == os.path.realpath(active.binary)
            assert eng["release"] == active.id
            assert served_version(self.ports[name]) == version
        assert engines["py"]["release"] is None


def served_version(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/version", timeout=5) as resp:
        return str(resp.read().decode())


def metrics_text(sup: RunningSupervisor) -> str:
    with urllib.request.urlopen(f"http://{sup.about()['metrics_listen']}/metrics",
                                timeout=10) as resp:
        return str(resp.read().decode())


def temp_entries(state_dir: Path) -> list[Path]:
    return [p for d in (state_dir, state_dir / "releases") for p in d.iterdir()
            if p.name.startswith(".tmp-")]


def store_snapshot(state_dir: Path) -> dict[str, Any]:
    """What a swap may change: the links and the releases with their contents."""
    snap: dict[str, Any] = {}
    for link in ("current", "previous"):
        path = state_dir / link
        snap[link] = str(path.readlink()) if path.is_symlink() else None
    for entry in sorted((state_dir / "releases").rglob("*")):
        st = entry.lstat()
        snap[str(entry.relative_to(state_dir))] = (st.st_mode, st.st_size, st.st_mtime_ns)
    return snap


def start_fleet(tmp: Path, builds: dict[str, Path], *, initial: str | None = "v1") -> Fleet:
    src = {}
    for name, build in builds.items():
        (tmp / name).mkdir()
        src[name] = tmp / name / "cuzk"
        shutil.copy2(build, src[name])
    ports = {name: free_port() for name in BINARY_ENGINES}
    engines = [
        {"name": name, "command": ["{binary}", "--port", str(port)],
         "status_url": f"http://127.0.0.1:{port}/status",
         "env": {"FAKE_CUZK_BROKEN": str(tmp / "broken-version")}}
        for name, port in ports.items()
    ]
    engines.append(scripted_engine(tmp, "py"))
    supervisor: dict[str, Any] = {"release_settle": SETTLE}
    if initial:
        supervisor["initial_binary"] = str(src[initial])
    config = write_config(tmp, engines, supervisor=supervisor, defaults=ENGINE_DEFAULTS)
    ids = {name: source_release_id(path) for name, path in src.items()}
    return Fleet(start_supervisor(config), tmp, ports, src, ids, ReleaseStore(tmp / "state"))


@pytest.fixture
def fleet(tmp_path: Path, builds: dict[str, Path]) -> Iterator[Fleet]:
    fleet = start_fleet(tmp_path, builds)
    try:
        fleet.wait_running()
        fleet.wait_accepted("v1")
        yield fleet
    finally:
        fleet.sup.stop()


def most_binary_engines_down_during_swap(sup: RunningSupervisor) -> int:
    """Replay the log: how many ``{binary}`` engines were not running at once during a swap."""
    state = dict.fromkeys(BINARY_ENGINES, "stopped")
    swapping, worst = False, 0
    for rec in sup.events():
        if rec.get("event") == "swap_step_reached":
            swapping = True
        elif rec.get("event") == "engine_state_changed" and rec.get("engine") in state:
            state[rec["engine"]] = rec["new"]
            if swapping:
                worst = max(worst, sum(s != "running" for s in state.values()))
    assert swapping, "no swap_step in the log"
    return worst


def test_swap_rolls_binary_engines_one_at_a_time_onto_the_new_release(fleet: Fleet) -> None:
    with urllib.request.urlopen(f"http://127.0.0.1:{fleet.ports['gpu0']}/status",
                                timeout=5) as resp:
        decode_status(resp.read())  # the stand-in is a cuzk the supervisor can watch
    fleet.assert_engines_on("v1")
    py_pid = fleet.pids()["py"]

    done = fleet.swap(str(fleet.src["v2"]))

    assert done.returncode == 0, done.stderr
    for name in BINARY_ENGINES:  # progress per engine
        assert f"restarting   engine={name}" in done.stdout
        assert f"healthy      engine={name}" in done.stdout
    assert "swap ok: release" in done.stdout
    fleet.assert_engines_on("v2")
    assert fleet.pids()["py"] == py_pid
    assert most_binary_engines_down_during_swap(fleet.sup) == 1

    v2 = fleet.ids["v2"]
    metrics = metrics_text(fleet.sup)
    assert 'cuzkd_binary_swaps_total{result="ok"} 1' in metrics
    assert f'cuzkd_binary_release_info{{release="{v2}"}} 1' in metrics
    for name in BINARY_ENGINES:  # the swap's restarts are counted as its own exit cause
        assert f'cuzkd_engine_exits_total{{cause="swap",engine="{name}"}} 1.0' in metrics
    assert 'cause="swap",engine="py"' not in metrics
    status = subprocess.run([sys.executable, "-m", "cuzkd", "status", "--config",
                             str(fleet.sup.config)], capture_output=True, text=True, check=True)
    lines = {line.split()[0]: line for line in status.stdout.splitlines()}
    assert "RELEASE" in lines["ENGINE"]
    assert all(v2 in lines[name] for name in BINARY_ENGINES)
    assert v2 not in lines["py"]


def test_a_release_that_crashes_at_start_is_rolled_back(fleet: Fleet) -> None:
    py_pid = fleet.pids()["py"]

    done = fleet.swap(str(fleet.src["crash"]))

    assert done.returncode == 1
    assert "swap rolled_back" in done.stderr
    assert "exit_1" in done.stderr  # the reason names how the engine ended
    fleet.wait_running()
    fleet.assert_engines_on("v1")
    assert fleet.pids()["py"] == py_pid
    assert 'cuzkd_binary_swaps_total{result="rolled_back"} 1' in metrics_text(fleet.sup)


def test_files_that_cannot_be_a_release_are_refused_before_anything_changes(
    fleet: Fleet,
) -> None:
    bad = fleet.tmp / "bad"
    bad.mkdir()
    (bad / "empty").touch(mode=0o755)
    shutil.copy(fleet.src["v2"], bad / "not-executable")
    (bad / "not-executable").chmod(0o644)
    (bad / "directory").mkdir()
    (bad / "symlink").symlink_to(fleet.src["v2"])
    expected = {"missing": "no such file", "empty": "is empty",
                "not-executable": "is not executable", "directory": "is a directory",
                "symlink": "is a symlink"}
    before, pids = store_snapshot(fleet.sup.state_dir), fleet.pids()

    for name, problem in expected.items():
        done = fleet.swap(str(bad / name))

        assert done.returncode == 1, name
        assert f"refused: {bad / name}: {problem}" in done.stderr, done.stderr
        assert store_snapshot(fleet.sup.state_dir) == before, name
        assert fleet.pids() == pids, name
    assert 'cuzkd_binary_swaps_total{result="refused"} 5' in metrics_text(fleet.sup)


def test_a_second_swap_is_refused_while_one_runs(fleet: Fleet) -> None:
    # The first swap is held in its smoke run (v2 serving on a spare port) until the test ends
    # that run: the second swap certainly comes while the first runs, however slow the machine.
    smoke_port = free_port()
    first = subprocess.Popen(fleet.swap_argv(str(fleet.src["v2"]), "--smoke",
                                             f"--port {smoke_port}", "--smoke-timeout", "5m"),
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def smoke_run() -> list[dict[str, Any]]:
        return [e for e in fleet.sup.events("oneshot_spawned")
                if e["argv"][1:] == ["--port", str(smoke_port)]]

    try:
        wait_until(smoke_run, 30, "the first swap's smoke run")
        second = fleet.swap(str(fleet.src["v1"]))
        assert second.returncode == 1
        assert "swap in progress" in second.stderr
        [spawned] = smoke_run()
        os.kill(spawned["pid"], signal.SIGTERM)  # the smoke run exits 0 on it: the swap goes on
        _, err = first.communicate(timeout=60)
    finally:
        if first.poll() is None:
            first.kill()
            first.wait()
    assert first.returncode == 0, err
    fleet.assert_engines_on("v2")


def test_rollback_returns_to_the_previous_release_and_sources_do_not_matter_after(
    fleet: Fleet,
) -> None:
    assert fleet.swap(str(fleet.src["v2"])).returncode == 0
    # Overwriting (and then removing) the file the release came from changes nothing that runs.
    fleet.src["v2"].write_bytes(fleet.src["v1"].read_bytes())
    status, _ = fleet.sup.request("POST", "/v1/engines/gpu0/restart")
    assert status == 200
    fleet.wait_running(("gpu0",))
    fleet.src["v2"].unlink()
    fleet.assert_engines_on("v2")

    done = fleet.swap("--rollback")

    assert done.returncode == 0, done.stderr
    fleet.assert_engines_on("v1")


def cuzkd(fleet: Fleet, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "cuzkd", *args, "--config",
                           str(fleet.sup.config)], capture_output=True, text=True, timeout=60)


def test_rollback_after_an_automatic_rollback_never_returns_to_the_crashing_release(
    fleet: Fleet,
) -> None:
    assert fleet.swap(str(fleet.src["crash"])).returncode == 1  # rolled back to v1
    fleet.wait_running()
    pids = fleet.pids()

    again = fleet.swap("--rollback")

    # `previous` names the crashing build; the history knows nothing good before v1.
    assert again.returncode == 1
    assert "rollback refused: no accepted release before the active one" in again.stderr
    assert fleet.pids() == pids
    fleet.assert_engines_on("v1")

    assert fleet.swap(str(fleet.src["v2"])).returncode == 0
    back = fleet.swap("--rollback")

    assert back.returncode == 0, back.stderr
    assert f"rollback ok: release {fleet.ids['v1']} active" in back.stdout
    fleet.assert_engines_on("v1")
    assert fleet.verdicts() == {"v1": "accepted", "crash": "rejected", "v2": "rejected"}
    metrics = metrics_text(fleet.sup)
    for result, count in (("ok", 1), ("rolled_back", 1), ("refused", 0)):
        assert f'cuzkd_binary_swaps_total{{result="{result}"}} {count}' in metrics
    for result, count in (("ok", 1), ("failed", 1)):
        assert f'cuzkd_binary_rollbacks_total{{result="{result}"}} {count}' in metrics

    shown = cuzkd(fleet, "swap", "--history")
    assert shown.returncode == 0, shown.stderr
    rows = {line.split()[0]: line for line in shown.stdout.splitlines()[1:]}
    assert rows[fleet.ids["v1"]].split()[1:2] == ["accepted"] and "active" in rows[fleet.ids["v1"]]
    assert "exit_1" in rows[fleet.ids["crash"]]
    assert "rolled back by `cuzkd swap --rollback`" in rows[fleet.ids["v2"]]
    as_json = json.loads(cuzkd(fleet, "swap", "--history", "--json").stdout)
    assert as_json["active"] == fleet.ids["v1"] and as_json["rollback_target"] is None
    status = cuzkd(fleet, "status")
    assert f"active release {fleet.ids['v1']}: accepted at " in status.stdout


def test_a_rollback_whose_engines_fail_is_undone(fleet: Fleet) -> None:
    assert fleet.swap(str(fleet.src["v2"])).returncode == 0
    (fleet.tmp / "broken-version").write_text("v1")  # v1 ran well; it crashes from now on

    done = fleet.swap("--rollback")

    assert done.returncode == 1
    assert "rollback failed: engine gpu0:" in done.stderr
    assert "exit_1" in done.stderr and "the rollback was undone" in done.stderr
    fleet.wait_running()
    fleet.assert_engines_on("v2")
    assert fleet.verdicts() == {"v1": "rejected", "v2": "accepted"}
    metrics = metrics_text(fleet.sup)
    assert 'cuzkd_binary_rollbacks_total{result="failed"} 1' in metrics
    assert 'cuzkd_binary_swaps_total{result="rolled_back"} 0' in metrics
    status = cuzkd(fleet, "status")
    assert f"active release {fleet.ids['v2']}: accepted" in status.stdout


def test_a_damaged_history_is_set_aside_at_start_and_the_fleet_runs(fleet: Fleet) -> None:
    assert fleet.swap(str(fleet.src["v2"])).returncode == 0
    fleet.sup.stop()
    path = fleet.sup.state_dir / "history.json"
    torn = path.read_bytes()[:57] + b"\xff"  # cut mid-record, with a byte that is not UTF-8
    path.write_bytes(torn)

    fleet.sup = start_supervisor(fleet.sup.config)

    fleet.wait_running()
    fleet.assert_engines_on("v2")
    [unreadable] = fleet.sup.events("swap_history_unreadable")
    assert "history.json: not UTF-8 (byte 0xff at offset 57)" in unreadable["error"]
    assert Path(unreadable["moved_to"]).read_bytes() == torn
    fleet.wait_accepted("v2")  # judged again like a seed
    assert fleet.history()["records"][0]["origin"] == "recovered"
    refused = fleet.swap("--rollback")  # v1's verdict went with the damaged file
    assert refused.returncode == 1 and "no accepted release" in refused.stderr
    fleet.assert_engines_on("v2")


def test_a_smoke_test_must_pass_before_the_swap(fleet: Fleet) -> None:
    pids = fleet.pids()
    failed = fleet.swap(str(fleet.src["v2"]), "--smoke", "--bogus-flag")
    assert failed.returncode == 1
    assert "smoke test ['--bogus-flag'] ended with exit_2" in failed.stderr
    assert fleet.pids() == pids
    fleet.assert_engines_on("v1")

    # A smoke run that does not end (v2 serving on a spare port) is killed, group and all.
    smoke_port = free_port()
    hung = fleet.swap(str(fleet.src["v2"]), "--smoke", f"--port {smoke_port}",
                      "--smoke-timeout", "0.5s")
    assert hung.returncode == 1
    assert "ended with timeout" in hung.stderr
    [spawned] = [e for e in fleet.sup.events("oneshot_spawned")
                 if e["argv"][1:] == ["--port", str(smoke_port)]]
    wait_until(lambda: not pid_alive(spawned["pid"]), 5, "the smoke run to be gone")
    assert fleet.pids() == pids

    done = fleet.swap(str(fleet.src["v2"]), "--smoke", "--version")

    assert done.returncode == 0, done.stderr
    assert "smoke_test" in done.stdout and "cause=exit_0" in done.stdout
    assert fleet.sup.events("engine_output", line="v2")  # the smoke run's output is logged
    fleet.assert_engines_on("v2")


def test_the_first_swap_on_an_empty_store_starts_the_failed_engines(
    tmp_path: Path, builds: dict[str, Path]
) -> None:
    fleet = start_fleet(tmp_path, builds, initial=None)
    try:
        for name in BINARY_ENGINES:
            eng = fleet.sup.wait_engine(name, lambda e: e["state"] == "failed")
            assert "no active release" in eng["last_error"]
        fleet.wait_running(("py",))

        done = fleet.swap(str(fleet.src["v1"]))

        assert done.returncode == 0, done.stderr
        fleet.assert_engines_on("v1")
    finally:
        fleet.sup.stop()


@pytest.mark.parametrize("step", ["installed", "activated", "restarting", "healthy"])
def test_a_supervisor_killed_during_a_swap_restarts_consistent(
    tmp_path: Path, builds: dict[str, Path], step: str
) -> None:
    fleet = start_fleet(tmp_path, builds)
    try:
        fleet.wait_running()
        old_pids = [pid for pid in fleet.pids().values() if pid is not None]
        swap = subprocess.Popen(fleet.swap_argv(str(fleet.src["v2"]), settle="0.5s"),
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_until(lambda: fleet.sup.events("swap_step_reached", step=step), 30,
                   f"swap step {step}")
        fleet.sup.proc.send_signal(signal.SIGKILL)
        fleet.sup.stop()
        assert swap.wait(30) != 0  # the stream broke before a result
        wait_until(lambda: not any(map(pid_alive, old_pids)), 10, "the engines to die with it")
        log_lines = len(fleet.sup.log_text().splitlines())

        fleet.sup = start_supervisor(fleet.sup.config)

        fleet.wait_running()
        assert temp_entries(fleet.sup.state_dir) == []
        active = fleet.store.active()
        assert active is not None
        version = "v2" if active.id == fleet.ids["v2"] else "v1"
        fleet.assert_engines_on(version)
        # The history agrees: whichever release runs is accepted once healthy through settle
        # (v2 that a crash left on trial, like the seed); a v2 that never became active is
        # rejected as interrupted, never a rollback target.
        fleet.wait_accepted(version)
        assert fleet.verdicts().get("v2", "rejected") == ("accepted" if version == "v2"
                                                          else "rejected")
        ignored = [line for line in fleet.sup.log_text().splitlines()[log_lines:]
                   if "initial_binary_ignored" in line]
        assert bool(ignored) == (version == "v2")  # initial_binary (v1) never swaps silently
    finally:
        fleet.sup.stop()
