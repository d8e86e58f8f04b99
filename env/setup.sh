#!/usr/bin/env bash
# Build (or refresh) the course environment: a venv with the exact versions of env/requirements.lock,
# Horovod built for it, and the ddlcourse package installed in editable mode.
#
#   env/setup.sh [--force]
#
# Variables: DDLCOURSE_VENV (default ./.venv), PYTHON (default python3.11, else python3),
#            DDLCOURSE_TORCH_INDEX (extra index for the CPU torch wheel, e.g. https://download.pytorch.org/whl/cpu,
#            on machines whose pip does not already find it), DDLCOURSE_CACHE (Horovod wheel cache, ~/.cache/ddlcourse).
# A second run with nothing changed returns in about a second (a stamp keyed by the hash of the inputs).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
VENV=${DDLCOURSE_VENV:-$ROOT/.venv}
STAMP="$VENV/.ddlcourse-stamp"
START=$(date +%s)

inputs_hash() {
    local f
    for f in env/requirements.lock env/constraints.txt env/build_horovod.sh env/setup.sh env/slides-assets.sh pyproject.toml; do
        [ -f "$ROOT/$f" ] && cat "$ROOT/$f"
    done | sha256sum | cut -c1-16
}
WANT=$(inputs_hash)
if [ "${1:-}" != "--force" ] && [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$WANT" ] && "$VENV/bin/python" -c "import ddlcourse, horovod.torch" 2>/dev/null; then
    echo "[setup] environment $VENV is up to date"
    exit 0
fi

PYTHON=${PYTHON:-$(command -v python3.11 || command -v python3 || true)}
[ -n "$PYTHON" ] || { echo "[setup] ERROR: no python3 found. Install Python 3.11." >&2; exit 1; }
PYV=$("$PYTHON" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
if [ "$PYV" != "3.11" ]; then
    echo "[setup] ERROR: $PYTHON is Python $PYV; the lock file is for Python 3.11." >&2
    echo "[setup]        Install Python 3.11 and run: PYTHON=/path/to/python3.11 make setup" >&2
    echo "[setup]        (or use the conda path: environment.yml)" >&2
    exit 1
fi

if [ ! -x "$VENV/bin/python" ]; then
    echo "[setup] creating the venv $VENV with $PYTHON"
    "$PYTHON" -m venv "$VENV"
fi
rm -f "$STAMP"
PIP=("$VENV/bin/python" -m pip --disable-pip-version-check)
EXTRA=()
[ -n "${DDLCOURSE_TORCH_INDEX:-}" ] && EXTRA=(--extra-index-url "$DDLCOURSE_TORCH_INDEX")

echo "[setup] installing the locked packages (torch pinned to the CPU build by env/constraints.txt)"
# Horovod's build needs torch, MPICH and CMake only: they go in first (with their dependencies, at the lock's
# versions), then Horovod builds in the background while pip installs the rest of the lock.
"${PIP[@]}" install -q -c "$ROOT/env/constraints.txt" -c "$ROOT/env/requirements.lock" "${EXTRA[@]}" \
    torch mpich cmake numpy setuptools wheel 2> >(grep -v 'is ignored: it is neither a file nor a directory' >&2)
HVD_LOG=$(mktemp)
setsid bash "$ROOT/env/build_horovod.sh" "$VENV" --build-only >"$HVD_LOG" 2>&1 &
HVD_PID=$!
trap 'kill -- -"$HVD_PID" 2>/dev/null || true; rm -f "$HVD_LOG"' EXIT  # the build and its compilers, if setup stops early
# --no-deps: the lock is complete, so pip installs exactly it and never swaps torch; 'pip check' verifies it.
"${PIP[@]}" install -q --no-deps -c "$ROOT/env/constraints.txt" "${EXTRA[@]}" -r "$ROOT/env/requirements.lock" \
    2> >(grep -v 'is ignored: it is neither a file nor a directory' >&2)
"${PIP[@]}" check || { echo "[setup] ERROR: the installed packages are inconsistent (see above). Regenerate the lock with 'make lock'." >&2; exit 1; }
"$VENV/bin/python" - <<'PY'
import torch, sys
if torch.version.cuda is not None and "--cuda-ok" not in sys.argv:
    print(f"[setup] note: torch {torch.__version__} is a CUDA build", file=sys.stderr)
PY

kill -0 "$HVD_PID" 2>/dev/null \
    && echo "[setup] Horovod: its build started beside pip; waiting for it (about 3.5 minutes on 2 cores in all)"
HVD_RC=0; wait "$HVD_PID" || HVD_RC=$?
cat "$HVD_LOG"
[ "$HVD_RC" = 0 ] || exit "$HVD_RC"
bash "$ROOT/env/build_horovod.sh" "$VENV"

echo "[setup] installing ddlcourse (editable)"
"${PIP[@]}" install -q --no-deps --no-build-isolation -c "$ROOT/env/constraints.txt" -e "$ROOT"

if [ -f "$ROOT/env/slides-assets.sh" ]; then
    bash "$ROOT/env/slides-assets.sh" "$VENV"
fi

"$VENV/bin/python" -c "import torch; assert torch.__version__.startswith('2.13.0'), torch.__version__"
echo "$WANT" > "$STAMP"
echo "[setup] done in $(( $(date +%s) - START )) s: $VENV ($(du -sh "$VENV" | cut -f1))"
