#!/usr/bin/env bash
# Tokens/s of one node with 1 and 2 Gloo ranks on this machine (`small` by default): the node
# trains alone (a 1-node "cluster"), 14 steps per case, median tokens/s of steps 3-14 from rank
# 0's metrics (the node's tokens over rank 0's step time, all-reduce included), and the time of a
# round's weight broadcast to the other rank.
#   cases: 1 rank x 1 thread, batch B | 1 rank x 2 threads, batch 2B | 2 ranks x 1 thread, batch B each
# usage: scripts/ranks_bench.sh [CONFIG] [DATA_DIR]      (SPES=path/to/spes, default build/spes)
set -euo pipefail
cd "$(dirname "$0")/.."
SPES=${SPES:-build/spes}
CONFIG=${1:-configs/small.yaml}
DATA=${2:-data/small}
TMP=$(mktemp -d)
node_pid=
trap '[[ -n $node_pid ]] && kill -9 $node_pid 2>/dev/null; rm -rf "$TMP"' EXIT
port=$(python3 -c "import socket; s=socket.socket(); s.bind(('127.0.0.1', 0)); print(s.getsockname()[1])")
batch=$(awk '/^train:/{t=1} t && /batch_size:/{print $2; exit}' "$CONFIG")
echo "machine: $(nproc) cores, $(lscpu | sed -n 's/^Model name: *//p')"
echo "config: $CONFIG, micro-batch $batch per rank"
run_case() {  # run_case NAME RANKS THREADS BATCH
  local out=$TMP/$1
  "$SPES" node -c "$CONFIG" --set "data.dir=$DATA" --set train.steps=14 --set sync.every=7 --set merge.alpha=0 \
    --set "sync.peers=[{id: 0, address: '127.0.0.1:$port'}]" --set sync.insecure=true --set sync.token=bench \
    --set train.eval_every=0 --set train.eval_windows=1 --set run.threads="$3" --set train.batch_size="$4" \
    --set "run.out_dir=$out" --nproc-per-node "$2" > "$out.log" 2>&1 &
  node_pid=$!
  wait $node_pid || { echo "node failed ($1):"; tail -5 "$out.log"; exit 1; }
  node_pid=
  python3 - "$out/metrics.jsonl" "$1" "$out/node.log" <<'PY'
import json, re, statistics, sys
steps = [json.loads(l) for l in open(sys.argv[1]) if '"type":"train"' in l]
tps = statistics.median(s["tokens_per_s"] for s in steps[2:])
share = re.findall(r"weights to the node's \d+ other rank\(s\): (.*) in ([0-9.]+) s", open(sys.argv[3]).read())
extra = f" | round broadcast {share[-1][0]} in {share[-1][1]} s" if share else ""
print(f"{sys.argv[2]:<28} {tps:10.0f} tok/s | {steps[-1]['tokens']} tokens/step{extra}")
open(sys.argv[1] + ".tps", "w").write(str(tps))
PY
}
run_case "1 rank x 1 thread" 1 1 "$batch"
run_case "1 rank x 2 threads" 1 2 $((batch * 2))
run_case "2 ranks x 1 thread (gloo)" 2 1 "$batch"
python3 - "$TMP" <<'PY'
import sys
t = {n: float(open(f"{sys.argv[1]}/{n}/metrics.jsonl.tps").read()) for n in
     ["1 rank x 1 thread", "1 rank x 2 threads", "2 ranks x 1 thread (gloo)"]}
base = t["1 rank x 1 thread"]
print(f"speed-up over 1 rank x 1 thread: 2 threads {t['1 rank x 2 threads'] / base:.2f}x, "
      f"2 gloo ranks {t['2 ranks x 1 thread (gloo)'] / base:.2f}x")
PY
