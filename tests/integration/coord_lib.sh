# Coordinated 3-node runs of the tiny config on loopback, for the integration scripts (source it
# after lib.sh, with SPES, SRC and DATA set).

# write_cluster NAME STEPS [EXTRA_SET_LINES]: a 3-node cluster file for the tiny config in $TMP/NAME
# (ROUND_TIMEOUT_S: sync.round_timeout_s, default 60; CLUSTER_SECURITY: the tls/insecure line,
# default insecure: true).
write_cluster() {
  local name=$1 steps=$2 extra=${3:-}
  read -r -a ports <<< "$(free_ports 4)"
  mkdir -p "$TMP/$name"
  cat > "$TMP/$name/cluster.yaml" <<YAML
run: test-$name
config: $SRC/configs/tiny.yaml
out_dir: $TMP/$name/run
token_file: $TMP/$name/token
${CLUSTER_SECURITY:-insecure: true}
assignment: round_robin
set:
  data.dir: $DATA/tiny
  train.steps: $steps
  train.eval_every: 0
  train.log_every: 10
  sync.every: 10
  sync.peer_wait_s: 2
  sync.round_timeout_s: ${ROUND_TIMEOUT_S:-60}
  sync.retry_backoff_s: 0.1
  sync.dump_dir: $TMP/$name/dump
  merge.every: 20
  merge.horizon: 100
$extra
coordinator: {address: '127.0.0.1:${ports[0]}', heartbeat_s: 0.3, dead_after_s: 1.5, grace_s: 1}
nodes:
  - {id: 0, address: '127.0.0.1:${ports[1]}'}
  - {id: 1, address: '127.0.0.1:${ports[2]}'}
  - {id: 2, address: '127.0.0.1:${ports[3]}'}
YAML
}

# start_cluster NAME [FAILPOINT0 FAILPOINT1 FAILPOINT2]: plans $TMP/NAME's cluster, serves its
# coordinator (--exit-when-done; log $TMP/NAME/${COORD_LOG:-coord.log}) and starts its 3 nodes (logs
# node<i>.log), node i with SPES_FAILPOINT=FAILPOINTi. Sets coord and node_pid[0..2].
start_cluster() {
  local name=$1 fps=("${2:-}" "${3:-}" "${4:-}") i
  "$SPES" coordinator plan --cluster "$TMP/$name/cluster.yaml" --out "$TMP/$name/plan" > "$TMP/$name/plan.log" 2>&1 ||
    fail "$name: plan"
  "$SPES" coordinator serve --cluster "$TMP/$name/cluster.yaml" --exit-when-done > "$TMP/$name/${COORD_LOG:-coord.log}" 2>&1 &
  coord=$!; pids+=($coord)
  node_pid=()
  for i in 0 1 2; do
    SPES_FAILPOINT=${fps[$i]} "$SPES" node -c "$TMP/$name/plan/node$i.yaml" > "$TMP/$name/node$i.log" 2>&1 &
    node_pid[$i]=$!; pids+=($!)
  done
}

wait_for() {  # wait_for FILE PATTERN [tenths]
  for _ in $(seq 1 "${3:-600}"); do
    grep -q "$2" "$1" 2>/dev/null && return 0
    sleep 0.1
  done
  return 1
}

# same_last_round NAME: the three nodes' parameter dumps after their last round are byte-identical.
same_last_round() {
  local d=$TMP/$1/dump last
  last=$(ls "$d/node0" | sed -n 's/round\([0-9]*\)_post.safetensors/\1/p' | sort -n | tail -1)
  [[ -n "$last" ]] && cmp -s "$d/node0/round${last}_post.safetensors" "$d/node1/round${last}_post.safetensors" &&
    cmp -s "$d/node0/round${last}_post.safetensors" "$d/node2/round${last}_post.safetensors"
}
