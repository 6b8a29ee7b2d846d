#!/usr/bin/env bash
# Configures and builds spes into build/ (Release with debug line info, Ninja, ccache when present).
# usage: scripts/build.sh [extra cmake args]
set -euo pipefail
cd "$(dirname "$0")/.."
JOBS=${SPES_BUILD_JOBS:-2}
if [[ ! -f build/build.ninja ]]; then
  cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo "$@"
fi
cmake --build build -j "$JOBS"
