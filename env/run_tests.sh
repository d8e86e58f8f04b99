#!/usr/bin/env bash
# Run the course's tests inside its venv.   [WORKERS=N] env/run_tests.sh all|unit|notebooks [extra pytest args]
#   unit       pytest on tests/
#   notebooks  nbval over every notebook in notebooks/ and labs/ (found by glob)
#   all        both, in one pytest session
# Every process a run starts carries DDLCOURSE_TEST_RUN=<id>, so the session-end hook in
# tests/conftest.py can stop any cluster a killed kernel left behind, and fail the run if any survive.
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
VENV=${DDLCOURSE_VENV:-$ROOT/.venv}
WHAT=${1:-all}; shift || true
# pytest-xdist workers: $WORKERS, or one more than the cores this process may use, at most 4 (each worker may
# run a notebook with its cluster of up to 4 engines, each holding torch: memory grows with them). A test often
# waits (for a cluster's start, Slurm, a browser), and with as many workers as cores the CPUs then idle. On
# 2 cores, 3 workers took the whole suite from 1498 s to 1359 s (2026-11-28, one run each; with 3, 12 of its
# 2723 CPU-seconds were idle).
WORKERS=${WORKERS:-$("$VENV/bin/python" -c 'from ddlcourse.cluster.launch import available_cores; print(min(available_cores() + 1, 4))')}
case "$WORKERS" in
  ''|*[!0-9]*|0) echo "env/run_tests.sh: WORKERS must be a positive number, got '$WORKERS'" >&2; exit 2 ;;
esac
export DDLCOURSE_SCALE=${DDLCOURSE_SCALE:-smoke}
export DDLCOURSE_TEST_RUN=${DDLCOURSE_TEST_RUN:-$(date +%s)-$$}
export DDLCOURSE_RUNTIME_DIR="$ROOT/.test-runtime/$DDLCOURSE_TEST_RUN"
export MPLBACKEND=Agg PYTHONHASHSEED=0 PYDEVD_DISABLE_FILE_VALIDATION=1
mkdir -p "$DDLCOURSE_RUNTIME_DIR"

shopt -s nullglob
NB=(notebooks/*.ipynb labs/*.ipynb)
case "$WHAT" in
  unit)      TARGETS=(tests) ;;
  notebooks) TARGETS=("${NB[@]}") ;;
  all)       TARGETS=(tests "${NB[@]}") ;;
  *) echo "usage: env/run_tests.sh all|unit|notebooks" >&2; exit 2 ;;
esac
echo "[test] scale=$DDLCOURSE_SCALE run=$DDLCOURSE_TEST_RUN notebooks=${#NB[@]} workers=$WORKERS"
START=$(date +%s)
"$VENV/bin/python" -m pytest -p no:cacheprovider -n "$WORKERS" --dist loadfile \
    --nbval-lax --nbval-sanitize-with tests/sanitize.cfg --nbval-cell-timeout 900 \
    -o addopts="" -rfE --durations 20 "${TARGETS[@]}" "$@"
RC=$?
echo "[test] pytest exit code $RC after $(( $(date +%s) - START )) s"
if [ $RC -eq 5 ]; then echo "[test] ERROR: no test was collected" >&2; RC=1; fi
rm -rf "$DDLCOURSE_RUNTIME_DIR"
exit $RC
