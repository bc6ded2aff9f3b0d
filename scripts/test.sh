#!/usr/bin/env bash
# Installs everything the test suite needs on a fresh Debian machine, then runs every test.
# System packages: prometheus (prometheus + promtool for the real-Prometheus and lint tests),
# systemd (systemd-analyze verify; booted as PID 1 by tests/live_systemd), util-linux (unshare,
# nsenter), gcc, and for tests/live_container podman + runc (crun refuses a hybrid cgroup
# layout) + debootstrap (the offline base image). Python packages go into ./.venv.
set -euo pipefail
cd "$(dirname "$0")/.."
need=()
command -v promtool >/dev/null 2>&1 || need+=(prometheus)
command -v prometheus >/dev/null 2>&1 || need+=(prometheus)
command -v systemd-analyze >/dev/null 2>&1 || need+=(systemd)
command -v unshare >/dev/null 2>&1 || need+=(util-linux)
command -v nsenter >/dev/null 2>&1 || need+=(util-linux)
command -v podman >/dev/null 2>&1 || need+=(podman)
command -v runc >/dev/null 2>&1 || need+=(runc)
command -v debootstrap >/dev/null 2>&1 || need+=(debootstrap)
command -v gcc >/dev/null 2>&1 || need+=(gcc libc6-dev)  # compiles the swap tests' fake engine
python3 -c "import ensurepip" >/dev/null 2>&1 || need+=(python3-venv)
if [ ${#need[@]} -gt 0 ]; then
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi
python3 -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip >/dev/null
.venv/bin/python -m pip install -q -e '.[dev]'
.venv/bin/ruff check cuzkd tests bench grafana deploy
.venv/bin/mypy --strict cuzkd
.venv/bin/lint-imports --no-cache  # the design's arrows: [tool.importlinter] in pyproject.toml
# One worker per core (at most 4): most tests wait on real processes, so the cores are idle
# most of a serial run. tests/conftest.py keeps the machine-booting tests on one worker.
exec .venv/bin/python -m pytest -n auto --maxprocesses 4 "$@"
