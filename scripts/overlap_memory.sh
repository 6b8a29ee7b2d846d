#!/usr/bin/env bash
# Peak RSS of two `spes node` processes on loopback training `small` (25 steps, a round at step
# 20), with sync.overlap off and then on: what overlapped rounds cost in memory. Reads each
# node's largest `peak_rss` from its metrics.jsonl. Writes runs/overlap-memory/; ends every node
# it started.
# usage: scripts/overlap_memory.sh
set -euo pipefail
cd "$(dirname "$0")/.."
SPES=./build/spes
[[ -x $SPES ]] || { echo "build first: bash scripts/build.sh" >&2; exit 2; }
"$SPES" data prepare -c configs/small.yaml > /dev/null
pids=()
trap 'for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null || true; done' EXIT
read -r p0 p1 <<< "$(python3 -c 'import socket
s=[socket.socket() for _ in range(2)]
[x.bind(("127.0.0.1", 0)) for x in s]
print(*[x.getsockname()[1] for x in s])')"
for overlap in false true; do
  out=runs/overlap-memory/overlap-$overlap
  rm -rf "$out" && mkdir -p "$out"
  pids=()
  for i in 0 1; do
    "$SPES" node -c configs/small.yaml --set run.node_id=$i --set "run.out_dir=$out/node$i" --set train.steps=25 \
      --set train.eval_every=0 --set sync.every=20 --set sync.token=t --set sync.insecure=true \
      --set "sync.peers=[{id: 0, address: '127.0.0.1:$p0'}, {id: 1, address: '127.0.0.1:$p1'}]" \
      --set "sync.overlap=$overlap" > "$out/node$i.log" 2>&1 &
    pids+=($!)
  done
  for p in "${pids[@]}"; do wait "$p"; done
  python3 - "$out" "$overlap" <<'PY'
import json, sys
out, overlap = sys.argv[1], sys.argv[2]
for i in (0, 1):
    rss = max(r["peak_rss"] for r in map(json.loads, open(f"{out}/node{i}/metrics.jsonl")) if r.get("type") == "train")
    print(f"overlap {overlap:<5} node {i}: peak RSS {rss / 2**20:.1f} MiB")
PY
done
