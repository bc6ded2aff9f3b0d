"""One booted systemd for the module, with cuzkd and the shipped unit installed.

pytest's importlib mode puts no test directory on ``sys.path``: add this one (the harness) and
those of the helpers reused from other areas (sv_harness, live_support).
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

_TESTS = Path(__file__).resolve().parent.parent
for _dir in (_TESTS / "live_systemd", _TESTS / "live", _TESTS / "supervisor"):
    if str(_dir) not in sys.path:
        sys.path.insert(0, str(_dir))

import systemd_harness as harness  # noqa: E402
from cuzkd_machine import cuzkd_payload  # noqa: E402


@pytest.fixture(scope="module")
def machine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[harness.Machine]:
    """systemd as PID 1 with cuzkd installed as the unit expects; powered off afterwards."""
    reason = harness.namespaces_unavailable()
    if reason is not None:
        print(f"\nlive systemd tests skipped: {reason}", file=sys.stderr)
        pytest.skip(reason)
    with harness.booted_systemd(tmp_path_factory.mktemp("systemd"), cuzkd_payload()) as booted:
        yield booted
