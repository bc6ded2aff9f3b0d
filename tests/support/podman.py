"""podman without a registry: a Debian base image built offline with debootstrap, cached by content.

No image registry is reachable from CI, so ``FROM python:...`` cannot be pulled. The Dockerfile
takes its base through the ``BASE_IMAGE`` build argument; the tests build one with
``debootstrap --variant=minbase`` plus what the Dockerfile expects of a Python base (python3,
python3-venv, ca-certificates). The root file system is kept as a tarball under
``/var/cache/cuzkd-tests``, named by a hash of the recipe below, and imported into podman's store
under a tag carrying the same hash: a later run reuses either without rebuilding.

podman runs with ``--cgroup-manager=cgroupfs --events-backend=file`` (there is no systemd or
journal to talk to) and the ``runc`` runtime: crun refuses the host's hybrid cgroup layout as soon
as its cgroup2 hierarchy has any controller (hugetlb, which no v1 hierarchy binds, is enough).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

CACHE = Path(os.environ.get("CUZKD_TEST_CACHE", "/var/cache/cuzkd-tests"))
MIRROR = os.environ.get("CUZKD_TEST_DEBIAN_MIRROR", "http://deb.debian.org/debian")
SUITE = "bookworm"
PACKAGES = ("python3", "python3-venv", "ca-certificates")
# Dropped from the root file system before it is archived: package caches and indexes.
_PRUNE = ("var/cache/apt/archives", "var/lib/apt/lists", "usr/share/doc", "usr/share/man")
# debootstrap copies these from the host; podman provides its own at run time.
_HOST_FILES = ("etc/resolv.conf", "etc/hostname")
# Bump when the recipe changes in a way the fields above do not show.
_RECIPE_VERSION = 1
PODMAN = ("podman", "--runtime", "runc", "--cgroup-manager=cgroupfs", "--events-backend=file")

# Podman's defaults for root (nofile 1048576, nproc 4194304) raise hard limits, which needs
# CAP_SYS_RESOURCE; a sandboxed CI runner may not have it. These fit under any runner's limits.
RUN_ULIMITS = ("--ulimit", "nofile=16384:16384", "--ulimit", "nproc=16384:16384")


def podman(*args: str, check: bool = True, timeout: float = 300
           ) -> subprocess.CompletedProcess[str]:
    result = subprocess.run([*PODMAN, *args], capture_output=True, text=True, timeout=timeout,
                            check=False)
    if check and result.returncode != 0:
        raise AssertionError(f"podman {' '.join(args)} exited {result.returncode}:\n"
                             f"{result.stdout[-4000:]}{result.stderr[-4000:]}")
    return result


def not_root() -> str | None:
    """Why these tests cannot run here (None when they can): the one reason to skip."""
    if os.geteuid() != 0:
        return ("needs root: debootstrap, and podman with the host's namespaces and cgroups "
                "(rootless podman would need subordinate IDs and a user namespace)")
    return None


def tools_missing() -> str | None:
    """What is missing to build and run images here (None when nothing is)."""
    for tool in ("podman", "runc", "debootstrap"):
        if shutil.which(tool) is None:
            return (f"{tool} is not installed (./scripts/test.sh installs podman, runc and "
                    "debootstrap)")
    return None


def recipe_key() -> str:
    recipe = json.dumps({"suite": SUITE, "mirror": MIRROR, "variant": "minbase",
                         "packages": sorted(PACKAGES), "prune": _PRUNE, "host": _HOST_FILES,
                         "version": _RECIPE_VERSION}, sort_keys=True)
    return hashlib.sha256(recipe.encode()).hexdigest()[:16]


def base_image() -> str:
    """The tag of the local base image, built (and cached) on first use."""
    key = recipe_key()
    tag = f"localhost/cuzkd-test-base:{key}"
    CACHE.mkdir(parents=True, exist_ok=True)
    with _locked(CACHE / ".lock"):
        if podman("image", "exists", tag, check=False).returncode == 0:
            return tag
        tarball = CACHE / f"debian-{SUITE}-{key}.tar"
        if not tarball.exists():
            _debootstrap(tarball)
        podman("import", "--change", 'CMD ["/bin/bash"]', str(tarball), tag)
    return tag


def _debootstrap(tarball: Path) -> None:
    with tempfile.TemporaryDirectory(dir=CACHE, prefix="rootfs-") as tmp:
        rootfs = Path(tmp) / "rootfs"
        result = subprocess.run(
            ["debootstrap", "--variant=minbase", f"--include={','.join(PACKAGES)}", SUITE,
             str(rootfs), MIRROR], capture_output=True, text=True, timeout=900, check=False)
        if result.returncode != 0:
            raise AssertionError(f"debootstrap failed:\n{result.stdout[-3000:]}"
                                 f"{result.stderr[-3000:]}")
        for path in _PRUNE:
            shutil.rmtree(rootfs / path, ignore_errors=True)
            (rootfs / path).mkdir(parents=True, exist_ok=True)
        for path in _HOST_FILES:
            (rootfs / path).unlink(missing_ok=True)
        partial = tarball.with_suffix(".partial")
        subprocess.run(["tar", "--numeric-owner", "-C", str(rootfs), "-cf", str(partial), "."],
                       check=True, timeout=300)
        partial.rename(tarball)  # only a complete archive carries the cache name


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    with path.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
