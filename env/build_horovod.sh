#!/usr/bin/env bash
# Build Horovod 0.28.1 with PyTorch, MPI and Gloo for the course venv, and install it.
#
#   env/build_horovod.sh VENV_DIR [--build-only]
#
# --build-only builds the wheel into the cache and stops there; env/setup.sh runs it in the background while
# pip installs the rest of the lock, then runs this script again to install the cached wheel.
#
# Horovod's last release does not build against torch 2.x out of the box (see README, "Horovod"):
#   1. CMake 4 rejects Gloo's old cmake_minimum_required -> CMAKE_POLICY_VERSION_MINIMUM=3.5
#   2. its torch extension is compiled as C++14, torch 2.x headers need C++17 -> patch the sdist.
# And two choices:
#   3. a Release build (-O3, as Horovod's RelWithDebInfo, without -g). 211 s instead of 290 s on 2 cores, a
#      1.1 MB wheel instead of 19 MB; only debugging Horovod's own C++ needs its symbols.
#   4. a relocatable library: its RUNPATH finds MPICH's libmpi and torch's libraries relative to itself
#      ($ORIGIN), not in the venv it was built in. CMake's default is that venv's absolute path, and a cached
#      wheel then fails to import in every other venv once that one is gone ("libmpi.so.12: cannot open shared
#      object file").
# The built wheel is cached outside the clone, keyed by everything it links against and by this script, so
# later setups (and fresh clones on the same machine) install it in seconds. A cached wheel that does not
# import is dropped and built again.
set -euo pipefail

VENV=${1:?usage: env/build_horovod.sh VENV_DIR [--build-only]}
BUILD_ONLY=0; [ "${2:-}" = --build-only ] && BUILD_ONLY=1
PY="$VENV/bin/python"
HERE=$(cd "$(dirname "$0")" && pwd)
HVD_VERSION=0.28.1
CACHE_ROOT=${DDLCOURSE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/ddlcourse}

ver() { "$PY" -c "import importlib.metadata as m; print(m.version('$1'))"; }
TORCH_V=$(ver torch); MPICH_V=$(ver mpich); PYTAG=$("$PY" -c 'import sys; print(f"cp{sys.version_info[0]}{sys.version_info[1]}")')
RECIPE=$(sha256sum "$HERE/build_horovod.sh" | cut -c1-8)  # a change to the patches below builds anew
KEY="horovod-${HVD_VERSION}_torch-${TORCH_V}_mpich-${MPICH_V}_${PYTAG}_$(uname -m)_${RECIPE}"
WHEEL_DIR="$CACHE_ROOT/wheels/$KEY"

if ! ls "$WHEEL_DIR"/horovod-*.whl >/dev/null 2>&1; then
    echo "[horovod] no cached wheel for $KEY: building from the patched sdist (about 3.5 minutes on 2 cores)"
    WORK=$(mktemp -d); trap 'rm -rf "$WORK"' EXIT
    "$PY" -m pip download -q --no-deps --no-binary :all: "horovod==$HVD_VERSION" -d "$WORK" \
        || { echo "[horovod] ERROR: could not download the horovod==$HVD_VERSION sdist from PyPI." >&2; exit 1; }
    tar -xzf "$WORK"/horovod-*.tar.gz -C "$WORK"
    SRC="$WORK/horovod-$HVD_VERSION"
    for f in CMakeLists.txt horovod/torch/CMakeLists.txt; do
        grep -q 'set(CMAKE_CXX_STANDARD 14)' "$SRC/$f" \
            || { echo "[horovod] ERROR: $f has no 'set(CMAKE_CXX_STANDARD 14)'; the sdist changed, update this patch." >&2; exit 1; }
        sed -i 's/set(CMAKE_CXX_STANDARD 14)/set(CMAKE_CXX_STANDARD 17)/' "$SRC/$f"
    done
    grep -q "else 'RelWithDebInfo'" "$SRC/setup.py" \
        || { echo "[horovod] ERROR: setup.py has no \"else 'RelWithDebInfo'\"; the sdist changed, update this patch." >&2; exit 1; }
    sed -i "s/else 'RelWithDebInfo'/else 'Release'/" "$SRC/setup.py"
    # mpi_lib_v2 lands in <venv>/lib/python3.X/site-packages/horovod/torch; the mpich wheel's libmpi.so.12
    # is in <venv>/lib, four folders up, and torch's libraries in site-packages/torch/lib.
    TORCH_CMAKE="$SRC/horovod/torch/CMakeLists.txt"
    ANCHOR='set_target_properties(${PYTORCH_TARGET_LIB} PROPERTIES OUTPUT_NAME "mpi_lib_v2")'
    grep -qF "$ANCHOR" "$TORCH_CMAKE" \
        || { echo "[horovod] ERROR: horovod/torch/CMakeLists.txt names no mpi_lib_v2; the sdist changed, update this patch." >&2; exit 1; }
    printf '%s\n' 'set_target_properties(${PYTORCH_TARGET_LIB} PROPERTIES BUILD_WITH_INSTALL_RPATH ON' \
        '    INSTALL_RPATH "$ORIGIN/../../../..;$ORIGIN/../../torch/lib")' >>"$TORCH_CMAKE"
    LOG="$WORK/build.log"
    # The venv's bin comes first so that its cmake, mpicc and mpicxx (mpich wheel) are used.
    BUILD_RC=0
    env PATH="$VENV/bin:$PATH" \
        CMAKE_POLICY_VERSION_MINIMUM=3.5 \
        HOROVOD_WITH_PYTORCH=1 HOROVOD_WITH_MPI=1 HOROVOD_WITH_GLOO=1 \
        HOROVOD_WITHOUT_TENSORFLOW=1 HOROVOD_WITHOUT_MXNET=1 \
        HOROVOD_CPU_OPERATIONS=MPI MAKEFLAGS="-j$(nproc)" \
        "$PY" -m pip wheel -v --no-deps --no-build-isolation -w "$WORK/wheel" "$SRC" >"$LOG" 2>&1 || BUILD_RC=$?
    mkdir -p "$CACHE_ROOT/logs"; cp "$LOG" "$CACHE_ROOT/logs/horovod-build.log"   # kept, built or not
    if [ "$BUILD_RC" != 0 ]; then
        echo "[horovod] ERROR: the Horovod build failed. Last lines of the log:" >&2
        tail -n 25 "$LOG" >&2
        cat >&2 <<HINT
[horovod] Full log: $CACHE_ROOT/logs/horovod-build.log
[horovod] What to try:
  - a C++17 compiler must be on PATH: 'g++ --version' (Debian/Ubuntu: apt-get install build-essential)
  - the Python headers must be present: apt-get install python3-dev (or use a python.org / pyenv build)
  - 'make setup' again after fixing; the rest of the environment is already installed and is kept.
HINT
        exit 1
    fi
    mkdir -p "$WHEEL_DIR"
    cp "$WORK"/wheel/horovod-*.whl "$WHEEL_DIR/.tmp.whl"
    mv "$WHEEL_DIR/.tmp.whl" "$WHEEL_DIR/$(basename "$WORK"/wheel/horovod-*.whl)"
    echo "[horovod] cached $WHEEL_DIR"
fi

[ "$BUILD_ONLY" = 1 ] && exit 0
# --force-reinstall: the venv may hold a broken horovod of the same version, which pip would keep.
"$PY" -m pip install -q --no-deps --force-reinstall -c "$HERE/constraints.txt" "$WHEEL_DIR"/horovod-*.whl
if ! "$PY" - <<'PY'
import horovod.torch as hvd
assert hvd.mpi_built() and hvd.gloo_built(), "Horovod was built without MPI or Gloo"
print("[horovod] OK: horovod.torch", __import__("horovod").__version__, "with MPI and Gloo")
PY
then
    if [ -n "${DDLCOURSE_HVD_REBUILT:-}" ]; then
        echo "[horovod] ERROR: the wheel built just now does not import (above)." \
            "Its build log: $CACHE_ROOT/logs/horovod-build.log" >&2
        exit 1
    fi
    echo "[horovod] the cached wheel $WHEEL_DIR does not import in $VENV (above): dropping it and building again" >&2
    rm -rf "$WHEEL_DIR"
    DDLCOURSE_HVD_REBUILT=1 exec bash "$HERE/build_horovod.sh" "$VENV"
fi
