#!/usr/bin/env bash
# GPU readiness in one command (≤ 6 minutes): the GPU-marked tests (tests/gpu) and the GPU
# benchmarks, with every figure written to a results directory.
#
#   ./scripts/gpu-check.sh [RESULTS_DIR]      # default: $OUT if set, else ./gpu-check-results
#
# A GPU machine may be offline, so nothing is downloaded unless it has to be:
#   1. a Python >= 3.11 on the machine that already imports CuPy is used as it is (PYTHON=...
#      picks one), with a throw-away virtual environment that sees its packages
#      (--system-site-packages);
#   2. cuzkd's own dependencies missing from it are installed from ./gpu-wheels (wheels carried
#      with the tree) when that directory exists, else from the package index;
#   3. cuzkd itself runs from this checkout (PYTHONPATH), so nothing of it is installed.
# PYTEST_ADDOPTS narrows the test run (e.g. -k); CUZKD_GPU_CHECK_SIZE_LOG2 / _JOBS size the
# busy-fraction load (tests/gpu/test_engine.py).
# The first lines of summary.txt say what the machine offered (driver, devices, Pythons, CuPy):
# read them first when a run fails early.
set -uo pipefail
cd "$(dirname "$0")/.."
results=${1:-${OUT:-gpu-check-results}}
mkdir -p "$results"
summary=$results/summary.txt
: >"$summary"
say() { echo "$*" | tee -a "$summary"; }

say "== gpu-check $(date -u +%FT%TZ) on $(hostname)"
say "-- nvidia-smi"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>&1 | tee -a "$summary"

has_cupy() { "$1" -c 'import sys, cupy; assert sys.version_info >= (3, 11); cupy.cuda.runtime.getDeviceCount()' >/dev/null 2>&1; }
python=""
for candidate in ${PYTHON:-} python3 python3.13 python3.12 python3.11 /opt/conda/bin/python \
                 /usr/local/bin/python3; do
  exe=$(command -v "$candidate" 2>/dev/null) || continue
  say "-- $exe: $("$exe" -c 'import sys; print(sys.version.split()[0])' 2>&1)," \
      "cupy: $("$exe" -c 'import cupy; print(cupy.__version__)' 2>&1 | tail -1)"
  if [ -z "$python" ] && has_cupy "$exe"; then python=$exe; fi
done
if [ -z "$python" ]; then
  python=$(command -v python3)
  say "-- no Python with a working CuPy; installing cupy-cuda12x into the check's environment"
  need_cupy=1
else
  say "-- using $python"
  need_cupy=0
fi

venv=.gpu-venv
"$python" -m venv --system-site-packages "$venv" >>"$summary" 2>&1 || {
  say "FAIL: cannot create a virtual environment with $python"; exit 1; }
pip=("$venv/bin/python" -m pip install -q --disable-pip-version-check)
[ -d gpu-wheels ] && pip+=(--no-index --find-links gpu-wheels)
deps=(numpy aiohttp structlog msgspec psutil prometheus-client pytest pytest-timeout
      pytest-asyncio nvidia-ml-py)
[ "$need_cupy" = 1 ] && deps+=(cupy-cuda12x)
missing=()
for dep in "${deps[@]}"; do
  module=${dep//-/_}
  case $dep in prometheus-client) module=prometheus_client ;; cupy-cuda12x) module=cupy ;;
                nvidia-ml-py) module=pynvml ;; esac
  "$venv/bin/python" -c "import $module" >/dev/null 2>&1 || missing+=("$dep")
done
if [ ${#missing[@]} -gt 0 ]; then
  say "-- installing ${missing[*]}"
  "${pip[@]}" "${missing[@]}" >>"$summary" 2>&1 || say "WARN: install failed; tests may skip"
fi
py="$venv/bin/python"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}

status=0
say "-- GPU tests (tests/gpu, -m gpu)"
timeout 210 "$py" -m pytest tests/gpu -m gpu -p no:cacheprovider -q -rs -s \
  -o junit_family=legacy --junitxml="$results/gpu-tests.xml" >"$results/gpu-tests.log" 2>&1 || status=1
tail -n 25 "$results/gpu-tests.log" | tee -a "$summary"
if grep -q "skipped" "$results/gpu-tests.log" && ! grep -q " passed" "$results/gpu-tests.log"; then
  say "FAIL: every GPU test skipped (see the reasons above)"; status=1
fi

say "-- bench/ntt.py (CuPy)"
timeout 60 "$py" bench/ntt.py --backend cupy --min-log2 14 --max-log2 22 --repeat 3 \
  2>&1 | tee "$results/bench-ntt.txt" | tee -a "$summary" || status=1
say "-- bench/pipeline_busy.py"
timeout 75 "$py" bench/pipeline_busy.py --jobs 8 2>&1 | tee "$results/bench-pipeline.txt" \
  | tee -a "$summary" || status=1

# Every figure the tests recorded (junit <property> elements), as one JSON document.
"$py" - "$results/gpu-tests.xml" "$results/gpu-check.json" <<'EOF' | tee -a "$summary"
import json, sys
import xml.etree.ElementTree as ET
figures = {}
try:
    root = ET.parse(sys.argv[1]).getroot()
except (OSError, ET.ParseError) as exc:
    root = None
    print(f"no test results: {exc}")
for case in (root.iter("testcase") if root is not None else ()):
    for prop in case.iter("property"):
        figures[f"{case.get('name')}.{prop.get('name')}"] = prop.get("value")
json.dump(figures, open(sys.argv[2], "w"), indent=2, sort_keys=True)
for key, value in sorted(figures.items()):
    print(f"{key} = {value}")
EOF
say "== gpu-check $([ $status = 0 ] && echo PASSED || echo FAILED); results in $results"
exit $status
