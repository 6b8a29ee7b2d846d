#!/usr/bin/env bash
# A node stopped or killed in each phase of its work (issue 18), with the coordinator and 3 nodes
# of the tiny config on loopback. For each phase — mid-step (gradients computed, optimizer not yet
# stepped), serving a round's stream to a peer, pulling one from a peer, writing a checkpoint shard
# — node 1 gets SIGTERM and node 2 SIGKILL while each is held at that point (SPES_FAILPOINT,
# include/spes/util/failpoint.h). Then:
#   - node 1 exits 0, leaves no bound port and a newest shard that verifies (`ckpt inspect`);
#   - node 2's unfinished shard (checkpoint phase) is never taken: it resumes from the shard before
#     and the unfinished folder is removed;
#   - node 0 carries on alone past the round deadline; both restart with --resume, rejoin, catch
#     up, and all three finish with identical weights after the last round;
#   - (stuck) a node restarting while a member is stuck, then dies, retries its catch-up with a new plan.
# usage: phase_faults.sh SPES SOURCE_DIR TEST_DATA_DIR [PHASE...]   (default: all five)
set -uo pipefail
SPES=$1
SRC=$2
DATA=$3
shift 3
PHASES=("$@")
[[ ${#PHASES[@]} -gt 0 ]] || PHASES=(step serve pull checkpoint stuck)
source "$(dirname "$0")/lib.sh"
source "$(dirname "$0")/coord_lib.sh"
cd "$SRC" || exit 2

# The failpoint per phase: which hit of the point holds (past the step-10 shard, so there is one
# to resume from), held long enough for the signal.
declare -A POINT=([step]="step@25" [serve]="serve@10" [pull]="pull@10" [checkpoint]="checkpoint@2")

port_of() { grep -o "id: $2, address: '[0-9.:]*" "$TMP/$1/cluster.yaml" | grep -o "[0-9]*$"; }
newest_shard() { ls -d "$TMP/$1/run/node$2/checkpoints"/step-* 2>/dev/null | tail -1; }

for phase in "${PHASES[@]}"; do
  [[ $phase == stuck ]] && continue
  name=$phase
  failures_before=$failures
  [[ -n ${POINT[$phase]:-} ]] || { fail "unknown phase '$phase'"; continue; }
  # The round timeout also bounds how long node 1 waits on SIGTERM for its peers to fetch its last
  # round (node 2 is dead by then): at 20 s node 0 had finished its 300 steps but ~1 s before
  # node 1 rejoined, and under load it finished first (the catch-up then has no member to ask).
  ROUND_TIMEOUT_S=10 write_cluster "$name" 300 "  checkpoint.every: 10
  checkpoint.keep: 5
  sync.min_round_timeout_s: 3"
  echo secret > "$TMP/$name/token"
  start_cluster "$name" "" "${POINT[$phase]}:60" "${POINT[$phase]}:60"
  point=${POINT[$phase]%@*}
  wait_for "$TMP/$name/node2.log" "failpoint $point reached" 1200 || fail "$name: node 2 never reached failpoint $point"
  kill -9 "${node_pid[2]}"; wait "${node_pid[2]}" 2>/dev/null
  wait_for "$TMP/$name/node1.log" "failpoint $point reached" 1200 || fail "$name: node 1 never reached failpoint $point"
  kill -TERM "${node_pid[1]}"
  # SIGTERM: exit 0 within a minute, port free, a shard that verifies.
  for _ in $(seq 1 600); do kill -0 "${node_pid[1]}" 2>/dev/null || break; sleep 0.1; done
  if kill -0 "${node_pid[1]}" 2>/dev/null; then
    fail "$name: node 1 still running a minute after SIGTERM"; kill -9 "${node_pid[1]}"
  fi
  wait "${node_pid[1]}"; rc=$?
  [[ $rc -eq 0 ]] || { fail "$name: node 1 exited $rc after SIGTERM"; tail -3 "$TMP/$name/node1.log"; }
  ss -ltn | grep -q ":$(port_of "$name" 1) " && fail "$name: node 1's port is still bound after it exited"
  shard=$(newest_shard "$name" 1)
  grep -q "stopped by signal 15.*wrote $shard" "$TMP/$name/node1.log" || fail "$name: node 1 did not write its shard on SIGTERM"
  "$SPES" ckpt inspect "$shard" > "$TMP/$name/inspect1.log" 2>&1 || fail "$name: node 1's shard $shard does not verify"
  # SIGKILL while writing a shard: only a hidden temporary folder, never a step-N one.
  if [[ $phase == checkpoint ]]; then
    ls -a "$TMP/$name/run/node2/checkpoints" | grep -q '^\.step-00000020\.tmp-' || fail "$name: no unfinished shard left to test"
    [[ -e $TMP/$name/run/node2/checkpoints/step-00000020 ]] && fail "$name: a half-written shard has a shard's name"
  fi
  expected=$(basename "$(newest_shard "$name" 2)")
  for i in 1 2; do
    "$SPES" node -c "$TMP/$name/plan/node$i.yaml" --resume > "$TMP/$name/node$i-back.log" 2>&1 &
    node_pid[$i]=$!; pids+=($!)
  done
  for i in 0 1 2; do wait "${node_pid[$i]}" || fail "$name: node $i exited $? (after the restart for 1, 2)"; done
  wait "$coord" || fail "$name: coordinator exited $?"
  grep -q "resumed from .*/$expected " "$TMP/$name/node2-back.log" || fail "$name: node 2 did not resume from $expected"
  [[ $phase == checkpoint ]] && { grep -q "removed .*\.step-00000020\.tmp-.*killed before it finished" "$TMP/$name/node2-back.log" ||
    fail "$name: the unfinished shard was not removed"; }
  grep -q "resumed from .*/$(basename "$shard") " "$TMP/$name/node1-back.log" || fail "$name: node 1 did not resume from its SIGTERM shard"
  for i in 1 2; do
    grep -q "caught up at round" "$TMP/$name/node$i-back.log" || fail "$name: node $i did not catch up"
    grep -q "node $i done" "$TMP/$name/node$i-back.log" || fail "$name: node $i did not finish"
  done
  grep -q "node 0 done" "$TMP/$name/node0.log" || fail "$name: node 0 did not finish"
  same_last_round "$name" || fail "$name: weights differ after the last round"
  [[ $failures -eq $failures_before ]] &&
    echo "ok   $name: SIGTERM → exit 0, port free, shard verifies; SIGKILL → resumed from $expected; both rejoined; identical weights"
done

# A node restarting while a member it would catch up from is stuck (held at a failpoint, its
# heartbeats still going) and then killed: its plan names that member, so the first catch-up
# fails; the node joins again, gets a plan without the dead member and catches up from node 0.
# (With one try it used to exit 6: the CI failure of issue 21.)
if [[ " ${PHASES[*]} " == *" stuck "* ]]; then
  name=stuck
  failures_before=$failures
  ROUND_TIMEOUT_S=8 write_cluster "$name" 300 "  checkpoint.every: 10
  sync.min_round_timeout_s: 3"
  echo secret > "$TMP/$name/token"
  start_cluster "$name" "" "" "step@35:120"
  wait_for "$TMP/$name/node1.log" "sync  round   2" 1200 || fail "$name: node 1 never reached round 2"
  kill -TERM "${node_pid[1]}"
  wait "${node_pid[1]}" || fail "$name: node 1 exited $? after SIGTERM"
  wait_for "$TMP/$name/node2.log" "failpoint step reached" 1200 || fail "$name: node 2 never reached its failpoint"
  "$SPES" node -c "$TMP/$name/plan/node1.yaml" --resume > "$TMP/$name/node1-back.log" 2>&1 &
  node_pid[1]=$!; pids+=($!)
  wait_for "$TMP/$name/node1-back.log" "catching up: waiting for round" 1200 || fail "$name: node 1 did not rejoin"
  kill -9 "${node_pid[2]}"; wait "${node_pid[2]}" 2>/dev/null
  for i in 0 1; do wait "${node_pid[$i]}" || fail "$name: node $i exited $?"; done
  wait "$coord" || fail "$name: coordinator exited $?"
  grep -q "failed (attempt 1 of 3).*node 2: .*joining again for a newer plan" "$TMP/$name/node1-back.log" ||
    fail "$name: node 1's first catch-up did not fail on node 2 (the case is not tested)"
  grep -q "caught up at round" "$TMP/$name/node1-back.log" && grep -q "node 1 done" "$TMP/$name/node1-back.log" ||
    fail "$name: node 1 did not catch up and finish"
  last=$(ls "$TMP/$name/dump/node0" | sed -n 's/round\([0-9]*\)_post.safetensors/\1/p' | sort -n | tail -1)
  cmp -s "$TMP/$name/dump/node0/round${last}_post.safetensors" "$TMP/$name/dump/node1/round${last}_post.safetensors" ||
    fail "$name: nodes 0 and 1 differ after the last round"
  [[ $failures -eq $failures_before ]] &&
    echo "ok   $name: catch-up from a member that died failed, joined again, caught up from node 0; 0 and 1 identical"
fi

if [[ $failures -ne 0 ]]; then
  for f in "$TMP"/*/node*.log; do echo "== $f"; tail -4 "$f"; done
  echo "$failures failure(s)"
  exit 1
fi
echo "all phase fault checks passed"
