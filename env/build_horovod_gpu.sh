#!/usr/bin/env bash
# Horovod 0.28.1 with NCCL + MPI + Gloo in the active conda env (GPU clusters). Not run in CI.
set -euo pipefail
: "${CUDA_HOME:?load the CUDA module first (CUDA_HOME unset)}"
NCCL_HOME=${NCCL_HOME:-$CUDA_HOME}
WORK=$(mktemp -d); trap 'rm -rf "$WORK"' EXIT
pip download -q --no-deps --no-binary :all: horovod==0.28.1 -d "$WORK"
tar -xzf "$WORK"/horovod-0.28.1.tar.gz -C "$WORK"
for f in CMakeLists.txt horovod/torch/CMakeLists.txt; do
    sed -i 's/set(CMAKE_CXX_STANDARD 14)/set(CMAKE_CXX_STANDARD 17)/' "$WORK/horovod-0.28.1/$f"
done
env CMAKE_POLICY_VERSION_MINIMUM=3.5 HOROVOD_GPU_OPERATIONS=NCCL HOROVOD_NCCL_HOME="$NCCL_HOME" \
    HOROVOD_WITH_PYTORCH=1 HOROVOD_WITH_MPI=1 HOROVOD_WITH_GLOO=1 \
    HOROVOD_WITHOUT_TENSORFLOW=1 HOROVOD_WITHOUT_MXNET=1 MAKEFLAGS="-j$(nproc)" \
    pip install --no-deps --no-build-isolation --no-cache-dir "$WORK/horovod-0.28.1"
horovodrun --check-build
