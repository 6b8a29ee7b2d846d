#!/usr/bin/env bash
# Soak (docs/reliability.md, "Soak"): a coordinator and NODES nodes of the tiny config, all in a
# network namespace of their own (loopback only), run STEPS steps twice: fault-free, then with a
# random fault every FAULT_MIN..FAULT_MAX seconds until 80% of the steps are done:
#   kill9   kill -9 a running node; restarted with --resume 5-20 s later (rejoins, catches up)
#   term    SIGTERM a running node; restarted with --resume once it has exited
#   coord   kill -9 the coordinator; restarted 5 s later from its state file
#   loss    5% of the packets to and from one node's sync port dropped for 30 s (iptables statistic)
#   outage  every packet to and from one node's sync port dropped for 30 s (iptables DROP)
# The report (runs/soak/report.txt) gives per run: wall time, goodput (time in training steps /
# (nodes x wall time)), rounds completed and rounds with a peer skipped, each node's final
# validation loss, whether the nodes' last shards agree (`spes ckpt merge`), and the faults injected.
# Settings scaled to tiny's 0.1 s rounds (the defaults suit big models): sync.min_round_timeout_s
# 15, peer_wait_s 10, coordinator heartbeat 1 s, dead after 6 s, grace 6 s; a shard every 50 steps.
# Needs root (ip netns, iptables: scripts/setup.sh installs it). Ends every process it started.
# usage: sudo scripts/soak.sh [STEPS]      (default 6000: about 10 minutes a run on 2 cores)
# env:   NODES (4), SEED (1), FAULT_MIN (60), FAULT_MAX (150), FAULTS ("kill9 term coord loss outage"),
#        RUNS ("clean faults": the runs to make; "clean" is fault-free, any other name has faults)
set -euo pipefail
cd "$(dirname "$0")/.."
STEPS=${1:-6000}
NODES=${NODES:-4}
SEED=${SEED:-1}
FAULT_MIN=${FAULT_MIN:-60}
FAULT_MAX=${FAULT_MAX:-150}
read -r -a FAULTS <<< "${FAULTS:-kill9 term coord loss outage}"
SPES=$PWD/build/spes
NS=spes_soak
OUT=runs/soak
[[ -x $SPES ]] || { echo "build first: bash scripts/build.sh" >&2; exit 2; }
[[ $(id -u) -eq 0 ]] || { echo "soak.sh needs root (ip netns, iptables)" >&2; exit 2; }
command -v iptables > /dev/null || { echo "soak.sh needs iptables (scripts/setup.sh installs it)" >&2; exit 2; }
RANDOM=$SEED
export OPENBLAS_NUM_THREADS=1

declare -A node_pid=()
coord_pid=
all_pids=()
in_ns() { ip netns exec "$NS" "$@"; }
cleanup() {
  for p in "${all_pids[@]}"; do kill -9 "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  ip netns del "$NS" 2>/dev/null || true
}
trap cleanup EXIT
ip netns del "$NS" 2>/dev/null || true
ip netns add "$NS"
in_ns ip link set lo up
"$SPES" data prepare -c configs/tiny.yaml > /dev/null

log() { echo "$(date +%T) $*" | tee -a "$run/faults.log"; }
port_of() { echo $((7500 + $1)); }

write_cluster() {
  mkdir -p "$run"
  echo "soak-$$" > "$run/token"
  {
    echo "run: soak-$(basename "$run")"
    echo "config: $PWD/configs/tiny.yaml"
    echo "out_dir: $PWD/$run/out"
    echo "token_file: $PWD/$run/token"
    echo "insecure: true"
    echo "set:"
    echo "  train.steps: $STEPS"
    echo "  train.eval_every: $STEPS"
    echo "  train.log_every: 100"
    echo "  checkpoint.every: 50"
    echo "  checkpoint.keep: 3"
    echo "  sync.every: 20"
    echo "  sync.min_round_timeout_s: 15"
    echo "  sync.round_timeout_s: 60"
    echo "  sync.peer_wait_s: 10"
    echo "coordinator: {address: '127.0.0.1:7499', heartbeat_s: 1, dead_after_s: 6, grace_s: 6}"
    echo "nodes:"
    for ((i = 0; i < NODES; i++)); do echo "  - {id: $i, address: '127.0.0.1:$(port_of $i)'}"; done
  } > "$run/cluster.yaml"
  "$SPES" coordinator plan --cluster "$run/cluster.yaml" --out "$run/plan" > /dev/null
}

# (Started with `ip netns exec` itself, not through a function: $! must be the process, not a
# subshell that a signal would end while the process runs on.)
start_coord() {
  ip netns exec "$NS" "$SPES" coordinator serve --cluster "$run/cluster.yaml" --exit-when-done >> "$run/coord.log" 2>&1 &
  coord_pid=$!
  all_pids+=($!)
}
start_node() {  # start_node I [--resume]
  ip netns exec "$NS" "$SPES" node -c "$run/plan/node$1.yaml" "${@:2}" >> "$run/node$1.log" 2>&1 &
  node_pid[$1]=$!
  all_pids+=($!)
}
running() { kill -0 "$1" 2>/dev/null; }
# The highest step node 0..N-1 reached (from the progress lines).
step_now() { grep -ho "step *[0-9]*/$STEPS" "$run"/node*.log 2>/dev/null | awk '{sub("/.*", "", $2); print $2}' | sort -n | tail -1; }

# drop_port I PROBABILITY SECONDS: drops packets to and from node I's port inside the namespace.
drop_port() {
  local port rule
  port=$(port_of "$1")
  if [[ $2 == 1 ]]; then rule=(-j DROP); else rule=(-m statistic --mode random --probability "$2" -j DROP); fi
  in_ns iptables -I INPUT -p tcp --dport "$port" "${rule[@]}"
  in_ns iptables -I INPUT -p tcp --sport "$port" "${rule[@]}"
  sleep "$3"
  in_ns iptables -D INPUT -p tcp --dport "$port" "${rule[@]}"
  in_ns iptables -D INPUT -p tcp --sport "$port" "${rule[@]}"
}

inject() {
  local fault=${FAULTS[$((RANDOM % ${#FAULTS[@]}))]} i=$((RANDOM % NODES))
  case $fault in
    kill9)
      running "${node_pid[$i]}" || return 0
      log "fault: kill -9 node $i (pid ${node_pid[$i]})"
      kill -9 "${node_pid[$i]}" 2>/dev/null || true; wait "${node_pid[$i]}" 2>/dev/null || true
      sleep $((5 + RANDOM % 16))
      log "restart node $i with --resume"; start_node "$i" --resume ;;
    term)
      running "${node_pid[$i]}" || return 0
      log "fault: SIGTERM node $i"
      kill -TERM "${node_pid[$i]}" 2>/dev/null || true
      local rc=0; wait "${node_pid[$i]}" || rc=$?
      log "node $i exited $rc; restart with --resume"; start_node "$i" --resume ;;
    coord)
      log "fault: kill -9 the coordinator"
      kill -9 "$coord_pid" 2>/dev/null || true; wait "$coord_pid" 2>/dev/null || true
      sleep 5
      log "restart the coordinator"; start_coord ;;
    loss)
      log "fault: 5% packet loss on node $i's port for 30 s"; drop_port "$i" 0.05 30; log "loss over" ;;
    outage)
      log "fault: node $i's port black-holed for 30 s"; drop_port "$i" 1 30; log "outage over" ;;
  esac
}

run_soak() {  # run_soak NAME WITH_FAULTS
  run=$OUT/$1
  rm -rf "$run"
  write_cluster
  : > "$run/faults.log"
  local t0 next
  t0=$(date +%s)
  start_coord
  for ((i = 0; i < NODES; i++)); do start_node "$i"; done
  next=$((t0 + FAULT_MIN + RANDOM % (FAULT_MAX - FAULT_MIN + 1)))
  while running "$coord_pid" || [[ -n $(for p in "${node_pid[@]}"; do running "$p" && echo x; done) ]]; do
    sleep 1
    if [[ $2 == 1 && $(date +%s) -ge $next && $(step_now || echo 0) -lt $((STEPS * 8 / 10)) ]]; then
      inject
      next=$(($(date +%s) + FAULT_MIN + RANDOM % (FAULT_MAX - FAULT_MIN + 1)))
    fi
    # A coordinator that left (every member done) while a restarted node still catches up: back.
    if ! running "$coord_pid"; then
      for p in "${node_pid[@]}"; do running "$p" && { log "coordinator gone with node(s) running: restart"; start_coord; break; }; done
    fi
  done
  echo $(($(date +%s) - t0)) > "$run/wall_s"
  # Every node's last shard (after the last round): shared weights must agree (ckpt merge says
  # "differ between the shards" otherwise), and the merge holds every expert.
  local folders=()
  for ((i = 0; i < NODES; i++)); do folders+=("$run/out/node$i/checkpoints"); done
  "$SPES" ckpt merge "${folders[@]}" -o "$run/merged" > "$run/merge.log" 2>&1 || true
}

read -r -a RUN_NAMES <<< "${RUNS:-clean faults}"
for name in "${RUN_NAMES[@]}"; do run_soak "$name" "$([[ $name == clean ]] && echo 0 || echo 1)"; done

python3 - "$OUT" "$NODES" "$STEPS" "${RUN_NAMES[@]}" <<'PY' | tee "$OUT/report.txt"
import json, sys
out, nodes, steps, names = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4:]
print(f"soak: {nodes} nodes of tiny, {steps} steps, sync every 20 steps, a shard every 50")
for name in names:
    run = f"{out}/{name}"
    wall = int(open(f"{run}/wall_s").read())
    in_steps, rounds, skipped, losses = 0.0, {}, {}, {}
    for i in range(nodes):
        for line in open(f"{run}/out/node{i}/metrics.jsonl"):
            r = json.loads(line)
            if r.get("type") == "train": in_steps += r["seconds"]
            elif r.get("type") == "sync":
                rounds.setdefault(i, set()).add(r["round"])
                if r["skipped"]: skipped.setdefault(i, set()).add(r["round"])
            elif r.get("type") == "eval": losses[i] = r["val_loss"]
    last = max(max(r) for r in rounds.values())
    merge = open(f"{run}/merge.log").read()
    same = "merged" in merge and "differ between the shards" not in merge
    faults = [l.split(" ", 1)[1].strip() for l in open(f"{run}/faults.log") if " fault: " in l]
    print(f"\n== {name}: wall {wall} s, goodput {100 * in_steps / (nodes * wall):.1f}%, last round {last}")
    for i in range(nodes):
        print(f"  node {i}: {len(rounds.get(i, ()))} rounds run, {len(skipped.get(i, ()))} with a peer skipped, "
              f"final val loss {losses.get(i, float('nan')):.4f}")
    print(f"  last shards (ckpt merge): {'shared weights identical on all nodes' if same else 'DIFFER: ' + merge.strip()[-300:]}")
    print(f"  faults injected: {len(faults)}")
    for f in faults: print(f"    {f}")
PY
rm -rf "$OUT"/*/merged "$OUT"/*/out/node*/checkpoints
