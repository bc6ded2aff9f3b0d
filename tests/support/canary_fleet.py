"""A fleet of bundled engines run as a swappable release, under load: for the canary analysis
end-to-end tests and ``bench/swap_analysis.py``.

A release is a ``#!/bin/sh`` wrapper that execs ``python -m cuzkd engine`` with the engine's
test-only switches (``--test-slowdown``, ``--test-failure-rate``): a good build, a build that
proves slower, a build that fails jobs. :class:`Loader` keeps every engine busy with a bounded
number of jobs, round-robin, offering a job to the next engine when one answers 503 or is down
(restarting); it remembers every job an engine accepted (202), so a test can check that each one
ended -- from the ``job_finished``/``job_failed`` lines the supervisor relays from its engines.
"""

from __future__ import annotations

import http.client
import json
import socket
import sys
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cuzkd.bundled.jobs import INJECTED_FAILURE as INJECTED

#: The engines' config: small partitions (a few ms each on a CPU core) and one worker, so the
#: analysis sees dozens of partitions in a window of seconds.
ENGINE_TOML = """memory_budget = "256MiB"
workers_per_gpu = 1
synthesis_threads = 1
drain_timeout = "30s"
[sizes]
winning-post = 11
window-post = 11
snap-update = 11
porep-c2 = 11
"""


def release_script(directory: Path, name: str, *, slowdown: float = 1.0,
                   failure_rate: str = "0") -> Path:
    """A release: a wrapper that execs the bundled engine with the test-only switches."""
    path = directory / name / "cuzk-engine"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"#!/bin/sh\n# release {name}\nexec {sys.executable} -m cuzkd engine "
                    f"--test-slowdown {slowdown} --test-failure-rate {failure_rate} \"$@\"\n")
    path.chmod(0o755)
    return path


def engine_tables(directory: Path, names: Sequence[str], **keys: Any) -> list[dict[str, Any]]:
    """``[[engine]]`` tables running the active release on Unix sockets under ``directory``."""
    config = directory / "engine.toml"
    config.write_text(ENGINE_TOML)
    return [{"name": name,
             "command": ["{binary}", "--config", str(config), "--listen",
                         f"unix:{directory / f'{name}.sock'}"],
             "status_url": f"unix:{directory / f'{name}.sock'}", "drain": "http", **keys}
            for name in names]


class _Unix(http.client.HTTPConnection):
    def __init__(self, path: Path, timeout: float) -> None:
        super().__init__("engine", timeout=timeout)
        self._path = str(path)

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        sock.connect(self._path)
        self.sock = sock


def _call(path: Path, method: str, url: str, body: Mapping[str, Any] | None = None
          ) -> tuple[int, Any]:
    conn = _Unix(path, 10.0)
    try:
        conn.request(method, url, body=None if body is None else json.dumps(body),
                     headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        return resp.status, json.loads(resp.read() or b"null")
    finally:
        conn.close()


@dataclass
class Loader:
    """Submits ``kind`` jobs round-robin to the engines' sockets, at most ``outstanding`` open
    per engine, until :meth:`stop`; :meth:`pause` lets the engines run dry."""

    sockets: Mapping[str, Path]
    kind: str = "window-post"
    outstanding: int = 3
    #: job id -> engine that accepted it (202)
    accepted: dict[str, str] = field(default_factory=dict)
    refused: int = 0
    _stop: threading.Event = field(default_factory=threading.Event)
    _run: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> Loader:
        self._run.set()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()
        return self

    def pause(self) -> None:
        self._run.clear()

    def resume(self) -> None:
        self._run.set()

    def stop(self) -> None:
        self._stop.set()
        self._run.set()
        if self._thread is not None:
            self._thread.join(30)

    def _loop(self) -> None:
        while not self._stop.is_set():
            self._run.wait()
            busy = True
            for name, path in self.sockets.items():
                busy = self._offer(name, path) and busy
            time.sleep(0.05 if busy else 0.01)

    def _offer(self, name: str, path: Path) -> bool:
        """One job to ``name`` if it has room; True when it had none (or is down)."""
        try:
            status, doc = _call(path, "GET", "/status")
            if status != 200 or doc["cuzkd_extensions"]["jobs_in_flight"] >= self.outstanding:
                return True
            status, body = _call(path, "POST", "/v1/jobs", {"proof_kind": self.kind})
        except (OSError, http.client.HTTPException, ValueError, KeyError, TypeError):
            return True  # restarting: offered to the next engine
        if status == 202:
            self.accepted[body["job_id"]] = name
            return False
        self.refused += 1  # 503 while draining: the job goes to the next engine
        return True


@dataclass(frozen=True)
class JobOutcomes:
    done: set[str]
    #: job id -> error
    failed: dict[str, str]

    def lost(self, accepted: Iterable[str]) -> list[str]:
        """Accepted jobs that did not finish: failed for a drain timeout, or never ended."""
        return sorted(j for j in accepted
                      if j not in self.done and self.failed.get(j) != INJECTED)


def job_outcomes(events: Iterable[Mapping[str, Any]]) -> JobOutcomes:
    """Each job's end, from the engine log lines the supervisor relays."""
    done: set[str] = set()
    failed: dict[str, str] = {}
    for event in events:
        if event.get("event") == "job_finished" and event.get("verified"):
            done.add(str(event["job_id"]))
        elif event.get("event") == "job_failed":
            error = str(event.get("error"))
            failed[str(event["job_id"])] = INJECTED if INJECTED in error else error
    return JobOutcomes(done, failed)
