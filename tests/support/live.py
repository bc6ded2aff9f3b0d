"""Helpers for the live tests: a real Prometheus server, live scrapes, a document engine.

* :class:`Prometheus` runs ``/usr/bin/prometheus`` on a free loopback port with a temporary
  config and data directory, and wraps its HTTP API. Tests synchronise by polling a PromQL
  condition against a deadline (:meth:`Prometheus.wait_for`), never by sleeping.
* :func:`scrape` fetches and parses the supervisor's ``/metrics`` (duplicates fail).
* :func:`file_status_engine` is the ``[[engine]]`` table of ``file_status_engine.py`` (beside
  this module, run by path) serving a file.
"""

from __future__ import annotations

import base64
import json
import shutil
import subprocess
import sys
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from support.ports import free_port
from support.waiting import wait_until

DOC_ENGINE = Path(__file__).with_name("file_status_engine.py")

LabelSet = frozenset[tuple[str, str]]


def file_status_engine(tmp: Path, name: str, document: Path, **keys: Any) -> dict[str, Any]:
    """An ``[[engine]]`` whose ``/status`` is ``document``'s bytes (``status_url`` to a socket).

    Its work never ends (the document is fixed), so a drain could only time out: it is stopped
    without one, else every stop of a stack holding it would wait the whole drain_timeout.
    """
    sock = tmp / f"{name}.sock"
    return {
        "name": name,
        "command": [sys.executable, str(DOC_ENGINE), "--socket", str(sock),
                    "--document", str(document)],
        "status_url": f"unix:{sock}",
        "drain": "none",
        **keys,
    }


# --- the supervisor's /metrics -------------------------------------------------------------


@dataclass(frozen=True)
class Exposition:
    """One parsed scrape. ``families`` maps each ``# TYPE`` name to its type, as the contract
    names them (counters with ``_total``, info families with ``_info``, histograms bare)."""

    text: str
    families: dict[str, str]
    #: family name → every label name its samples carry (``le`` excluded)
    family_labels: dict[str, frozenset[str]]
    #: (sample name, labels) → value, e.g. ("cuzk_partitions", {engine, proof_kind, phase})
    samples: dict[tuple[str, LabelSet], float]

    def value(self, name: str, **labels: str) -> float | None:
        return self.samples.get((name, frozenset(labels.items())))

    def sample_names(self) -> set[str]:
        """Every series name (``_bucket``/``_sum``/``_count`` of histograms included)."""
        return {name for name, _ in self.samples}

    def engines_with(self, prefix: str) -> set[str]:
        """Engines that have at least one series whose name starts with ``prefix``."""
        return {dict(labels)["engine"] for name, labels in self.samples
                if name.startswith(prefix) and "engine" in dict(labels)}


def parse_exposition(text: str) -> Exposition:
    families: dict[str, str] = {}
    labels: dict[str, set[str]] = {}
    samples: dict[tuple[str, LabelSet], float] = {}
    for family in text_string_to_metric_families(text):
        # prometheus_client's parser strips a counter's _total from the family name.
        name = f"{family.name}_total" if family.type == "counter" else family.name
        families[name] = family.type
        seen = labels.setdefault(name, set())
        for sample in family.samples:
            key = (sample.name, frozenset(sample.labels.items()))
            assert key not in samples, f"duplicate series {key}"
            samples[key] = sample.value
            seen.update(sample.labels.keys() - {"le"})
    return Exposition(text, families, {k: frozenset(v) for k, v in labels.items()}, samples)


def scrape(url: str, timeout: float = 10.0) -> Exposition:
    """GET ``url`` (plain Prometheus text) and parse it; a non-200 answer fails the test."""
    with urllib.request.urlopen(url, timeout=timeout) as resp:
        assert resp.status == 200, resp.status
        return parse_exposition(resp.read().decode())


def promtool_check_metrics(text: str) -> str:
    """``promtool check metrics`` output for ``text`` (empty means clean), exit code folded in."""
    promtool = shutil.which("promtool")
    assert promtool is not None, "promtool missing: apt-get install prometheus"
    result = subprocess.run([promtool, "check", "metrics"], input=text.encode(),
                            capture_output=True, timeout=30, check=False)
    output = (result.stdout + result.stderr).decode()
    return output if result.returncode == 0 else f"exit {result.returncode}: {output}"


# --- a real Prometheus -----------------------------------------------------------------------


#: Run before Prometheus so that it is SIGKILLed when the test process dies, even by SIGKILL.
#: util-linux's ``setpriv`` sets ``PR_SET_PDEATHSIG`` and execs: a ``preexec_fn`` would run
#: Python in the forked child, and with gRPC's threads alive in the test process (the cuzk
#: clients) gRPC's fork handlers crashed that child with SIGSEGV before it could exec.
DIE_WITH_PARENT = ("setpriv", "--pdeathsig", "KILL", "--")


#: Agent mode as the shipped unit and compose service run it on Prometheus 2.x.
AGENT_FLAGS = "--enable-feature=agent,expand-external-labels"


class PrometheusError(AssertionError):
    """The API answered an error (bad query, server failure); the message says which."""


@dataclass
class Prometheus:
    proc: subprocess.Popen[bytes]
    url: str
    log_path: Path
    #: (user, password) sent on every request, for one started with a ``--web.config.file``
    auth: tuple[str, str] | None = None

    @classmethod
    def start(cls, workdir: Path, targets: Sequence[str], *, rule_files: Iterable[Path] = (),
              scrape_interval: str = "1s", timeout: float = 30.0,
              scrape_configs: Sequence[dict[str, Any]] | None = None,
              config: dict[str, Any] | None = None, agent: bool = False,
              flags: Sequence[str] = (), env: dict[str, str] | None = None,
              auth: tuple[str, str] | None = None) -> Prometheus:
        """Start Prometheus scraping ``targets`` (job ``cuzkd``) and wait until it is ready.

        The scrape timeout equals the interval (Prometheus' maximum). Rule files are evaluated
        at the same interval, so their expressions run against the live series too.
        ``scrape_configs`` replaces the one job (``targets`` is then unused): relative paths
        in it resolve against ``workdir``, where the config is written. ``config`` replaces
        the whole file (the other config arguments are then unused); ``agent`` runs it in
        agent mode (2.x's feature flag, external labels expanded from ``env``, the process'
        whole environment when given); ``flags`` are added to the command line, and ``auth``
        is sent to the API they protect.
        """
        binary = shutil.which("prometheus")
        assert binary is not None, "prometheus missing: apt-get install prometheus"
        workdir.mkdir(parents=True, exist_ok=True)
        config_path = workdir / "prometheus.yml"
        config_path.write_text(json.dumps(config if config is not None else {  # JSON is YAML
            "global": {"scrape_interval": scrape_interval,
                       "evaluation_interval": scrape_interval},
            "rule_files": [str(p) for p in rule_files],
            "scrape_configs": list(scrape_configs) if scrape_configs is not None else [
                {"job_name": "cuzkd", "scrape_timeout": scrape_interval,
                 "static_configs": [{"targets": list(targets)}]}],
        }))
        storage = ([AGENT_FLAGS, f"--storage.agent.path={workdir / 'wal'}"] if agent
                   else [f"--storage.tsdb.path={workdir / 'data'}"])
        port = free_port()
        log_path = workdir / "prometheus.log"
        with log_path.open("ab") as log:
            proc = subprocess.Popen(
                [*DIE_WITH_PARENT, binary, f"--config.file={config_path}", *storage,
                 f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn", *flags],
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env)
        prom = cls(proc, f"http://127.0.0.1:{port}", log_path, auth)
        try:
            wait_until(prom._ready, timeout, "Prometheus /-/ready", interval=0.1)
        except BaseException:
            prom.stop()
            raise
        return prom

    def _ready(self) -> bool:
        if self.proc.poll() is not None:
            raise AssertionError(f"prometheus exited {self.proc.returncode}:\n{self.log()}")
        try:
            with self._get("/-/ready", timeout=2) as resp:
                return bool(resp.status == 200)
        except (urllib.error.URLError, OSError):
            return False

    def _get(self, path: str, timeout: float) -> Any:
        request = urllib.request.Request(f"{self.url}{path}")
        if self.auth is not None:
            token = base64.b64encode(":".join(self.auth).encode()).decode()
            request.add_header("Authorization", f"Basic {token}")
        return urllib.request.urlopen(request, timeout=timeout)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-4000:]

    def stop(self) -> None:
        """SIGTERM, then SIGKILL after 10 s; always leaves no process behind."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)

    def api(self, path: str, **params: Any) -> dict[str, Any]:
        """The whole JSON answer of ``GET /api/v1/<path>`` (errors included, not raised)."""
        query = urllib.parse.urlencode({k: str(v) for k, v in params.items()})
        try:
            with self._get(f"/api/v1/{path}?{query}", timeout=30) as resp:
                return json.loads(resp.read())  # type: ignore[no-any-return]
        except urllib.error.HTTPError as exc:  # 400/422/503 carry a JSON error body
            return json.loads(exc.read())  # type: ignore[no-any-return]

    def data(self, path: str, **params: Any) -> Any:
        answer = self.api(path, **params)
        if answer.get("status") != "success":
            raise PrometheusError(f"{path} {params}: {answer.get('errorType')}: "
                                  f"{answer.get('error')}")
        return answer["data"]

    def query(self, expr: str, **params: Any) -> list[dict[str, Any]]:
        """Instant query; the result list (vector samples, or matrix series)."""
        result: list[dict[str, Any]] = self.data("query", query=expr, **params)["result"]
        return result

    def values(self, expr: str) -> dict[LabelSet, float]:
        """Instant vector query as {labels: value} (``__name__`` dropped)."""
        return {frozenset((k, v) for k, v in r["metric"].items() if k != "__name__"):
                float(r["value"][1]) for r in self.query(expr)}

    def wait_for(self, expr: str, predicate: Callable[[dict[LabelSet, float]], Any],
                 timeout: float, what: str) -> dict[LabelSet, float]:
        """Poll ``expr`` until ``predicate(values)`` holds; the failure shows the last answer."""
        last: list[dict[LabelSet, float]] = [{}]

        def check() -> dict[LabelSet, float] | None:
            last[0] = self.values(expr)
            return last[0] if predicate(last[0]) else None

        try:
            return wait_until(check, timeout, what, interval=0.25)  # type: ignore[no-any-return]
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n  query: {expr}\n  last result: {last[0]}") from None

    def samples(self, selector: str, window: str) -> list[tuple[float, float]]:
        """The raw scraped samples (time, value) of one series over the last ``window``."""
        result = self.query(f"{selector}[{window}]")
        assert len(result) == 1, f"{selector}: expected one series, got {result}"
        return [(float(t), float(v)) for t, v in result[0]["values"]]


def by_label(values: dict[LabelSet, float], label: str) -> dict[str, float]:
    """{labels: v} → {value of ``label``: v} (the label must tell the series apart)."""
    return {dict(labels)[label]: v for labels, v in values.items()}
