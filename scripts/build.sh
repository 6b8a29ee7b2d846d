#!/usr/bin/env bash
# Configures and builds spes into build/ (Release with debug line info, Ninja, ccache when present)
# against the torch wheel that scripts/setup.sh installed.
# usage: scripts/build.sh [extra cmake args]     (SPES_BUILD_DIR, SPES_BUILD_JOBS, SPES_TORCH_VERSION)
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/torch_env.sh
JOBS=${SPES_BUILD_JOBS:-2}
BUILD=${SPES_BUILD_DIR:-build}
site=$(spes_torch_site)
if [[ ! -f $BUILD/build.ninja ]]; then
  nvcc=()
  [[ -x /usr/local/cuda/bin/nvcc ]] && nvcc=(-DCMAKE_CUDA_COMPILER=/usr/local/cuda/bin/nvcc)
  cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DCMAKE_PREFIX_PATH="$site/torch/share/cmake" "${nvcc[@]}" "$@"
fi
cmake --build "$BUILD" -j "$JOBS"
