"""One booted systemd for the module, with cuzkd and the shipped unit installed."""

from __future__ import annotations

import sys
from collections.abc import Iterator

import pytest
from support import systemd as harness
from support.cuzkd_machine import cuzkd_payload


@pytest.fixture(scope="module")
def machine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[harness.Machine]:
    """systemd as PID 1 with cuzkd installed as the unit expects; powered off afterwards."""
    reason = harness.namespaces_unavailable()
    if reason is not None:
        print(f"\nlive systemd tests skipped: {reason}", file=sys.stderr)
        pytest.skip(reason)
    with harness.booted_systemd(tmp_path_factory.mktemp("systemd"), cuzkd_payload()) as booted:
        yield booted
