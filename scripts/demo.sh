#!/usr/bin/env bash
# The main job: set up, build, then train the `small` MoE on the Brown corpus on this machine,
# with the loss falling on screen, and plot the loss curve to runs/small/loss.png.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/build.sh
./build/spes train --config configs/small.yaml "$@"
bash scripts/plot_loss.sh runs/small/metrics.jsonl runs/small/loss.png
echo "loss curve: runs/small/loss.png"
