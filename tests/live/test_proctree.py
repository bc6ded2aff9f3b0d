"""``cuzkd.supervisor.proc.tree``: the per-scrape process-tree walk on real processes.

The supervisor reports each engine's RSS and CPU summed over its whole tree; the walk reads the
kernel's per-thread children lists instead of psutil's whole-process-table scan (the latter was
half of a busy scrape's CPU). It must find exactly what psutil's walk finds, grandchildren of
other threads included, and report a vanished engine as gone.
"""

from __future__ import annotations

import subprocess
import sys

import psutil
from support.waiting import wait_until

from cuzkd.supervisor.proc.tree import descendants, tree_usage

# A child that starts a grandchild from a second thread and another from its main thread, each
# with a great-grandchild: the children lists of every thread must be walked.
_TREE = """
import subprocess, sys, threading
nap = [sys.executable, "-c", "import time; time.sleep(60)"]
sleeper = [sys.executable, "-c",
           f"import subprocess, time; subprocess.Popen({nap!r}); time.sleep(60)"]
threading.Thread(target=lambda: subprocess.Popen(sleeper)).start()
subprocess.Popen(sleeper)
sys.stdin.read()
"""


def test_descendants_and_usage_match_psutil() -> None:
    proc = subprocess.Popen([sys.executable, "-c", _TREE], stdin=subprocess.PIPE)
    try:
        root = psutil.Process(proc.pid)
        wait_until(lambda: len(root.children(recursive=True)) == 4, 20, "4 descendants")
        expected = sorted(p.pid for p in root.children(recursive=True))
        assert sorted(descendants(proc.pid)) == expected
        rss, cpu = tree_usage(proc.pid)
        assert rss is not None and cpu is not None
        own = root.memory_info().rss
        assert rss > own  # the descendants' memory is counted too
    finally:
        for child in psutil.Process(proc.pid).children(recursive=True):
            child.kill()
        proc.kill()
        proc.wait(10)
    assert tree_usage(proc.pid) == (None, None)
    assert descendants(proc.pid) == []

