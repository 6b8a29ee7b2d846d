#!/usr/bin/env bash
# Several ranks per node (`spes node --nproc-per-node 2`, Gloo on the CPU), as separate processes:
#   A. 2 nodes x 2 ranks, 3 rounds: after every round all four ranks hold bit-identical weights;
#      A2 the same with overlapped rounds (sync.overlap), compared after every landing;
#   B. one rank killed (SIGKILL): its node stops within seconds with a message naming the rank,
#      no rank left running; `--resume` continues from the last shard and finishes;
#   C. SIGTERM to a node: its ranks stop after the same step, rank 0 writes a shard, exit 0;
#   D. bad input: nccl without a GPU, a cuda:N device with 2 ranks, `spes train` with ranks.
# usage: node_ranks.sh SPES SOURCE_DIR TEST_DATA_DIR
set -uo pipefail
SPES=$1
SRC=$2
DATA=$3
source "$(dirname "$0")/lib.sh"

TINY=$SRC/configs/tiny.yaml
COMMON=(--set "data.dir=$DATA/tiny" --set train.eval_every=0 --set train.log_every=10
        --set sync.insecure=true --set sync.token=test-token --set sync.round_timeout_s=60
        --set sync.retry_backoff_s=0.1 --nproc-per-node 2)

# peers N: a sync.peers list of N nodes on free ports.
peers() {
  local ports p="[" i
  read -r -a ports <<< "$(free_ports "$1")"
  for ((i = 0; i < $1; i++)); do p+="{id: $i, address: '127.0.0.1:${ports[$i]}'},"; done
  echo "${p%,}]"
}
# left_running DIR: processes whose command line names DIR (a node's ranks).
left_running() { pgrep -f -- "$1" | tr '\n' ' '; }
# wait_for FILE SECONDS
wait_for() { for _ in $(seq 1 $(($2 * 10))); do [[ -e $1 ]] && return 0; sleep 0.1; done; return 1; }

# ---- A: 2 nodes x 2 ranks (A2: with overlapped rounds, the ranks re-share at each landing) ----
# two_by_two NAME LABEL [extra --set args...]
two_by_two() {
  local name=$1 label=$2 i r f identical=0
  shift 2
  local P
  P=$(peers 2)
  for i in 0 1; do
    "$SPES" node -c "$TINY" "${COMMON[@]}" --set train.steps=30 --set sync.every=10 --set "sync.peers=$P" \
      --set run.node_id=$i --set "run.out_dir=$TMP/$name/node$i" --set "sync.dump_dir=$TMP/$name/dump" "$@" \
      > "$TMP/$name$i.log" 2>&1 &
    pids+=($!)
    a_pids[$i]=$!
  done
  for i in 0 1; do wait "${a_pids[$i]}" || { fail "$label: node $i exited $?"; tail -5 "$TMP/$name$i.log"; }; done
  # Overlapped rounds land on each node's own progress: the nodes agree only after the last one
  # (which lands at once), a node's ranks after every one.
  local across="1 2 3"
  [[ $label == A2 ]] && across=3
  for r in 1 2 3; do
    for f in node0/rank1 node1/rank0 node1/rank1; do
      local ref=node0/rank0
      [[ " $across " == *" $r "* ]] || ref=${f%/*}/rank0
      [[ $ref == "$f" ]] && { identical=$((identical + 1)); continue; }
      if cmp -s "$TMP/$name/dump/${ref}_round$r.safetensors" "$TMP/$name/dump/${f}_round$r.safetensors"; then
        identical=$((identical + 1))
      else fail "$label: round $r: $f differs from $ref"; fi
    done
  done
  [[ $identical -eq 9 ]] && echo "ok   $label: 2 nodes x 2 ranks, 3 rounds: ranks bit-identical after every round (nodes too after rounds $across)"
  grep -q "2 ranks, gloo process group" "$TMP/$name/node0/node.log" || fail "$label: node0 did not run 2 gloo ranks"
  [[ -z $(left_running "$TMP/$name/") ]] || fail "$label: processes left: $(left_running "$TMP/$name/")"
}
two_by_two a A
two_by_two a2 A2 --set sync.overlap=true --set sync.max_delay=3

# ---- B: a rank killed, the node stops, --resume finishes ----
P=$(peers 1)
B=(-c "$TINY" "${COMMON[@]}" --set train.steps=150 --set sync.every=10 --set "sync.peers=$P"
   --set checkpoint.every=10 --set "run.out_dir=$TMP/b")
"$SPES" node "${B[@]}" > "$TMP/b1.log" 2>&1 &
node=$!
pids+=($node)
if wait_for "$TMP/b/checkpoints/step-00000020/manifest.json" 120; then
  rank1=$(pgrep -P "$node" | sort -n | tail -1)  # ranks start in order: the newest child is rank 1
  pids+=($(pgrep -P "$node"))
  kill -9 "$rank1"
  start=$(date +%s)
  wait "$node"
  rc=$?
  took=$(($(date +%s) - start))
  [[ $rc -ne 0 ]] || fail "B: node exited 0 after its rank 1 was killed"
  [[ $took -le 20 ]] || fail "B: the node took ${took} s to stop"
  grep -q "rank 1 (pid $rank1) was killed by signal 9" "$TMP/b1.log" || { fail "B: no message naming rank 1"; tail -5 "$TMP/b1.log"; }
  sleep 0.5
  [[ -z $(left_running "$TMP/b") ]] || fail "B: processes left: $(left_running "$TMP/b")"
  echo "ok   B: rank 1 killed: node stopped in ${took} s (exit $rc), message names the rank, nothing left running"
  "$SPES" node "${B[@]}" --resume > "$TMP/b2.log" 2>&1 &
  pids+=($!)
  if wait $!; then
    grep -q "resumed from" "$TMP/b/node.log" && grep -q "step   150/150" "$TMP/b/node.log" &&
      echo "ok   B: --resume continued from the last shard to step 150" || fail "B: resume did not reach step 150"
  else fail "B: resumed node exited $?"; tail -5 "$TMP/b2.log"; fi
else
  fail "B: no step-20 shard"; tail -5 "$TMP/b1.log"
fi

# ---- C: SIGTERM: the ranks agree on a step, rank 0 writes a shard ----
P=$(peers 1)
"$SPES" node -c "$TINY" "${COMMON[@]}" --set train.steps=2000 --set sync.every=10 --set "sync.peers=$P" \
  --set "run.out_dir=$TMP/c" --set checkpoint.every=10 > "$TMP/c.log" 2>&1 &
node=$!
pids+=($node)
if wait_for "$TMP/c/checkpoints/step-00000010/manifest.json" 120; then
  pids+=($(pgrep -P "$node"))
  kill -TERM "$node"
  wait "$node"
  rc=$?
  shard=$(grep -o "wrote [^ ]*step-[0-9]*" "$TMP/c/node.log" | tail -1)
  [[ $rc -eq 0 && -n $shard ]] && echo "ok   C: SIGTERM: exit 0, ${shard}" || { fail "C: exit $rc, shard '$shard'"; tail -5 "$TMP/c.log"; }
  [[ -z $(left_running "$TMP/c") ]] || fail "C: processes left: $(left_running "$TMP/c")"
else
  fail "C: no step-10 shard"; tail -5 "$TMP/c.log"
fi

# ---- D: bad input ----
expect_error() {  # expect_error NAME PATTERN command...
  local name=$1 pattern=$2
  shift 2
  out=$("$@" 2>&1)
  rc=$?
  [[ $rc -ne 0 ]] && grep -q -- "$pattern" <<< "$out" && echo "ok   D: $name" || fail "D: $name (exit $rc): $out"
}
P=$(peers 1)
D=(-c "$TINY" "${COMMON[@]}" --set train.steps=5 --set sync.every=5 --set "sync.peers=$P" --set "run.out_dir=$TMP/d")
expect_error "nccl on the CPU" "node.backend" "$SPES" node "${D[@]}" --set node.backend=nccl --set train.device=cpu
expect_error "cuda:1 with 2 ranks" "train.device" "$SPES" node "${D[@]}" --set train.device=cuda:1
expect_error "spes train with 2 ranks" "node.ranks" "$SPES" train -c "$TINY" --set "data.dir=$DATA/tiny" --set node.ranks=2
expect_error "timeout below the round timeout" "node.timeout_s" "$SPES" node "${D[@]}" --set node.timeout_s=30
[[ -z $(left_running "$TMP/d") ]] || fail "D: processes left: $(left_running "$TMP/d")"

[[ $failures -eq 0 ]] && echo "node_ranks: all passed" || { echo "node_ranks: $failures failure(s)"; exit 1; }
