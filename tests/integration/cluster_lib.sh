# Multi-process SPES runs of the tiny config on loopback, for the integration scripts:
#   source "$(dirname "$0")/cluster_lib.sh" SPES SYNC_CHECK SOURCE_DIR TEST_DATA_DIR
# sets SPES, CHECK, SRC, DATA, sources lib.sh, and sets TINY (the config) and COMMON (--set
# arguments for every node; add to it as needed).
SPES=$1
CHECK=$2
SRC=$3
DATA=$4
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
TINY=$SRC/configs/tiny.yaml
COMMON=(--set "data.dir=$DATA/tiny" --set train.eval_every=0 --set train.log_every=10
        --set sync.insecure=true --set sync.token=test-token --set sync.round_timeout_s=60
        --set sync.retry_backoff_s=0.1)

# start_cluster NAME N STEPS EVERY [extra --set args...]: starts N nodes in the background.
start_cluster() {
  local name=$1 n=$2 steps=$3 every=$4
  shift 4
  read -r -a ports <<< "$(free_ports "$n")"
  local peers="[" i
  for ((i = 0; i < n; i++)); do peers+="{id: $i, address: '127.0.0.1:${ports[$i]}'},"; done
  peers="${peers%,}]"
  mkdir -p "$TMP/$name"
  node_pids=()
  for ((i = 0; i < n; i++)); do
    "$SPES" node -c "$TINY" "${COMMON[@]}" --set train.steps="$steps" --set sync.every="$every" \
      --set "sync.peers=$peers" --set run.node_id=$i --set "run.out_dir=$TMP/$name/node$i" \
      --set "sync.dump_dir=$TMP/$name/dump" "$@" > "$TMP/$name/node$i.log" 2>&1 &
    pids+=($!)
    node_pids+=($!)
  done
}

# wait_cluster NAME: waits for the nodes started last; fails on a non-zero exit.
wait_cluster() {
  local name=$1 i=0 rc
  for p in "${node_pids[@]}"; do
    wait "$p"
    rc=$?
    if [[ $rc -ne 0 && " ${expect_dead:-} " != *" $i "* ]]; then
      fail "$name: node $i exited $rc"
      tail -5 "$TMP/$name/node$i.log"
    fi
    i=$((i + 1))
  done
}

# wait_log FILE PATTERN: polls FILE until it has a line matching PATTERN (at most 30 s).
wait_log() {
  for _ in $(seq 1 1500); do
    grep -q "$2" "$1" 2>/dev/null && return 0
    sleep 0.02
  done
  return 1
}

final_loss() { grep -o "final validation loss [0-9.]*" "$1" | awk '{print $4}'; }
