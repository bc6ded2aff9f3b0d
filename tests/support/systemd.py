"""The distribution's systemd as PID 1 in private namespaces, driven from outside with systemctl.

`boot_pid1.sh` does the mounts (all inside a private mount namespace, so they vanish with it);
this module owns what outlives a namespace and must be cleaned up on every path: a private
cgroup in each hierarchy, and the processes. `booted_systemd()` is a context manager whose exit
powers the machine off, SIGKILLs its PID 1 if that does not work, kills whatever is left in the
private cgroups and removes them deepest first.

Commands run inside with ``nsenter -t PID1 -m -p`` (systemctl needs to see itself in the
machine's /proc to be trusted on the private bus) and an empty environment (`env -i`): the
caller's PATH would otherwise leak in (and e.g. a Python under /root is hidden by the unit's
ProtectHome=). HTTP requests go through ``nsenter -n``: the machine has a private network with
only loopback, so the unit's port cannot collide with anything on the host.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from support.inline_http import GET_SCRIPT, parse_get_output
from support.waiting import wait_until

HERE = Path(__file__).resolve().parent
BOOT_SCRIPT = HERE / "boot_pid1.sh"
INNER_PATH = "PATH=/usr/sbin:/usr/bin:/sbin:/bin"
BOOT_TARGET = "cuzkd-live.target"
ABSENT_LIST = ".cuzkd-live-absent"  # read and removed by boot_pid1.sh


def namespaces_unavailable() -> str | None:
    """Why systemd cannot be booted here (None when it can): the one reason to skip."""
    if os.geteuid() != 0:
        return "needs root to create mount, PID and cgroup namespaces"
    for tool in ("unshare", "nsenter", "setpriv"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed (apt-get install util-linux)"
    if not Path("/lib/systemd/systemd").exists():
        return "/lib/systemd/systemd is not installed (apt-get install systemd)"
    probe = subprocess.run(["unshare", "--pid", "--fork", "--mount", "--cgroup", "--net",
                            "--propagation", "private", "true"],
                           capture_output=True, text=True, timeout=30, check=False)
    if probe.returncode != 0:
        return f"cannot create namespaces: {probe.stderr.strip()}"
    return None


# --- cgroups -------------------------------------------------------------------------------

@dataclass
class PrivateCgroups:
    """One new cgroup below the caller's own in every hierarchy the caller belongs to."""

    name: str
    dirs: list[Path] = field(default_factory=list)
    parents: list[Path] = field(default_factory=list)

    def create(self) -> None:
        for parent in _own_cgroup_dirs():
            path = parent / self.name
            path.mkdir()
            self.dirs.append(path)
            self.parents.append(parent)
            # A v1 cpuset starts empty; a process cannot join it until it has CPUs and nodes.
            for knob in ("cpuset.cpus", "cpuset.mems"):
                if (parent / knob).exists() and not (parent / "cgroup.type").exists():
                    (path / knob).write_text((parent / knob).read_text())

    def procs_files(self) -> list[str]:
        return [str(d / "cgroup.procs") for d in self.dirs]

    def move_out(self, pid: int) -> None:
        """Put ``pid`` back into the caller's cgroups (the launcher must not sit in the root)."""
        for parent in self.parents:
            (parent / "cgroup.procs").write_text(str(pid))

    def pids(self) -> set[int]:
        found: set[int] = set()
        for top in self.dirs:
            for procs in top.rglob("cgroup.procs"):
                with contextlib.suppress(OSError):
                    found.update(int(p) for p in procs.read_text().split())
        return found

    def remove(self, timeout: float = 20.0) -> None:
        """SIGKILL anything left, then remove every cgroup deepest first."""
        deadline = time.monotonic() + timeout
        while True:
            for pid in self.pids():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            left = []
            for top in self.dirs:
                if not top.exists():
                    continue
                subs = sorted((p for p in top.rglob("*") if p.is_dir()),
                              key=lambda p: len(p.parts), reverse=True)
                for sub in [*subs, top]:
                    try:
                        sub.rmdir()
                    except OSError:
                        left.append(sub)
            if not left:
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"cgroups not removable: {left[:5]}")
            time.sleep(0.05)


def _own_cgroup_dirs() -> list[Path]:
    """The directories of this process's cgroups, one per hierarchy (from mountinfo)."""
    mounts: dict[str, tuple[str, str]] = {}  # hierarchy key -> (mount root, mount point)
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        pre, _, post = line.partition(" - ")
        fstype, _source, super_opts = post.split()[:3]
        fields_ = pre.split()
        root, point = fields_[3], fields_[4]
        if fstype == "cgroup2":
            mounts.setdefault("", (root, point))
        elif fstype == "cgroup":
            opts = [o for o in super_opts.split(",")
                    if o not in ("rw", "ro") and not o.startswith(("release_agent", "clone_"))
                    and o not in ("xattr", "noprefix", "cpuset_v2_mode")]
            mounts.setdefault(",".join(sorted(opts)), (root, point))
    dirs = []
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _hid, controllers, path = line.split(":", 2)
        key = ",".join(sorted(c for c in controllers.split(",") if c))
        if key not in mounts:
            raise RuntimeError(f"cgroup hierarchy {controllers!r} is not mounted")
        root, point = mounts[key]
        rel = os.path.relpath(path, root) if path.startswith(root) else path.lstrip("/")
        dirs.append(Path(point) / ("" if rel == "." else rel))
    return dirs


# --- the machine ---------------------------------------------------------------------------

@dataclass
class Machine:
    """A booted systemd; every method runs something inside it and returns the result."""

    pid1: int  # host PID of the container's PID 1
    cgroups: PrivateCgroups
    console: Path
    python: str = sys.executable

    @property
    def root(self) -> Path:
        """The machine's root file system, seen from the host."""
        return Path(f"/proc/{self.pid1}/root")

    def run(self, *argv: str, check: bool = True, timeout: float = 120
            ) -> subprocess.CompletedProcess[str]:
        cmd = ["nsenter", "-t", str(self.pid1), "-m", "-p", "env", "-i", INNER_PATH, *argv]
        result = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                                check=False)
        if check and result.returncode != 0:
            raise AssertionError(f"{' '.join(argv)} exited {result.returncode}:\n"
                                 f"{result.stdout}{result.stderr}")
        return result

    def systemctl(self, *args: str, check: bool = True, timeout: float = 120
                  ) -> subprocess.CompletedProcess[str]:
        return self.run("systemctl", "--no-pager", *args, check=check, timeout=timeout)

    def show(self, unit: str, *props: str) -> dict[str, str]:
        out = self.systemctl("show", unit, *(f"--property={p}" for p in props)).stdout
        return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)

    def http_get(self, url: str, timeout: float = 10) -> tuple[int, str]:
        """(status, body) of a GET made inside the machine's network namespace."""
        result = subprocess.run(["nsenter", "-t", str(self.pid1), "-n", self.python, "-c",
                                 GET_SCRIPT, url, str(timeout)], capture_output=True, text=True,
                                timeout=timeout + 10, check=True)
        return parse_get_output(result.stdout)

    def host_pid(self, inner_pid: int) -> int:
        """The host PID of the process that has ``inner_pid`` in the machine's PID namespace."""
        for entry in self._entries():
            with contextlib.suppress(OSError):
                match = re.search(r"^NSpid:\s+(.*)$", (entry / "status").read_text(), re.M)
                if match and int(match.group(1).split()[-1]) == inner_pid:
                    return int(entry.name)
        raise LookupError(f"no process {inner_pid} in the machine")

    def processes(self) -> list[tuple[int, str]]:
        """(host PID, command line) of every process in the machine's PID namespace."""
        out = []
        for entry in self._entries():
            with contextlib.suppress(OSError):
                cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ")
                out.append((int(entry.name), cmdline.decode(errors="replace").strip()))
        return out

    def _entries(self) -> Iterator[Path]:
        """/proc/PID of every process in the machine's PID namespace (host view)."""
        ns = os.readlink(f"/proc/{self.pid1}/ns/pid")
        for entry in Path("/proc").iterdir():
            with contextlib.suppress(OSError):
                if entry.name.isdigit() and os.readlink(entry / "ns" / "pid") == ns:
                    yield entry

    def cgroup_pids(self, control_group: str) -> set[int]:
        """Host PIDs in a unit's cgroup (``ControlGroup=`` as systemd shows it), subtree too."""
        top = self.cgroups.dirs[self._systemd_hierarchy()] / control_group.lstrip("/")
        found: set[int] = set()
        if top.exists():
            for procs in top.rglob("cgroup.procs"):
                with contextlib.suppress(OSError):
                    found.update(int(p) for p in procs.read_text().split())
        return found

    def _systemd_hierarchy(self) -> int:
        for index, parent in enumerate(self.cgroups.parents):
            if parent.parts[:4] == ("/", "sys", "fs", "cgroup") and "systemd" in parent.parts:
                return index
        # A pure cgroup2 host: the single hierarchy.
        return 0


@dataclass
class Payload:
    """Files copied over the overlay's root before boot, and read-only bind mounts."""

    files: dict[str, bytes | str] = field(default_factory=dict)
    modes: dict[str, int] = field(default_factory=dict)
    binds: list[tuple[Path, str]] = field(default_factory=list)
    symlinks: dict[str, str] = field(default_factory=dict)
    venvs: list[tuple[str, str]] = field(default_factory=list)  # (path, base interpreter)
    # Host paths the machine must not see (a host's own state for the unit under test).
    absent: list[str] = field(default_factory=list)

    def write(self, where: Path) -> None:
        where.mkdir(mode=0o755, exist_ok=True)
        for venv, python in self.venvs:
            subprocess.run([python, "-m", "venv", "--without-pip", str(where / venv.lstrip("/"))],
                           check=True, timeout=120)
        for name, content in self.files.items():
            path = where / name.lstrip("/")
            path.parent.mkdir(parents=True, exist_ok=True)
            if isinstance(content, str):
                content = content.encode()
            path.write_bytes(content)
            path.chmod(self.modes.get(name, 0o644))
        if self.absent:
            (where / ABSENT_LIST).write_text("".join(f"{name}\n" for name in self.absent))
        for name, target in self.symlinks.items():
            path = where / name.lstrip("/")
            path.parent.mkdir(parents=True, exist_ok=True)
            path.symlink_to(target)
        # Directories readable by everyone: the unit runs as a dynamic user, and `cp -a`
        # carries these modes onto the machine's root.
        for path in [where, *where.rglob("*")]:
            if path.is_dir() and not path.is_symlink():
                path.chmod(0o755)


def boot_payload() -> Payload:
    """The boot target alone: basic.target and journald, the host image's timers masked."""
    return Payload(
        files={f"/etc/systemd/system/{BOOT_TARGET}": (
            "[Unit]\nDescription=cuzkd live test boot target\n"
            "Requires=basic.target systemd-journald.socket\n"
            "After=basic.target systemd-journald.socket\nAllowIsolate=yes\n")},
        # timers.target would start the host image's timers (apt, logrotate, ...).
        symlinks={"/etc/systemd/system/timers.target": "/dev/null"})


@contextlib.contextmanager
def booted_systemd(workdir: Path, payload: Payload, boot_timeout: float = 60,
                   poweroff_timeout: float = 30) -> Iterator[Machine]:
    """Boot systemd over an overlay of / with ``payload`` on top; power off and clean up on exit."""
    workdir.mkdir(parents=True, exist_ok=True)
    payload_dir = workdir / "payload"
    payload.write(payload_dir)
    mnt = workdir / "mnt"
    mnt.mkdir()
    console = workdir / "console.log"
    console.touch()
    cgroups = PrivateCgroups(f"cuzkd-live-{uuid.uuid4().hex[:12]}")
    launcher: subprocess.Popen[bytes] | None = None
    pid1 = 0
    try:
        cgroups.create()
        binds = [str(x) for src, dst in payload.binds for x in (src, dst)]
        with console.open("ab") as boot_log:
            launcher = subprocess.Popen(
                ["/bin/bash", str(BOOT_SCRIPT), "launch", str(mnt), str(payload_dir),
                 str(console), BOOT_TARGET, *cgroups.procs_files(), "--", *binds],
                stdin=subprocess.DEVNULL, stdout=boot_log, stderr=subprocess.STDOUT)
        proc = launcher

        def child() -> int | None:
            if proc.poll() is not None:
                raise AssertionError(f"boot failed (exit {proc.returncode}):\n"
                                     f"{console.read_text(errors='replace')}")
            with contextlib.suppress(OSError):
                kids = Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()
                if kids:
                    return int(kids[0])
            return None

        pid1 = wait_until(child, boot_timeout, "the machine's PID 1")
        cgroups.move_out(launcher.pid)
        machine = Machine(pid1=pid1, cgroups=cgroups, console=console)
        wait_until(lambda: child() and (machine.root / "run/systemd/private").exists(),
                   boot_timeout, "systemd's private bus socket")
        state = machine.systemctl("is-system-running", "--wait", check=False,
                                  timeout=boot_timeout).stdout.strip()
        if state not in ("running", "degraded"):
            raise AssertionError(f"boot ended {state!r}:\n"
                                 + machine.systemctl("--failed", check=False).stdout)
        yield machine
    finally:
        _power_off(launcher, pid1, poweroff_timeout)
        if cgroups.dirs:
            cgroups.remove()


def _power_off(launcher: subprocess.Popen[bytes] | None, pid1: int, timeout: float) -> None:
    """SIGRTMIN+4 (poweroff) to PID 1; SIGKILL it (and so the PID namespace) if that stalls."""
    if launcher is None:
        return
    if pid1 and launcher.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid1, signal.SIGRTMIN + 4)
        with contextlib.suppress(subprocess.TimeoutExpired):
            launcher.wait(timeout=timeout)
    if launcher.poll() is None:
        if pid1:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid1, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            launcher.wait(timeout=10)
    if launcher.poll() is None:
        launcher.kill()
        launcher.wait(timeout=10)
