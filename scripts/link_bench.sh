#!/usr/bin/env bash
# Round time and link use of SPES sync on a rate-limited link: two `spes node` processes training
# `small`, each in its own network namespace, joined by a veth pair shaped with tc (tbf) to RATE
# in each direction. Per round it prints the bytes each node received, the round's time and the
# share of the link rate those bytes used, then each node's goodput (time in training steps / wall
# time from the first step to the last) and mean step time. Needs root (ip netns, tc). Cleans up
# namespaces and processes on exit. Writes runs/link-bench/.
# Latency: tc netem where the kernel has it, else scripts/delay_proxy.py in front of each node's
# sync service (DELAY_MS each way, so RTT = 2 × DELAY_MS).
# usage: sudo scripts/link_bench.sh [RATE_MBIT] [STEPS] [DELAY_MS] [EVERY] [OVERLAP] [MAX_DELAY]
#   defaults: 100 Mbit/s, 40 steps, 20 ms, sync every 5 steps, OVERLAP 0 (blocking rounds; 1 =
#   sync.overlap), MAX_DELAY -1 (every / 4). Extra `--set` arguments for both nodes: SPES_SET="k=v ...".
set -euo pipefail
cd "$(dirname "$0")/.."
RATE=${1:-100}
STEPS=${2:-40}
DELAY=${3:-20}
EVERY=${4:-5}
OVERLAP=${5:-0}
MAX_DELAY=${6:--1}
extra=()
for kv in ${SPES_SET:-}; do extra+=(--set "$kv"); done
OUT=runs/link-bench
SPES=$PWD/build/spes
[[ -x $SPES ]] || { echo "build first: bash scripts/build.sh" >&2; exit 2; }
NETNS_PREFIX=spes_lb
source scripts/netns_lib.sh
trap netns_down EXIT
netns_down
netns_up "$RATE"
use_proxy=1
if ip netns exec "${NS[0]}" tc qdisc replace dev "${NS[0]}v" root netem delay "${DELAY}ms" rate "${RATE}mbit" 2>/dev/null &&
   ip netns exec "${NS[1]}" tc qdisc replace dev "${NS[1]}v" root netem delay "${DELAY}ms" rate "${RATE}mbit" 2>/dev/null; then
  use_proxy=0
  latency_note="netem: ${DELAY} ms each way"
else
  latency_note="${DELAY} ms each way by scripts/delay_proxy.py (this kernel has no sch_netem)"
fi
[[ $DELAY == 0 ]] && use_proxy=0 && latency_note="no added latency"

"$SPES" data prepare -c configs/small.yaml > /dev/null  # once, before two nodes would race to
rm -rf "$OUT" && mkdir -p "$OUT"
echo "link-bench-$$" > "$OUT/token"
# Each node's service listens on :7400; peers dial :7401, the delay proxy in front of it (or
# :7400 directly with netem).
port=7400
if [[ $use_proxy == 1 ]]; then
  port=7401
  netns_delay_proxies "$DELAY" "$OUT"
fi
peers="[{id: 0, address: '${IP[0]}:$port'}, {id: 1, address: '${IP[1]}:$port'}]"
export OPENBLAS_NUM_THREADS=1
nodes=()
for i in 0 1; do
  ip netns exec "${NS[$i]}" "$SPES" node -c configs/small.yaml --set run.node_id=$i --set "run.out_dir=$OUT/node$i" \
    --set "train.steps=$STEPS" --set train.eval_every=0 --set train.log_every=10 --set "sync.every=$EVERY" \
    --set "sync.overlap=$([[ $OVERLAP == 1 ]] && echo true || echo false)" --set "sync.max_delay=$MAX_DELAY" "${extra[@]}" \
    --set "sync.peers=$peers" --set "sync.token_file=$OUT/token" --set sync.insecure=true --set merge.alpha=0 --set sync.listen=0.0.0.0:7400 \
    > "$OUT/node$i.log" 2>&1 &
  pids+=($!)
  nodes+=($!)
done
for p in "${nodes[@]}"; do wait "$p" || { echo "a node failed:"; tail -n 5 "$OUT"/node*.log; exit 1; }; done

echo "link: ${RATE} Mbit/s each direction, ${latency_note}; sync every $EVERY steps, overlap $OVERLAP (max_delay $MAX_DELAY)${SPES_SET:+, $SPES_SET}"
python3 - "$OUT" "$RATE" <<'PY'
import json, sys
out, rate = sys.argv[1], float(sys.argv[2]) * 1e6 / 8
rows = {}
for i in (0, 1):
    for line in open(f"{out}/node{i}/metrics.jsonl"):
        r = json.loads(line)
        if r.get("type") == "sync":
            rows.setdefault(r["round"], {})[i] = r
print(f"{'round':>5} {'node':>4} {'MiB in':>8} {'seconds':>8} {'link use':>9}")
uses = []
for rnd in sorted(rows):
    for i, r in sorted(rows[rnd].items()):
        use = r["bytes_in"] / r["seconds"] / rate if r["seconds"] > 0 else 0
        if rnd > 1:
            uses.append(use)
        print(f"{rnd:>5} {i:>4} {r['bytes_in'] / 2**20:>8.2f} {r['seconds']:>8.2f} {100 * use:>8.1f}%")
if uses:
    print(f"link use over rounds 2..: mean {100 * sum(uses) / len(uses):.1f}%, min {100 * min(uses):.1f}% "
          f"(round 1 includes start-up skew)")
for i in (0, 1):
    recs = [json.loads(l) for l in open(f"{out}/node{i}/metrics.jsonl")]
    g = [r for r in recs if r.get("type") == "goodput"]
    steps = [r["seconds"] for r in recs if r.get("type") == "train"]
    if g and steps:
        g = g[-1]
        print(f"node {i}: goodput {100 * g['ratio']:.1f}% ({g['step_seconds']:.1f} s in {len(steps)} steps of "
              f"{g['wall_seconds']:.1f} s; held {g['waited_seconds']:.1f} s for rounds); mean step {sum(steps) / len(steps):.3f} s")
PY
