#!/usr/bin/env bash
# The main job: set up, build, then run a whole SPES cluster on this machine — a coordinator and
# 4 nodes on 127.0.0.1 training the `small` MoE with sync every 20 steps and the expert-merging
# warm-up — with live progress, a summary and the loss plot (runs/small-local/loss.png).
# Ctrl-C stops every process it started. Extra arguments go to `spes launch-local`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/build.sh
export OPENBLAS_NUM_THREADS=1  # four nodes share the cores: one BLAS thread each
exec ./build/spes launch-local configs/cluster-local.yaml "$@"
