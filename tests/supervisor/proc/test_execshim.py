"""Spawning through the exec shim: no Python between fork and exec, every guarantee kept.

Real processes throughout: what is checked is what the kernel shows of the spawned engine
(its pid, exe, cmdline, descriptors, ignored signals, session), what a SIGKILLed parent does
to it, and the errors a failing exec raises, compared with what ``subprocess.Popen`` itself
raises for the same command.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import select
import shutil
import signal
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from cuzkd.supervisor.proc import execshim, spawn
from cuzkd.supervisor.proc.children import ChildTable
from cuzkd.supervisor.proc.spawn import _SHIM, EngineProcess, spawn_error_is_transient


def _collect(proc: EngineProcess) -> int:
    """Wait for ``proc`` as the reaper would; its exit code."""
    proc.stdout.close()
    proc.stderr.close()
    status = os.waitpid(proc.pid, 0)[1]
    proc.reaped(status)
    return os.waitstatus_to_exitcode(status)


def _run(argv: list[str], env: dict[str, str] | None = None) -> tuple[bytes, int]:
    """Spawn ``argv``, read its stdout to the end; (stdout, exit code)."""
    proc = EngineProcess(argv, os.environ if env is None else env)
    out = proc.stdout.read()
    return out, _collect(proc)


def _children() -> set[int]:
    """This process's children, zombies included (a thread that ends while its task directory
    is read -- gRPC's and the test runner's come and go -- had none of ours)."""
    found: set[int] = set()
    for task in Path("/proc/self/task").iterdir():
        try:
            found.update(int(pid) for pid in (task / "children").read_text().split())
        except FileNotFoundError:
            continue
    return found


def _open_descriptors(pid: int) -> dict[int, str]:
    """What each of ``pid``'s descriptors points at, as it is while we look: a running program
    opens and closes files of its own (``yes`` reads its locale), so one may vanish between
    the listing and its ``readlink``."""
    found: dict[int, str] = {}
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            found[int(fd)] = os.readlink(f"/proc/{pid}/fd/{fd}")
        except FileNotFoundError:
            continue
    return found


def test_the_engine_is_exec_d_in_place_with_only_its_own_state() -> None:
    # Arbitrary bytes in argv and env arrive unchanged (surrogate escapes are the bytes).
    # ``yes`` takes any arguments and runs until killed (blocked on its full stdout pipe).
    argv = ["yes", "\udcff-odd-bytes-\u00e9", ""]
    env = {"PATH": os.defpath, "CUZKD_ENGINE": "e\udcfe", "EMPTY": ""}
    proc = EngineProcess(argv, env)
    try:
        wanted = shutil.which("yes", path=os.defpath)
        assert wanted is not None
        # the engine itself, not the shim's python
        assert Path(f"/proc/{proc.pid}/exe").resolve() == Path(wanted).resolve()
        assert Path(f"/proc/{proc.pid}/cmdline").read_bytes() == b"".join(
            os.fsencode(arg) + b"\0" for arg in argv)
        assert Path(f"/proc/{proc.pid}/environ").read_bytes() == (
            b"PATH=" + os.fsencode(os.defpath) + b"\0CUZKD_ENGINE=e\xfe\0EMPTY=\0")
        assert os.getsid(proc.pid) == os.getpgid(proc.pid) == proc.pid
        fds = _open_descriptors(proc.pid)
        assert fds[0] == os.devnull and fds[1].startswith("pipe:") and fds[2].startswith("pipe:")
        # no report pipe, no spec memfd, no socket: past 0-2 only files ``yes`` opens itself
        assert all(target.startswith("/") and not target.startswith("/memfd:")
                   for fd, target in fds.items() if fd > 2), fds
        [ignored] = [int(line.split()[1], 16) for line in
                     Path(f"/proc/{proc.pid}/status").read_text().splitlines()
                     if line.startswith("SigIgn:")]
        for signum in (signal.SIGPIPE, signal.SIGXFSZ):  # the shim's interpreter ignored them
            assert not ignored & (1 << (signum - 1)), signal.Signals(signum).name
    finally:
        proc.signal_group(signal.SIGKILL)
        _collect(proc)


def test_the_engine_is_looked_up_in_the_path_of_its_own_environment(tmp_path: Path) -> None:
    denied, found = tmp_path / "denied", tmp_path / "found"
    for where, mode in ((denied, 0o644), (found, 0o755)):
        where.mkdir()
        (where / "cuzk-fake").write_text('#!/bin/sh\nprintf %s "$0"\n')
        (where / "cuzk-fake").chmod(mode)
    path = f"{tmp_path / 'missing'}:{denied}:{found}"
    # Past a missing directory and a file it may not run, as Popen's own search goes on.
    assert _run(["cuzk-fake"], {"PATH": path}) == (os.fsencode(found / "cuzk-fake"), 0)
    with pytest.raises(PermissionError):  # the first error that is not ENOENT is the one
        EngineProcess(["cuzk-fake"], {"PATH": f"{tmp_path / 'missing'}:{denied}"})


def _failing_commands(tmp: Path) -> dict[str, tuple[list[str], dict[str, str]]]:
    garbage = tmp / "garbage"
    garbage.write_bytes(b"\x7fELF garbage, not a program")
    garbage.chmod(0o755)
    text = tmp / "text"
    text.write_text("#!/bin/sh\n")
    text.chmod(0o644)
    (tmp / "dir").mkdir()
    return {
        "ENOENT": ([str(tmp / "no-such-cuzk")], {}),
        "ENOENT in PATH": (["no-such-cuzk"], {"PATH": f"{tmp}:{tmp / 'nowhere'}"}),
        # the first error that is not ENOENT/ENOTDIR wins over the later ones
        "EACCES, then ENOENT in PATH": (["text"], {"PATH": f"{tmp}:{tmp / 'nowhere'}"}),
        "EACCES": ([str(text)], {}),
        "EACCES directory": ([str(tmp / "dir")], {}),
        "ENOEXEC": ([str(garbage)], {}),
        "ENOTDIR": ([str(text / "cuzk")], {}),
        "E2BIG": (["/bin/true"], {"HUGE": "x" * (256 << 10)}),  # over MAX_ARG_STRLEN
        "empty argv[0]": ([""], {}),
        "empty argv[0], empty PATH": ([""], {"PATH": ""}),
    }


def test_exec_errors_are_raised_as_popen_raises_them(tmp_path: Path) -> None:
    for name, (argv, env) in _failing_commands(tmp_path).items():
        with pytest.raises(OSError) as popen_error:
            subprocess.Popen(argv, env=env)
        with pytest.raises(OSError) as ours:
            EngineProcess(argv, env)
        seen = (type(ours.value), ours.value.errno, ours.value.strerror, ours.value.filename)
        assert seen == (type(popen_error.value), popen_error.value.errno,
                        popen_error.value.strerror, popen_error.value.filename), name


def test_a_binary_still_being_written_is_etxtbsy(tmp_path: Path) -> None:
    binary = tmp_path / "cuzk"
    with binary.open("wb") as writing:
        writing.write(Path("/bin/true").read_bytes())
        writing.flush()
        binary.chmod(0o755)
        with pytest.raises(OSError) as caught:
            EngineProcess([str(binary)], {})
    assert caught.value.errno == errno.ETXTBSY


def test_a_failed_spawn_leaves_no_child_and_no_descriptor(tmp_path: Path) -> None:
    fds, children = set(os.listdir("/proc/self/fd")), _children()
    for argv, env in _failing_commands(tmp_path).values():
        with pytest.raises(OSError):
            EngineProcess(argv, env)
    assert _children() == children  # each shim was collected by the spawn itself
    assert set(os.listdir("/proc/self/fd")) == fds


def test_bad_commands_fail_before_anything_is_spawned() -> None:
    children = _children()
    for argv, env in ((["true", "a\0b"], {}), (["true"], {"A": "a\0b"}),
                      (["true"], {"A=B": "c"}), ([], {}), (["tr\0ue"], {"PATH": "/bin"})):
        with pytest.raises(ValueError):
            EngineProcess(argv, env)
    assert _children() == children


async def test_an_empty_smoke_command_is_a_spawn_failure() -> None:
    # Smoke commands come from the API's JSON: an empty list used to escape as IndexError.
    table = ChildTable()
    table.install(asyncio.get_running_loop())
    try:
        assert (await table.run_oneshot([], 10)).startswith("spawn_failed")
    finally:
        table.uninstall()


def test_spawning_off_the_main_thread_is_refused() -> None:
    # PDEATHSIG is tied to the forking thread: an engine forked by a worker thread would be
    # SIGKILLed when that thread ends.
    children, raised = _children(), []

    def spawn() -> None:
        try:
            EngineProcess(["true"], {})
        except RuntimeError as exc:
            raised.append(exc)

    worker = threading.Thread(target=spawn, name="to_thread-like")
    worker.start()
    worker.join()
    assert len(raised) == 1 and "main thread" in str(raised[0])
    assert _children() == children


class _HeldLock:
    """Holds logging's module lock on a thread until released (5 s at most): the lock the
    ``preexec_fn`` path takes in the parent before every fork (logging's at-fork hook).

    Held through public API: a logger manager of its own whose logger class blocks in its
    constructor, which ``Manager.getLogger`` calls under the module lock."""

    def __init__(self) -> None:
        self.held, self.released = threading.Event(), threading.Event()
        self.gave_up = False
        self._thread = threading.Thread(target=self._hold, daemon=True)

    def _hold(self) -> None:
        outer = self

        class BlockingLogger(logging.Logger):
            def __init__(self, name: str) -> None:
                outer.held.set()
                outer.gave_up = not outer.released.wait(5)
                super().__init__(name)

        manager = logging.Manager(logging.RootLogger(logging.WARNING))
        manager.setLoggerClass(BlockingLogger)
        manager.getLogger("held")

    def __enter__(self) -> _HeldLock:
        self._thread.start()
        assert self.held.wait(5)
        return self

    def __exit__(self, *exc: object) -> None:
        self.released.set()
        self._thread.join()


def test_spawning_does_not_wait_for_a_lock_another_thread_holds() -> None:
    with _HeldLock() as lock:
        out, code = _run(["echo", "started"])
        assert not lock.gave_up  # the spawn returned while the other thread held the lock
    assert (out, code) == (b"started\n", 0)


_SUPERVISOR_LIKE = """
import os, sys, time
from cuzkd.supervisor.proc.spawn import EngineProcess
engine = EngineProcess(["sleep", "60"], os.environ)
print(engine.pid, flush=True)
time.sleep(60)
"""


def _exits_within(pid: int, timeout: float) -> bool:
    pidfd = os.pidfd_open(pid)
    try:
        return bool(select.select([pidfd], [], [], timeout)[0])
    finally:
        os.close(pidfd)


def test_an_engine_dies_with_its_sigkilled_supervisor() -> None:
    parent = subprocess.Popen([sys.executable, "-c", _SUPERVISOR_LIKE], stdout=subprocess.PIPE,
                              text=True)
    try:
        assert parent.stdout is not None
        engine = int(parent.stdout.readline())
        pidfd = os.pidfd_open(engine)  # before the kill: the pid cannot be reused under us
        try:
            assert not select.select([pidfd], [], [], 0)[0]
            parent.kill()
            assert select.select([pidfd], [], [], 10)[0], "the engine outlived its supervisor"
        finally:
            os.close(pidfd)
    finally:
        parent.kill()
        parent.wait()


def _shim(supervisor_pid: int, argv: list[str], report: Callable[[int], None]
          ) -> subprocess.Popen[bytes]:
    """The shim, started by hand with ``supervisor_pid`` as the parent it must find."""
    spec = os.memfd_create("spec")
    os.write(spec, execshim.encode_spec(argv, {"PATH": os.defpath}))
    os.lseek(spec, 0, os.SEEK_SET)
    report_r, report_w = os.pipe()
    try:
        return subprocess.Popen([*_SHIM, str(supervisor_pid), str(spec), str(report_w)],
                                pass_fds=(spec, report_w), stdout=subprocess.PIPE)
    finally:
        os.close(spec)
        os.close(report_w)
        report(report_r)


def test_the_shim_exits_without_exec_when_its_supervisor_is_already_gone(tmp_path: Path) -> None:
    # The supervisor died between the fork and the prctl: the shim's parent is no longer the
    # pid it was given, PDEATHSIG will never fire, so it must not become the engine.
    marker = tmp_path / "ran"
    reports: list[int] = []
    shim = _shim(os.getpid() + 1, ["touch", str(marker)], reports.append)
    assert shim.wait(30) == execshim.EXIT_SUPERVISOR_GONE
    assert os.read(reports[0], 64) == b"" and not marker.exists()
    os.close(reports[0])
    assert shim.stdout is not None
    shim.stdout.close()


def test_the_shim_passes_for_its_real_parent_and_reports_a_failed_exec() -> None:
    reports: list[int] = []
    shim = _shim(os.getpid(), ["no-such-cuzk"], reports.append)
    assert shim.wait(30) == execshim.EXIT_EXEC_FAILED
    assert os.read(reports[0], 64) == execshim.STARTED + str(errno.ENOENT).encode()
    os.close(reports[0])
    assert shim.stdout is not None
    shim.stdout.close()


def test_a_shim_that_cannot_run_is_a_spawn_error_not_an_engine_exit(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # The interpreter broken (a Python fatal error), or the shim killed before it ran: the
    # engine never started, and the spawn says why instead of returning a pid about to exit.
    fds, children = set(os.listdir("/proc/self/fd")), _children()
    for code, cause, said in (("import sys; sys.exit('Fatal Python error: no encodings')",
                               "exit_1", "Fatal Python error: no encodings"),
                              ("import os; os.kill(os.getpid(), 9)", "signal_SIGKILL", "")):
        monkeypatch.setattr(spawn, "_SHIM", (sys.executable, "-I", "-S", "-c", code))
        with pytest.raises(subprocess.SubprocessError) as caught:
            EngineProcess(["true"], {})
        assert f"ended before it ran ({cause})" in str(caught.value)
        assert said in str(caught.value) and not spawn_error_is_transient(caught.value)
    monkeypatch.setattr(spawn, "_SHIM", ("/nonexistent/python", "-I", "-S", "-c", ""))
    with pytest.raises(FileNotFoundError) as missing:  # the interpreter itself gone (a venv)
        EngineProcess(["true"], {})
    assert missing.value.filename == "/nonexistent/python"
    assert _children() == children and set(os.listdir("/proc/self/fd")) == fds


_STDIO_CLOSED = """
import os
from cuzkd.supervisor.proc.spawn import EngineProcess
os.close(0)  # a supervisor started with stdin closed: the spec memfd would land on 0
engine = EngineProcess(["echo", "ran"], {"PATH": os.defpath})
print(engine.stdout.read().decode().strip(), os.waitpid(engine.pid, 0)[1])
"""


def test_spawning_works_with_stdin_closed() -> None:
    out = subprocess.run([sys.executable, "-c", _STDIO_CLOSED], capture_output=True, text=True,
                         timeout=30, check=True).stdout.split()
    assert out == ["ran", "0"]


def test_the_spec_round_trips_every_shape() -> None:
    argv = ["cuzk", "", "\udcff", "a b", "é"]
    env = {"": "no name", "EMPTY": "", "X": "=y="}
    candidates, args, envp = execshim.decode_spec(execshim.encode_spec(argv, env))
    assert args == [os.fsencode(a) for a in argv]
    assert envp == [b"=no name", b"EMPTY=", b"X==y="]
    assert candidates == [os.fsencode(os.path.join(d, "cuzk")) for d in os.defpath.split(":")]
    for cut in (b"", b"1\0/bin/x", b"1\0/bin/x\x003\0x"):
        with pytest.raises(ValueError):
            execshim.decode_spec(cut)
