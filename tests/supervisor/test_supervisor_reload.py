"""SIGHUP: added engines start, removed stop, changed restart, unchanged keep running;
an invalid new config is refused and the old one stays."""

from __future__ import annotations

import signal
from pathlib import Path

from sv_harness import fake_engine, pid_alive, start_supervisor, wait_until, write_config


def test_reload_applies_the_difference(tmp_path: Path) -> None:
    fast = {"health_interval": "50ms", "stop_timeout": "1s"}
    engines = [fake_engine(tmp_path, n, **fast) for n in ("keep", "drop", "change")]
    config = write_config(tmp_path, engines)
    sup = start_supervisor(config)
    try:
        before = {n: sup.wait_engine(n, lambda e: e["state"] == "running")["pid"]
                  for n in ("keep", "drop", "change")}
        write_config(tmp_path, [engines[0],
                                {**engines[2], "env": {"CHANGED": "1"}},
                                fake_engine(tmp_path, "new", **fast)])
        sup.proc.send_signal(signal.SIGHUP)
        wait_until(lambda: set(sup.engines()) == {"keep", "change", "new"}, 15, "new engine set")
        after = {n: sup.wait_engine(n, lambda e: e["state"] == "running")["pid"]
                 for n in ("keep", "change", "new")}
        assert after["keep"] == before["keep"]
        assert after["change"] != before["change"]
        assert not pid_alive(before["drop"]) and not pid_alive(before["change"])
        assert list(sup.engines()) == ["keep", "change", "new"]

        config.write_text(config.read_text() + "\n[[engine]]\nname = 'keep'\n")  # duplicate
        sup.proc.send_signal(signal.SIGHUP)
        [refused] = wait_until(lambda: sup.events("reload_refused"), 10, "reload_refused")
        assert "duplicate engine name" in refused["error"] and "engine[3].name" in refused["error"]
        assert {n: e["pid"] for n, e in sup.engines().items()} == after
    finally:
        assert sup.stop() == 0
