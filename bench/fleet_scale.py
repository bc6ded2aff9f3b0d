"""How far one Prometheus goes: N hosts' worth of cuzkd expositions scraped by a real Prometheus.

Run by hand: ``.venv/bin/python bench/fleet_scale.py --hosts 25 50 100``. Figures go to
docs/scale.md (and docs/benchmarks.md, section fleet).

What it does, per N:

* a child process (``--serve``) serves N hosts' ``/metrics`` on loopback, host i on
  ``127.0.0.<i+2>:19822`` (so each is its own target and ``instance``), from one recorded
  exposition of a real ``cuzkd run`` supervising 8 engines × 4 GPU workers
  (``bench/data/cuzkd-host-8x4.prom.gz``; ``--record`` makes it again, with bench/scrape.py's
  busy engine documents). Values move between scrapes as a working host's do, each host on its
  own random stream: counters grow by random increments (histograms by random observations
  spread over their buckets), gauges wander, busy flags flip, uptimes advance. Nothing repeats
  exactly, so the TSDB's compression is not flattered;
* a real ``prometheus`` scrapes them every 15 s (the shipped interval) with the shipped alert
  and recording rules, for ``--seconds`` (default 75: five scrapes);
* then it records series per host, the head's series, samples appended per second, the
  Prometheus process's RSS (peak, polled every second) and CPU (cores, over the run after the
  first scrape), the rule groups' evaluation time, and the latency of every query of the
  "cuzkd / Fleet summary" dashboard twice: as shipped (reading recorded series) and with every
  recorded series replaced by the expression that records it (what the dashboard would cost
  without the recording rules). Each query runs ``--repeat`` times as an instant query and as
  a range query over the run (step 15 s); the best time is reported (on a shared machine the
  others measure the neighbours' load as much as the query).

The serving child costs CPU on the same 2 cores; its own CPU is printed so the Prometheus
figures can be read against it.
"""

from __future__ import annotations

import argparse
import asyncio
import gzip
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import psutil
from aiohttp import web

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
RECORDING = BENCH / "data" / "cuzkd-host-8x4.prom.gz"
RULE_FILES = [REPO / "prometheus" / "cuzkd-alerts.yml", REPO / "prometheus" / "cuzkd-recording.yml"]
DASHBOARD = REPO / "grafana" / "dashboards" / "cuzkd-fleet-summary.json"
PORT = 19822
SCRAPE_SECS = 15.0
JOB = "cuzkd"

sys.path.insert(0, str(REPO / "tests"))  # support.ops: Grafana variables, PromQL
sys.path.insert(0, str(BENCH))
from support import ops  # noqa: E402

# --- the recorded host ---------------------------------------------------------------------


def record() -> None:
    """``--record``: scrape a real ``cuzkd run`` over 8 busy engines × 4 workers, once."""
    import scrape  # bench/scrape.py: busy engine documents, a cuzkd.toml, readiness

    body = scrape.busy_document(64, 16, 4, plain=False)
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        (tmp / "status.json").write_bytes(body)
        config = scrape.supervisor_config(tmp, tmp / "status.json", 8)
        with (tmp / "cuzkd.log").open("wb") as log:
            proc = subprocess.Popen([sys.executable, "-m", "cuzkd", "run", "--config",
                                     str(config)], stdout=log, stderr=subprocess.STDOUT)
        try:
            address = asyncio.run(scrape.wait_ready(proc, tmp / "state" / "control.sock", 8))
            with urllib.request.urlopen(f"http://{address}/metrics", timeout=30) as resp:
                text = resp.read()
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(60)
    RECORDING.parent.mkdir(exist_ok=True)
    RECORDING.write_bytes(gzip.compress(text, 9, mtime=0))
    print(f"recorded {RECORDING}: {len(text)} bytes, "
          f"{sum(not line.startswith(b'#') for line in text.splitlines())} series")


_SAMPLE = re.compile(r"([a-zA-Z_:][\w:]*)(\{.*\})? (\S+)")
_LE = re.compile(r'le="([^"]+)",?')
_RARE = ("failed", "restarts", "exits", "errors", "killed", "zombies", "swaps")
_CONSTANT = ("_info", "cuzkd_engine_state", "cuzkd_engine_up", "_start_time_seconds",
             "_total_bytes", "max_concurrent", "max_fds")


@dataclass
class Template:
    """The recorded exposition cut into text that never changes and samples that move."""

    lines: list[str]
    positions: list[int] = field(default_factory=list)   # line index of each sample
    prefixes: list[str] = field(default_factory=list)    # "name{labels} "
    initial: list[float] = field(default_factory=list)
    kinds: list[str] = field(default_factory=list)       # how the sample moves
    #: histogram series: (family, labels without le) -> [(sample index, le)], + _sum/_count
    histograms: dict[str, dict[str, Any]] = field(default_factory=dict)


KINDS = ("histogram", "busy_seconds", "rare", "events", "flag", "clock", "constant", "gauge")


def _kind(name: str, family_type: str) -> str:
    if family_type == "histogram":
        return "histogram"
    if family_type == "counter":
        if name.endswith("_seconds_total"):
            return "busy_seconds"
        return "rare" if any(word in name for word in _RARE) else "events"
    if name == "cuzk_gpu_worker_busy":
        return "flag"
    if name.endswith("uptime_seconds"):
        return "clock"
    if any(word in name for word in _CONSTANT):
        return "constant"
    return "gauge"


def parse_template(text: str) -> Template:
    template = Template(lines=text.rstrip("\n").split("\n"))
    family_type = ""
    for position, line in enumerate(template.lines):
        if line.startswith("# TYPE "):
            family_type = line.split()[3]
            family = line.split()[2]
            continue
        if line.startswith("#"):
            continue
        match = _SAMPLE.fullmatch(line)
        assert match, line
        name, labels = match.group(1), match.group(2) or ""
        index = len(template.positions)
        template.positions.append(position)
        template.prefixes.append(line[: match.start(3)])
        template.initial.append(float(match.group(3)))
        template.kinds.append(_kind(name, family_type))
        if family_type == "histogram":
            key = family + _LE.sub("", labels).replace(",}", "}")
            group = template.histograms.setdefault(key, {"buckets": [], "sum": -1, "count": -1})
            le = _LE.search(labels)
            if name.endswith("_bucket") and le:
                group["buckets"].append((index, float(le.group(1))))
            else:
                group[name.rsplit("_", 1)[1]] = index
    for key, group in template.histograms.items():
        assert group["buckets"] and min(group["sum"], group["count"]) >= 0, key
    return template


class Host:
    """One simulated host: its own values and random stream; :meth:`scrape` moves them."""

    def __init__(self, template: Template, seed: int) -> None:
        self.template = template
        self.rng = np.random.default_rng(seed)
        self.values = np.array(template.initial)
        self.base = self.values.copy()
        kinds = np.array(template.kinds)
        self.masks = {kind: kinds == kind for kind in KINDS}

    def step(self) -> None:
        rng, values, masks = self.rng, self.values, self.masks
        n = len(values)
        busy = masks["busy_seconds"]
        values[busy] += SCRAPE_SECS * rng.uniform(0.2, 1.0, busy.sum())
        values[masks["events"]] += rng.poisson(1.0, masks["events"].sum())
        values[masks["rare"]] += rng.poisson(0.002, masks["rare"].sum())
        values[masks["clock"]] += SCRAPE_SECS
        values[masks["flag"]] = rng.random(masks["flag"].sum()) < 0.8
        gauges = masks["gauge"]
        noisy = self.base * (1 + 0.1 * rng.standard_normal(n))
        integral = np.equal(np.mod(self.base, 1), 0)
        noisy = np.where(integral, np.round(noisy), noisy)
        noisy = np.where(self.base == 0, rng.poisson(0.5, n), noisy)
        values[gauges] = np.maximum(noisy[gauges], 0)
        for group in self.template.histograms.values():
            observations = rng.lognormal(0.0, 1.5, rng.poisson(2.0))
            for index, le in group["buckets"]:
                values[index] += np.count_nonzero(observations <= le)
            values[group["sum"]] += observations.sum()
            values[group["count"]] += len(observations)

    def scrape(self) -> bytes:
        self.step()
        lines = list(self.template.lines)
        for position, prefix, value in zip(self.template.positions, self.template.prefixes,
                                           self.values.tolist(), strict=True):
            lines[position] = prefix + repr(value)
        return ("\n".join(lines) + "\n").encode()


def serve(hosts: int) -> None:
    """``--serve N``: N hosts on 127.0.0.2.. port 19822 until SIGTERM (prints 'ready')."""
    template = parse_template(gzip.decompress(RECORDING.read_bytes()).decode())
    simulated = {f"127.0.0.{i + 2}": Host(template, seed=i) for i in range(hosts)}

    async def metrics(request: web.Request) -> web.Response:
        address = request.transport.get_extra_info("sockname")[0]  # type: ignore[union-attr]
        return web.Response(body=simulated[address].scrape(),
                            content_type="text/plain", charset="utf-8")

    async def main() -> None:
        app = web.Application()
        app.router.add_get("/metrics", metrics)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        for address in simulated:
            await web.TCPSite(runner, address, PORT).start()
        print("ready", flush=True)
        stop = asyncio.Event()
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
        await stop.wait()
        await runner.cleanup()

    asyncio.run(main())


# --- Prometheus and the queries ------------------------------------------------------------


def _get(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=120) as resp:
        return json.loads(resp.read())


def _own_samples(base: str, name: str) -> dict[str, float]:
    """A Prometheus process's own metric from its /metrics: label text -> value."""
    with urllib.request.urlopen(f"{base}/metrics", timeout=30) as resp:
        text = resp.read().decode()
    return {line[len(name):].rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1])
            for line in text.splitlines()
            if line.startswith(name) and line[len(name)] in " {"}


def _own_metric(base: str, name: str) -> float:
    """A Prometheus process's own metric, summed over its label sets."""
    return sum(_own_samples(base, name).values())


def _query(base: str, expr: str, **params: Any) -> float:
    """Seconds one query takes (wall, client side); a failed query aborts the benchmark."""
    kind = "query_range" if "start" in params else "query"
    url = f"{base}/api/v1/{kind}?{urllib.parse.urlencode({'query': expr, **params})}"
    started = time.perf_counter()
    answer = _get(url)
    elapsed = time.perf_counter() - started
    if answer.get("status") != "success":
        raise SystemExit(f"query failed: {expr}\n{answer}")
    return elapsed


def dashboard_queries() -> list[tuple[str, str, str]]:
    """(panel, as shipped, without recording rules) for every Fleet summary query."""
    dash = json.loads(DASHBOARD.read_text())
    out = []
    for panel in dash["panels"]:
        for target in panel["targets"]:
            expr = ops.substitute(target["expr"], rate_interval="1m", range_="5m")
            title = panel["title"] + (f" {target['refId']}" if len(panel["targets"]) > 1 else "")
            out.append((title, expr, ops.inline_records(expr)))
    return out


def run_one(hosts: int, seconds: float, repeat: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        server = subprocess.Popen([sys.executable, __file__, "--serve", str(hosts)],
                                  stdout=subprocess.PIPE)
        assert server.stdout is not None and server.stdout.readline().strip() == b"ready"
        config = {
            "global": {"scrape_interval": "15s", "evaluation_interval": "15s",
                       "scrape_timeout": "10s"},
            "rule_files": [str(p) for p in RULE_FILES],
            "scrape_configs": [{"job_name": JOB, "static_configs": [
                {"targets": [f"127.0.0.{i + 2}:{PORT}" for i in range(hosts)]}]}],
        }
        (tmp / "prometheus.yml").write_text(json.dumps(config))
        port = 19090
        base = f"http://127.0.0.1:{port}"
        prom = subprocess.Popen(
            ["prometheus", f"--config.file={tmp / 'prometheus.yml'}",
             f"--storage.tsdb.path={tmp / 'data'}", f"--web.listen-address=127.0.0.1:{port}",
             "--log.level=warn"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            return _measure(hosts, seconds, repeat, base, psutil.Process(prom.pid),
                            psutil.Process(server.pid))
        finally:
            for proc in (prom, server):
                proc.terminate()
                proc.wait(60)


def _measure(hosts: int, seconds: float, repeat: int, base: str, prom: psutil.Process,
             server: psutil.Process) -> dict[str, Any]:
    deadline = time.monotonic() + 30
    while True:
        try:
            with urllib.request.urlopen(f"{base}/-/ready", timeout=2):
                break
        except OSError:
            if time.monotonic() > deadline:
                raise SystemExit("prometheus did not become ready") from None
            time.sleep(0.2)
    started = time.monotonic()
    time.sleep(SCRAPE_SECS + 2)  # every target scraped once: the steady state starts
    cpu0 = sum(prom.cpu_times()[:2])
    server_cpu0 = sum(server.cpu_times()[:2])
    appended0, t0 = _own_metric(base, "prometheus_tsdb_head_samples_appended_total"), time.time()
    peak_rss = 0
    while time.monotonic() - started < seconds:
        peak_rss = max(peak_rss, prom.memory_info().rss)
        time.sleep(1)
    elapsed = time.time() - t0
    result: dict[str, Any] = {
        "hosts": hosts,
        "prometheus_cores": (sum(prom.cpu_times()[:2]) - cpu0) / elapsed,
        "server_cores": (sum(server.cpu_times()[:2]) - server_cpu0) / elapsed,
        "samples_per_second": (_own_metric(base, "prometheus_tsdb_head_samples_appended_total")
                               - appended0) / elapsed,
        "head_series": _own_metric(base, "prometheus_tsdb_head_series"),
        "peak_rss_bytes": max(peak_rss, prom.memory_info().rss),
        "rule_eval_seconds": _own_metric(base, "prometheus_rule_group_last_duration_seconds"),
        "rule_group_seconds": {re.sub(r'.*;', "", labels).rstrip('"}'): value
                               for labels, value in _own_samples(
                                   base, "prometheus_rule_group_last_duration_seconds").items()},
        "loadavg": os.getloadavg()[0],
    }
    scraped = _get(f"{base}/api/v1/query?query=" + urllib.parse.quote(
        f'avg(scrape_samples_scraped{{job="{JOB}"}})'))["data"]["result"]
    result["series_per_host"] = float(scraped[0]["value"][1])
    recorded = _get(f"{base}/api/v1/query?query=" + urllib.parse.quote(
        'count({__name__=~"instance[a-z_]*:.+"})'))["data"]["result"]
    result["recorded_series_per_host"] = float(recorded[0]["value"][1]) / hosts
    now = time.time()
    window = {"start": now - (time.monotonic() - started), "end": now, "step": "15"}
    queries = []
    for panel, shipped, raw in dashboard_queries():
        row = {"panel": panel}
        for label, expr in (("recorded", shipped), ("raw", raw)):
            row[f"{label}_instant_ms"] = 1000 * min(
                _query(base, expr, time=now) for _ in range(repeat))
            row[f"{label}_range_ms"] = 1000 * min(
                _query(base, expr, **window) for _ in range(repeat))
        queries.append(row)
    result["queries"] = queries
    return result


def report(result: dict[str, Any]) -> None:
    print(f"\nN={result['hosts']}: {result['series_per_host']:.0f} series/host "
          f"({result['recorded_series_per_host']:.0f} recorded per host), "
          f"head {result['head_series']:.0f} series, "
          f"{result['samples_per_second']:.0f} samples/s, "
          f"peak RSS {result['peak_rss_bytes'] / 2**20:.0f} MiB, "
          f"Prometheus {result['prometheus_cores']:.3f} cores "
          f"(serving child {result['server_cores']:.3f}), "
          f"rule groups {1000 * result['rule_eval_seconds']:.1f} ms per evaluation "
          f"({', '.join(f'{g} {1000 * v:.1f}' for g, v in result['rule_group_seconds'].items())}"
          f"), load average {result['loadavg']:.1f}")
    total = {k: sum(q[k] for q in result["queries"])
             for k in ("recorded_instant_ms", "raw_instant_ms", "recorded_range_ms",
                       "raw_range_ms")}
    print(f"{'panel':48} {'instant rec':>11} {'raw':>8} {'range rec':>10} {'raw':>8}  (ms)")
    for q in result["queries"]:
        print(f"{q['panel'][:48]:48} {q['recorded_instant_ms']:11.1f} {q['raw_instant_ms']:8.1f}"
              f" {q['recorded_range_ms']:10.1f} {q['raw_range_ms']:8.1f}")
    print(f"{'whole dashboard':48} {total['recorded_instant_ms']:11.1f} "
          f"{total['raw_instant_ms']:8.1f} {total['recorded_range_ms']:10.1f} "
          f"{total['raw_range_ms']:8.1f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hosts", type=int, nargs="+", default=[25, 50, 100])
    parser.add_argument("--seconds", type=float, default=75.0,
                        help="run length per N (from Prometheus' start)")
    parser.add_argument("--repeat", type=int, default=5, help="runs of each query (best)")
    parser.add_argument("--json", type=Path, help="also write the results here")
    parser.add_argument("--record", action="store_true",
                        help="re-record the host exposition from a real cuzkd run")
    parser.add_argument("--serve", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.record:
        record()
        return
    if args.serve:
        serve(args.serve)
        return
    results = []
    for hosts in args.hosts:
        results.append(run_one(hosts, args.seconds, args.repeat))
        report(results[-1])
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
