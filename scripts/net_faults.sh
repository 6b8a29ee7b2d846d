#!/usr/bin/env bash
# Network faults on the sync link (docs/reliability.md, "Network faults"): two `spes node`
# processes training `small`, each in its own network namespace, joined by a veth pair capped
# with tc tbf at RATE Mbit/s each way, blocking rounds every EVERY steps (fp32: 44 MiB in per node
# per round). Each scenario is a fresh run:
#   clean      nothing injected (the reference)
#   lossP      iptables' `statistic` match drops P% of the packets entering each namespace, all run
#   outageS    every packet entering either namespace dropped (a black hole, both ways) for S
#              seconds, from 1 s into round 2's transfer
#   delayMS    MS of latency each way (RTT 2 x MS) by scripts/delay_proxy.py in front of each
#              node's sync service (this kernel has no netem)
# Per scenario it prints the steps each node finished, every round's seconds, deadline, bytes,
# resumed streams and skipped peers, each node's goodput and final validation loss, and whether
# the two nodes ended with the same weights (the last round leaves every node the same).
# Needs root, tc and iptables (scripts/setup.sh installs them). Cleans up namespaces and processes
# on exit. Writes runs/net-faults/SCENARIO/.
# usage: sudo scripts/net_faults.sh [SCENARIO ...]     (default: clean loss2 loss5 outage30 delay100)
# env:   RATE (50), STEPS (60), EVERY (20), SPES_SET ("k=v ..." for both nodes)
set -euo pipefail
cd "$(dirname "$0")/.."
RATE=${RATE:-50}
STEPS=${STEPS:-60}
EVERY=${EVERY:-20}
SCENARIOS=("$@")
[[ ${#SCENARIOS[@]} -gt 0 ]] || SCENARIOS=(clean loss2 loss5 outage30 delay100)
extra=()
for kv in ${SPES_SET:-}; do extra+=(--set "$kv"); done
SPES=$PWD/build/spes
[[ -x $SPES ]] || { echo "build first: bash scripts/build.sh" >&2; exit 2; }
command -v iptables > /dev/null || { echo "net_faults needs iptables (apt-get install iptables, or scripts/setup.sh)" >&2; exit 2; }
for s in "${SCENARIOS[@]}"; do
  [[ $s =~ ^(clean|loss[0-9]+|outage[0-9]+|delay[0-9]+)$ ]] ||
    { echo "unknown scenario '$s' (clean, lossP, outageS, delayMS)" >&2; exit 2; }
done
NETNS_PREFIX=spes_nf
source scripts/netns_lib.sh
trap netns_down EXIT
"$SPES" data prepare -c configs/small.yaml > /dev/null  # once, before two nodes would race to
export OPENBLAS_NUM_THREADS=1

# wait_for_step DIR STEP: until node DIR's metrics.jsonl has the train record of STEP (or the node ended).
wait_for_step() {
  local file=$1/metrics.jsonl
  while ! { [[ -f $file ]] && grep -E '"type":"train"' "$file" | grep -qE "\"step\":$2[,}]"; }; do
    kill -0 "${nodes[0]}" 2>/dev/null || return 1
    sleep 0.2
  done
}

run_scenario() {
  local name=$1 out=runs/net-faults/$1 i
  netns_down
  pids=()
  netns_up "$RATE"
  rm -rf "$out" && mkdir -p "$out"
  echo "net-faults-$$" > "$out/token"
  # Peers dial :7400, or :7401 where a delay proxy stands in front of the service.
  local port=7400
  if [[ $name == delay* ]]; then
    port=7401
    netns_delay_proxies "${name#delay}" "$out"
  fi
  local peers="[{id: 0, address: '${IP[0]}:$port'}, {id: 1, address: '${IP[1]}:$port'}]"
  if [[ $name == loss* ]]; then
    local p=${name#loss}
    for i in 0 1; do
      ip netns exec "${NS[$i]}" iptables -A INPUT -m statistic --mode random --probability "0.$(printf %02d "$p")" -j DROP
    done
  fi
  nodes=()
  for i in 0 1; do
    ip netns exec "${NS[$i]}" "$SPES" node -c configs/small.yaml --set run.node_id=$i --set "run.out_dir=$out/node$i" \
      --set "train.steps=$STEPS" --set "train.eval_every=$STEPS" --set train.log_every=10 --set "sync.every=$EVERY" \
      --set "sync.peers=$peers" --set "sync.token_file=$out/token" --set sync.insecure=true --set merge.alpha=0 \
      --set sync.listen=0.0.0.0:7400 --set "sync.dump_dir=$out/node$i/dump" "${extra[@]}" > "$out/node$i.log" 2>&1 &
    pids+=($!)
    nodes+=($!)
  done
  if [[ $name == outage* ]]; then
    local secs=${name#outage}
    if wait_for_step "$out/node0" $(( 2 * EVERY )); then
      sleep 1
      echo "$(date +%T) outage: dropping every packet into both namespaces for $secs s"
      for i in 0 1; do ip netns exec "${NS[$i]}" iptables -I INPUT -j DROP; done
      sleep "$secs"
      for i in 0 1; do ip netns exec "${NS[$i]}" iptables -D INPUT -j DROP; done
      echo "$(date +%T) outage over"
    fi
  fi
  local failed=0
  for p in "${nodes[@]}"; do wait "$p" || failed=1; done
  [[ $failed == 0 ]] || { echo "a node failed:"; tail -5 "$out"/node*.log; }
  echo "== $name: ${RATE} Mbit/s each way, $STEPS steps, a round every $EVERY steps${SPES_SET:+, $SPES_SET}"
  python3 - "$out" "$STEPS" <<'PY'
import json, os, struct, sys
out, steps = sys.argv[1], int(sys.argv[2])
recs = {i: [json.loads(l) for l in open(f"{out}/node{i}/metrics.jsonl")] for i in (0, 1)}
print(f"{'round':>5} {'node':>4} {'MiB in':>7} {'seconds':>8} {'deadline':>9} {'resumed':>8}  skipped")
for i in (0, 1):
    for r in recs[i]:
        if r.get("type") == "sync":
            skipped = "; ".join(f"node {k['peer']}: {k['reason']}" for k in r["skipped"]) or "-"
            print(f"{r['round']:>5} {i:>4} {r['bytes_in'] / 2**20:>7.2f} {r['seconds']:>8.2f} {r.get('deadline_s', 0):>8.1f}s "
                  f"{r.get('resumed_streams', 0):>8}  {skipped}")
for i in (0, 1):
    done = max((r["step"] for r in recs[i] if r.get("type") == "train"), default=0)
    g = [r for r in recs[i] if r.get("type") == "goodput"]
    ev = [r["val_loss"] for r in recs[i] if r.get("type") == "eval"]
    rounds = [r for r in recs[i] if r.get("type") == "sync"]
    skips = sum(1 for r in rounds if r["skipped"])
    print(f"node {i}: {done}/{steps} steps, {len(rounds)} rounds ({skips} with a skip), "
          f"goodput {100 * g[-1]['ratio']:.1f}%" if g else "", end="")
    print(f", final val loss {ev[-1]:.4f}" if ev else "")
# The last round's result on both nodes (sync.dump_dir): same bits?
last = max((r["round"] for r in recs[0] if r.get("type") == "sync"), default=0)
a, b = (f"{out}/node{i}/dump/node{i}/round{last}_post.safetensors" for i in (0, 1))
def tensors(path):
    blob = open(path, "rb").read()
    n = struct.unpack("<Q", blob[:8])[0]
    header = json.loads(blob[8:8 + n])
    header.pop("__metadata__", None)
    return header, blob[8 + n:]
if os.path.exists(a) and os.path.exists(b):
    same = tensors(a) == tensors(b)
    print(f"after round {last}: the two nodes' weights are {'bit-identical' if same else 'DIFFERENT'}")
PY
  rm -rf "$out"/node*/dump  # 71 MB a file
}

for s in "${SCENARIOS[@]}"; do run_scenario "$s"; done
