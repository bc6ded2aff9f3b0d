"""Reusable helpers for tests that need a real ``cuzkd run``.

- :func:`write_config` writes a TOML config into a temp dir (state_dir inside it, metrics on
  port 0 so tests never collide).
- :func:`scripted_engine` is the ``[[engine]]`` table for ``scripted_engine.py`` (beside this
  module, run by path) in a given mode.
- :func:`start_supervisor` runs ``python -m cuzkd run --config ...`` as a real process, its
  JSON log going to a file, and returns once the control socket answers.
- :class:`RunningSupervisor` talks to the control socket with plain ``http.client`` (sync, no
  event loop needed in tests), reads the log events, and stops the process.
- :class:`NotifyListener` is a ``NOTIFY_SOCKET`` collecting what the supervisor sends systemd;
  :func:`read_until` reads a pipe (a supervisor's output) up to a marker.
"""

from __future__ import annotations

import http.client
import json
import os
import select
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from support.waiting import wait_until

FAKE_ENGINE = Path(__file__).with_name("scripted_engine.py")


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, Sequence):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    if isinstance(value, Mapping):
        return "{" + ", ".join(f"{k} = {_toml_value(v)}" for k, v in value.items()) + "}"
    raise TypeError(value)


def to_toml(tables: Mapping[str, Any]) -> str:
    """Minimal TOML writer: tables of scalars/lists/inline tables, ``engine`` as array."""
    out: list[str] = []
    for name, body in tables.items():
        items = body if isinstance(body, list) else [body]
        for item in items:
            out.append(f"[[{name}]]" if isinstance(body, list) else f"[{name}]")
            out.extend(f"{k} = {_toml_value(v)}" for k, v in item.items())
            out.append("")
    return "\n".join(out)


def scripted_engine(tmp: Path, name: str, mode: str = "serve", *, args: Sequence[str] = (),
                **keys: Any) -> dict[str, Any]:
    """An ``[[engine]]`` running scripted_engine.py on a Unix socket under ``tmp``."""
    sock = tmp / f"{name}.sock"
    return {
        "name": name,
        "command": [sys.executable, str(FAKE_ENGINE), "--socket", str(sock), "--mode", mode,
                    *args],
        "status_url": f"unix:{sock}",
        **keys,
    }


def write_config(tmp: Path, engines: list[dict[str, Any]], *,
                 supervisor: Mapping[str, Any] | None = None,
                 defaults: Mapping[str, Any] | None = None,
                 metrics: Mapping[str, Any] | None = None,
                 door: Mapping[str, Any] | None = None) -> Path:
    tables: dict[str, Any] = {
        "supervisor": {"state_dir": str(tmp / "state"), **(supervisor or {})},
        "metrics": {"listen": "127.0.0.1:0", **(metrics or {})},
    }
    if door:
        tables["door"] = dict(door)
    if defaults:
        tables["engine_defaults"] = dict(defaults)
    tables["engine"] = engines
    path = tmp / "cuzkd.toml"
    path.write_text(to_toml(tables))
    return path


class _UnixHTTPConnection(http.client.HTTPConnection):
    def __init__(self, path: str, timeout: float) -> None:
        super().__init__("cuzkd", timeout=timeout)
        self._path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        sock.connect(self._path)
        self.sock = sock


def unix_request(path: Path, method: str, url: str, timeout: float = 30.0) -> tuple[int, Any]:
    conn = _UnixHTTPConnection(str(path), timeout)
    try:
        conn.request(method, url)
        resp = conn.getresponse()
        return resp.status, json.loads(resp.read() or b"null")
    finally:
        conn.close()


@dataclass
class RunningSupervisor:
    proc: subprocess.Popen[bytes]
    config: Path
    state_dir: Path
    log_path: Path
    control_socket: Path
    _log_fh: Any = field(repr=False, default=None)

    def request(self, method: str, url: str, timeout: float = 30.0) -> tuple[int, Any]:
        return unix_request(self.control_socket, method, url, timeout)

    def engines(self) -> dict[str, dict[str, Any]]:
        status, body = self.request("GET", "/v1/engines")
        assert status == 200, body
        return {e["name"]: e for e in body["engines"]}

    def engine(self, name: str) -> dict[str, Any]:
        return self.engines()[name]

    def about(self) -> dict[str, Any]:
        status, body = self.request("GET", "/v1/supervisor")
        assert status == 200, body
        return body  # type: ignore[no-any-return]

    def wait_engine(self, name: str, predicate: Callable[[dict[str, Any]], Any],
                    timeout: float = 15.0, what: str = "") -> dict[str, Any]:
        def check() -> dict[str, Any] | None:
            # not listed yet: the control socket answers before the engines are registered
            eng = self.engines().get(name)
            return eng if eng is not None and predicate(eng) else None

        return wait_until(check, timeout, what or f"engine {name} condition")  # type: ignore[no-any-return]

    def events(self, event: str | None = None, **match: Any) -> list[dict[str, Any]]:
        """The supervisor's JSON log events, optionally filtered."""
        out = []
        for line in self.log_path.read_text().splitlines():
            try:
                rec = json.loads(line)
            except ValueError:
                continue
            if event is not None and rec.get("event") != event:
                continue
            if all(rec.get(k) == v for k, v in match.items()):
                out.append(rec)
        return out

    def stop(self, signum: int = signal.SIGTERM, timeout: float = 30.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signum)
        try:
            return self.proc.wait(timeout)
        finally:
            self.close()

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        if self._log_fh is not None:
            self._log_fh.close()
            self._log_fh = None

    def log_text(self) -> str:
        return self.log_path.read_text()


def start_supervisor(config: Path, *, env: Mapping[str, str] | None = None,
                     extra_args: Sequence[str] = (), prefix: Sequence[str] = (),
                     wait: bool = True, timeout: float = 20.0,
                     output: int | None = None,
                     pass_fds: Sequence[int] = (),
                     program: Sequence[str] = (sys.executable, "-m", "cuzkd")
                     ) -> RunningSupervisor:
    """Start ``cuzkd run --config CONFIG`` (optionally under ``prefix``, e.g. unshare; the
    cuzkd ``program``: another's, for ``cuzkd upgrade``); its stdout and stderr go to its log
    file, or to the descriptor ``output`` (a pipe)."""
    import tomllib

    raw = tomllib.loads(config.read_text())
    state_dir = Path(raw["supervisor"]["state_dir"])
    control = Path(raw["supervisor"].get("control_socket") or state_dir / "control.sock")
    log_path = config.with_name(f"{config.stem}.log")
    log_fh = log_path.open("ab")
    proc = subprocess.Popen(
        [*prefix, *program, "run", "--config", str(config), *extra_args],
        stdin=subprocess.DEVNULL, stdout=log_fh if output is None else output,
        stderr=subprocess.STDOUT,
        env={**os.environ, **(env or {})}, pass_fds=pass_fds,
    )
    sup = RunningSupervisor(proc, config, state_dir, log_path, control, log_fh)
    if wait:
        def ready() -> bool:
            if proc.poll() is not None:
                raise AssertionError(f"supervisor exited {proc.returncode}:\n{sup.log_text()}")
            try:
                return sup.request("GET", "/v1/supervisor", timeout=2)[0] == 200
            except OSError:
                return False

        try:
            wait_until(ready, timeout, "the control socket")
        except BaseException:
            sup.close()
            raise
    return sup


class NotifyListener:
    """A bound ``NOTIFY_SOCKET``: the sd_notify datagrams a supervisor sent."""

    def __init__(self, address: str) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(address)
        self.sock.setblocking(False)
        self.messages: list[str] = []

    def drain(self) -> list[str]:
        while True:
            try:
                self.messages.append(self.sock.recv(4096).decode())
            except BlockingIOError:
                return self.messages

    def has(self, field: str) -> bool:
        return any(field in m.split("\n") for m in self.drain())

    def index(self, field: str, start: int = 0) -> int:
        return next(i for i, m in enumerate(self.messages) if i >= start and field in
                    m.split("\n"))


def read_until(fd: int, marker: bytes, timeout: float = 30.0) -> bytes:
    """Read ``fd`` (a pipe) until ``marker`` has come, or EOF; everything read."""
    data = b""
    deadline = time.monotonic() + timeout
    while marker not in data:
        left = deadline - time.monotonic()
        assert left > 0, f"{marker!r} not read in {timeout}s; the last bytes: {data[-300:]!r}"
        if select.select([fd], [], [], left)[0]:
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                break
            data += chunk
    return data


def pid_alive(pid: int) -> bool:
    """True while ``pid`` exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False


def zombie_children(ppid: int) -> list[int]:
    """Zombies whose parent is ``ppid``."""
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as fh:
                fields = fh.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[0] == "Z" and int(fields[1]) == ppid:
            out.append(int(entry))
    return out
