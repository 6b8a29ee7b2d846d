#!/usr/bin/env bash
# The quality experiment of docs/benchmarks.md: `small`, equal total tokens, four runs —
#   central        1 node, all experts, batch 4 × 8 (what the 4 nodes see together)
#   spes-warmup    4 nodes × batch 8, SPES sync every 20 steps (fp32), merge warm-up
#   spes-nowarmup  the same without the merge warm-up (merge.alpha 0)
#   spes-int8      the same as spes-warmup with int8 deltas (error feedback) on the wire
#   spes-h5        (only when named) spes-warmup with sync every 5 steps instead of 20
#   spes-merge5    (only when named) a strong warm-up: alpha 0.05 at every round, decaying over the run
#   spes-merge20   (only when named) the same with alpha 0.2
#   spes-overlap   (only when named) spes-warmup with overlapped rounds (sync.overlap, landing
#                  max_delay = 5 steps after each snapshot)
#   spes-fragments (only when named) spes-overlap with the model in 4 fragments (sync.fragments:
#                  a round every 5 steps, one fragment each, landing 4 steps after its snapshot)
# then a table of validation losses and one PNG of the curves (runs/quality/quality.png).
# About 40 minutes on 2 cores (10 per run).
# usage: scripts/quality_experiment.sh [STEPS [RUNS...]]   (default 200 and the first four;
#        a central run of the same STEPS already in runs/quality is reused when not named;
#        QUALITY_OUT, QUALITY_CONFIG and QUALITY_NODE_BATCH change the folder, the config and
#        the per-node batch; QUALITY_SET="key=value ..." overrides config keys in every run,
#        e.g. QUALITY_SET="optim.lr=4.5e-3 model.d_ff=8")
set -euo pipefail
cd "$(dirname "$0")/.."
STEPS=${1:-200}
shift || true
RUNS=("$@")
[[ ${#RUNS[@]} -gt 0 ]] || RUNS=(central spes-warmup spes-nowarmup spes-int8)
OUT=${QUALITY_OUT:-runs/quality}           # where runs and curves go
CONFIG=${QUALITY_CONFIG:-configs/small.yaml}  # the model and data of every run
NODE_BATCH=${QUALITY_NODE_BATCH:-8}           # sequences per node-step; central gets 4 times as many
read -r -a EXTRA_SET <<< "${QUALITY_SET:-}"     # key=value overrides for every run (e.g. optim.lr=4e-3)
SPES=${SPES_BIN:-./build/spes}  # SPES_BIN: a copy, so that rebuilding during the experiment changes nothing
[[ -x $SPES ]] || { echo "build first: bash scripts/build.sh" >&2; exit 2; }
mkdir -p "$OUT/curves"
source scripts/quality_lib.sh

central() {
  "$SPES" train -c "$CONFIG" --set "train.steps=$STEPS" --set train.eval_every=25 \
    --set schedule.warmup_steps=20 --set train.batch_size=$((4 * NODE_BATCH)) --set run.threads=2 --set "run.out_dir=$OUT/central" \
    "${EXTRA_SET[@]/#/--set=}" > "$OUT/central.log" 2>&1
  mkdir -p "$OUT/curves/central" && cp "$OUT/central/metrics.jsonl" "$OUT/curves/central/"
}

# spes NAME BASE_PORT EXTRA_SET_LINES [SYNC_EVERY]
spes() {
  local name=$1 port=$2 extra=$3 every=${4:-20}
  quality_launch "$OUT/$name" "$port" "$CONFIG" "  train.steps: $STEPS
  train.batch_size: $NODE_BATCH
  train.eval_every: 25
  schedule.warmup_steps: 20
  sync.every: $every
  sync.peer_wait_s: 60
$extra
$(for kv in "${EXTRA_SET[@]}"; do echo "  ${kv%%=*}: ${kv#*=}"; done)"
  mkdir -p "$OUT/curves/$name" && cp "$OUT/$name/run/node0/metrics.jsonl" "$OUT/curves/$name/"
}

# The warm-up of the main runs: alpha 0.01 at the rounds of steps 40, 80, 120, 160.
WARMUP="  merge.alpha: 0.01
  merge.every: 40
  merge.horizon: 160"
t0=$(date +%s)
for run in "${RUNS[@]}"; do
  echo "$run ..."
  case $run in
    central) central ;;
    spes-warmup) spes spes-warmup 7320 "$WARMUP" ;;
    spes-nowarmup) spes spes-nowarmup 7330 "  merge.alpha: 0" ;;
    spes-int8) spes spes-int8 7340 "$WARMUP
  sync.encoding.shared: int8_delta
  sync.encoding.experts: int8_delta" ;;
    spes-h5) spes spes-h5 7350 "$WARMUP" 5 ;;
    spes-merge5) spes spes-merge5 7360 "  merge.alpha: 0.05
  merge.every: 20
  merge.horizon: $STEPS" ;;
    spes-merge20) spes spes-merge20 7370 "  merge.alpha: 0.2
  merge.every: 20
  merge.horizon: $STEPS" ;;
    spes-overlap) spes spes-overlap 7380 "$WARMUP
  sync.overlap: true
  sync.max_delay: 5" ;;
    spes-fragments) spes spes-fragments 7390 "$WARMUP
  sync.overlap: true
  sync.fragments: 4
  sync.max_delay: 4" ;;
    *) echo "unknown run '$run' (central spes-warmup spes-nowarmup spes-int8 spes-h5 spes-merge5 spes-merge20 spes-overlap spes-fragments)" >&2; exit 2 ;;
  esac
done
[[ -f $OUT/curves/central/metrics.jsonl ]] || { echo "no central run in $OUT: name 'central' too" >&2; exit 2; }
echo "all runs done in $(( $(date +%s) - t0 )) s"

python3 - "$OUT/curves" <<'PY'
import json, os, sys
root = sys.argv[1]
order = ["central", "spes-warmup", "spes-nowarmup", "spes-int8", "spes-h5", "spes-merge5", "spes-merge20", "spes-overlap",
         "spes-fragments"]
names = [n for n in order if os.path.exists(os.path.join(root, n, "metrics.jsonl"))]
curves = {}
for n in names:
    pts = {}
    for line in open(os.path.join(root, n, "metrics.jsonl")):
        r = json.loads(line)
        if r.get("type") == "eval":
            pts[r["step"]] = r["val_loss"]
    curves[n] = pts
steps = sorted(set.intersection(*(set(c) for c in curves.values())))
print("validation loss (same validation tokens for every run)")
print("step  " + "".join(f"{n:>15}" for n in names))
for s in steps:
    print(f"{s:<6}" + "".join(f"{curves[n][s]:>15.4f}" for n in names))
last = steps[-1]
c = curves["central"][last]
print(f"\nfinal (step {last}):")
for n in names[1:]:
    v = curves[n][last]
    print(f"  {n:<14} {v:.4f}  vs central {100 * (v - c) / c:+.2f}%")
if "spes-warmup" in curves and "spes-int8" in curves:
    w = curves["spes-warmup"][last]
    print(f"  int8 vs fp32 sync (both with warm-up): {100 * (curves['spes-int8'][last] - w) / w:+.2f}%")
if "spes-warmup" in curves and "spes-overlap" in curves:
    w = curves["spes-warmup"][last]
    print(f"  overlapped vs blocking rounds (both with warm-up): {100 * (curves['spes-overlap'][last] - w) / w:+.2f}%")
if "spes-warmup" in curves and "spes-fragments" in curves:
    w = curves["spes-warmup"][last]
    print(f"  4 fragments, overlapped, vs blocking rounds: {100 * (curves['spes-fragments'][last] - w) / w:+.2f}%")
PY
curves=()
for n in central spes-warmup spes-nowarmup spes-int8 spes-h5 spes-merge5 spes-merge20 spes-overlap spes-fragments; do
  if [[ -f $OUT/curves/$n/metrics.jsonl ]]; then curves+=("$OUT/curves/$n/metrics.jsonl"); fi
done
bash scripts/plot_loss.sh "${curves[@]}" "$OUT/quality.png"
echo "plot: $OUT/quality.png"
