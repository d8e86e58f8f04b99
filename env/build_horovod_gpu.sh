#!/usr/bin/env bash
# Horovod 0.28.1 with NCCL + MPI + Gloo in the active conda env (GPU clusters). Not run in CI.
#
# NCCL: Horovod links the NCCL that torch itself loads, the nvidia-nccl-cu* wheel torch depends on (its
# nvidia/nccl folder has include/nccl.h and lib/libnccl.so.2), so both use one NCCL in one process. A CUDA
# toolkit seldom ships NCCL. Set NCCL_HOME (a folder with include/nccl.h and lib/libnccl.so*) to use another.
set -euo pipefail
: "${CUDA_HOME:?load the CUDA module first (CUDA_HOME unset)}"
PY=${PYTHON:-python}
WORK=$(mktemp -d); trap 'rm -rf "$WORK"' EXIT

if [ -z "${NCCL_HOME:-}" ]; then
    NCCL_HOME=$("$PY" -c 'import os, nvidia.nccl as m; print(os.path.dirname(m.__file__) if m.__file__ else list(m.__path__)[0])' 2>/dev/null || true)
    if [ -n "$NCCL_HOME" ] && [ -f "$NCCL_HOME/include/nccl.h" ]; then
        echo "NCCL: torch's nvidia-nccl wheel, $NCCL_HOME"
    elif [ -f "$CUDA_HOME/include/nccl.h" ]; then
        echo "NCCL: no nvidia-nccl wheel with headers in this env ('import nvidia.nccl' in $PY);" \
             "falling back to the CUDA toolkit's, $CUDA_HOME (check that its version matches torch's:" \
             "python -c 'import torch; print(torch.cuda.nccl.version())')" >&2
        NCCL_HOME=$CUDA_HOME
    else
        echo "NCCL not found: neither torch's nvidia-nccl wheel ('import nvidia.nccl' in $PY) nor" \
             "$CUDA_HOME/include/nccl.h. Install torch's CUDA build in this env, or set NCCL_HOME to a folder" \
             "with include/nccl.h and lib/libnccl.so*." >&2
        exit 1
    fi
fi
[ -f "$NCCL_HOME/include/nccl.h" ] || { echo "no $NCCL_HOME/include/nccl.h (NCCL_HOME=$NCCL_HOME)" >&2; exit 1; }
NCCL_LIBDIR=""
for d in "$NCCL_HOME/lib" "$NCCL_HOME/lib64"; do
    if compgen -G "$d/libnccl.so*" >/dev/null; then NCCL_LIBDIR=$d; break; fi
done
[ -n "$NCCL_LIBDIR" ] || { echo "no libnccl.so* under $NCCL_HOME/lib or lib64" >&2; exit 1; }
# Horovod's FindNCCL asks cmake for "nccl", i.e. libnccl.so; the wheel ships only libnccl.so.2: link it. The
# built library then needs libnccl.so.2 (its soname), which torch has loaded by the time horovod.torch loads.
if [ ! -e "$NCCL_LIBDIR/libnccl.so" ]; then
    mkdir -p "$WORK/nccl-lib"
    libs=("$NCCL_LIBDIR"/libnccl.so.*)
    ln -s "${libs[0]}" "$WORK/nccl-lib/libnccl.so"
    NCCL_LIBDIR="$WORK/nccl-lib"
fi
echo "NCCL headers $NCCL_HOME/include, library $NCCL_LIBDIR (shared)"

pip download -q --no-deps --no-binary :all: horovod==0.28.1 -d "$WORK"
tar -xzf "$WORK"/horovod-0.28.1.tar.gz -C "$WORK"
for f in CMakeLists.txt horovod/torch/CMakeLists.txt; do
    sed -i 's/set(CMAKE_CXX_STANDARD 14)/set(CMAKE_CXX_STANDARD 17)/' "$WORK/horovod-0.28.1/$f"
done
env CMAKE_POLICY_VERSION_MINIMUM=3.5 HOROVOD_GPU_OPERATIONS=NCCL \
    HOROVOD_NCCL_INCLUDE="$NCCL_HOME/include" HOROVOD_NCCL_LIB="$NCCL_LIBDIR" HOROVOD_NCCL_LINK=SHARED \
    HOROVOD_WITH_PYTORCH=1 HOROVOD_WITH_MPI=1 HOROVOD_WITH_GLOO=1 \
    HOROVOD_WITHOUT_TENSORFLOW=1 HOROVOD_WITHOUT_MXNET=1 MAKEFLAGS="-j$(nproc)" \
    pip install --no-deps --no-build-isolation --no-cache-dir "$WORK/horovod-0.28.1"
horovodrun --check-build
