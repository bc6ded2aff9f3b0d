"""Crash safety: a process SIGKILLed after any step leaves a store that recover() makes whole."""

from __future__ import annotations

import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from cuzkd.swap.releases import (
    ACTIVATE_STEPS,
    INSTALL_STEPS,
    PRUNE_STEPS,
    ROLLBACK_STEPS,
    Release,
    ReleaseStore,
)

CHILD = Path(__file__).with_name("swap_crash_child.py")
# Steps after which a temporary entry is still on disk (and recovery must remove it).
LEAVES_TEMP = {"temp_created", "copied", "sealed", "previous_linked", "current_linked", "detached"}

Make = Callable[[str], Path]


def crash_after(store: ReleaseStore, operation: str, argument: str, step: str) -> None:
    done = subprocess.run(
        [sys.executable, CHILD, store.state_dir, operation, argument, step],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == -signal.SIGKILL, done.stderr


def temporaries(store: ReleaseStore) -> list[Path]:
    return [
        entry
        for directory in (store.state_dir, store.state_dir / "releases")
        for entry in directory.iterdir()
        if entry.name.startswith(".tmp-")
    ]


def tag_of(release: Release | None) -> str | None:
    """The tag the release's script echoes (see conftest ``make_script``)."""
    if release is None:
        return None
    return release.binary.read_text().split()[-1]


def installed(store: ReleaseStore, make: Make, *tags: str) -> dict[str, Release]:
    return {tag: store.install(make(tag)) for tag in tags}


def accepted(store: ReleaseStore, release: Release) -> None:
    """Activated and accepted, with the history records a swap writes."""
    store.put_in_service(release, "swap")
    store.activate(release)
    store.judge(release, "accepted", "healthy")


def setup_install(store: ReleaseStore, make: Make) -> tuple[str, str]:
    accepted(store, installed(store, make, "a")["a"])
    return "install", str(make("b"))


def setup_activate(store: ReleaseStore, make: Make) -> tuple[str, str]:
    rel = installed(store, make, "z", "a", "b")
    accepted(store, rel["z"])
    accepted(store, rel["a"])
    store.put_in_service(rel["b"], "swap")  # as a swap does, before the flips
    return "activate", rel["b"].id


def setup_rollback(store: ReleaseStore, make: Make) -> tuple[str, str]:
    rel = installed(store, make, "a", "b")
    accepted(store, rel["a"])
    accepted(store, rel["b"])
    return "rollback", "-"


def setup_prune(store: ReleaseStore, make: Make) -> tuple[str, str]:
    rel = installed(store, make, "x", "a", "b")
    accepted(store, rel["a"])
    accepted(store, rel["b"])
    return "prune", "0"


# (set-up, step, active after recovery, previous after recovery, releases after recovery):
# a release never accepted and not active or previous (installed by an operation that stopped
# before its activation, or whose swap was interrupted) is discarded by the recovery.
CASES = [
    (setup_install, "temp_created", "a", None, {"a"}),
    (setup_install, "copied", "a", None, {"a"}),
    (setup_install, "sealed", "a", None, {"a"}),
    (setup_install, "committed", "a", None, {"a"}),
    (setup_install, "stamped", "a", None, {"a"}),
    (setup_activate, "previous_linked", "a", "z", {"z", "a"}),
    (setup_activate, "previous_flipped", "a", None, {"z", "a"}),
    (setup_activate, "current_linked", "a", None, {"z", "a"}),
    (setup_activate, "current_flipped", "b", "a", {"z", "a", "b"}),
    (setup_activate, "stamped", "b", "a", {"z", "a", "b"}),
    (setup_rollback, "current_linked", "b", "a", {"a", "b"}),
    (setup_rollback, "current_flipped", "a", None, {"a", "b"}),
    (setup_rollback, "previous_linked", "a", None, {"a", "b"}),
    (setup_rollback, "previous_flipped", "a", "b", {"a", "b"}),
    (setup_rollback, "stamped", "a", "b", {"a", "b"}),
    (setup_prune, "detached", "b", "a", {"a", "b"}),
    (setup_prune, "removed", "b", "a", {"a", "b"}),
]


@pytest.mark.parametrize(
    ("setup", "step", "active", "previous", "remaining"),
    CASES,
    ids=[f"{case[0].__name__.removeprefix('setup_')}-{case[1]}" for case in CASES],
)
def test_recover_after_a_crash_at_each_step(
    store, make_script, setup, step, active, previous, remaining
):
    operation, argument = setup(store, make_script)
    crash_after(store, operation, argument, step)
    assert bool(temporaries(store)) == (step in LEAVES_TEMP)

    restarted = ReleaseStore(store.state_dir)
    restarted.recover()
    assert temporaries(restarted) == []
    assert tag_of(restarted.active()) == active
    assert tag_of(restarted.previous()) == previous
    assert {tag_of(r) for r in restarted.releases()} == remaining
    for release in restarted.releases():  # each remaining release is complete and runnable
        out = subprocess.run([release.binary], capture_output=True, text=True, check=True)
        assert out.stdout.strip() == tag_of(release)


def test_every_operation_steps_through_its_documented_steps(store, make_script):
    def trace(steps):
        names = []
        while True:
            try:
                names.append(next(steps))
            except StopIteration as done:
                return names, done.value

    names, one = trace(store.install_steps(make_script("one")))
    assert tuple(names) == INSTALL_STEPS
    two = store.install(make_script("two"))
    store.activate(one)
    names, previous = trace(store.activate_steps(two))
    assert (tuple(names), previous) == (ACTIVATE_STEPS, one)
    names, target = trace(store.rollback_steps())
    assert (tuple(names), target) == (ROLLBACK_STEPS, one)
    store.install(make_script("three"))
    names, removed = trace(store.prune_steps(keep=0))
    assert (tuple(names), len(removed)) == (PRUNE_STEPS, 1)
