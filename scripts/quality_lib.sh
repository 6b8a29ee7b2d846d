# Shared by scripts/quality_experiment.sh and scripts/quality_sweep.sh (sourced, not run).
#
# quality_launch DIR PORT CONFIG SET_LINES
#   Runs 4 SPES nodes and a coordinator on 127.0.0.1 (ports PORT..PORT+4) with `spes launch-local`,
#   training CONFIG with the config overrides SET_LINES ("  key: value" lines); the cluster file,
#   the log (DIR.log) and the run (DIR/run) go under DIR. Needs $SPES (the binary).
#   With QUALITY_RESUME=1: continues the stopped run in DIR (its cluster file, `launch-local --resume`).
#   launch-local runs in the background: SIGINT/SIGTERM to the script stop it (every node writes a
#   shard) and end the script with 130.
quality_launch() {
  local dir=$1 port=$2 config=$3 set_lines=$4
  if [[ ${QUALITY_RESUME:-0} == 1 ]]; then
    quality_run_child "$dir.log" "$SPES" launch-local "$dir/cluster.yaml" --resume --refresh 60 --no-plot --stop-timeout 300
    return
  fi
  mkdir -p "$dir"
  cat > "$dir/cluster.yaml" <<YAML
run: quality-$(basename "$dir")
config: $config
out_dir: $dir/run
token_file: $dir/token
insecure: true
assignment: contiguous
set:
$set_lines
  sync.deadline_factor: 0   # the fixed sync.round_timeout_s: a node slowed by other work on this machine is waited for, never skipped
coordinator: {address: 127.0.0.1:$port, heartbeat_s: 2, dead_after_s: 60, grace_s: 60}
nodes:
  - {id: 0, address: 127.0.0.1:$((port + 1))}
  - {id: 1, address: 127.0.0.1:$((port + 2))}
  - {id: 2, address: 127.0.0.1:$((port + 3))}
  - {id: 3, address: 127.0.0.1:$((port + 4))}
YAML
  : > "$dir.log"
  quality_run_child "$dir.log" "$SPES" launch-local "$dir/cluster.yaml" --refresh 60 --no-plot --stop-timeout 300
}

# quality_run_child LOG COMMAND...: runs COMMAND (output appended to LOG) in the background and
# waits for it; a SIGINT/SIGTERM to the script is passed on as SIGTERM (spes train and launch-local
# then write checkpoint shards and exit), and the script exits 130 once the command has.
quality_run_child() {
  local log=$1
  shift
  "$@" >> "$log" 2>&1 &
  local child=$!
  trap 'echo "stopping (pid $child: shards are written; run the sweep again to continue)"; kill -TERM $child 2>/dev/null; wait $child || true; exit 130' INT TERM
  local rc=0
  wait "$child" || rc=$?
  trap - INT TERM
  return "$rc"
}

# quality_final_val METRICS.jsonl [STEPS]: prints the last validation loss the run recorded; with
# STEPS, fails unless that evaluation is at step STEPS (the run finished).
quality_final_val() {
  python3 - "$1" "${2:-}" <<'PY'
import json, sys
last = None
for line in open(sys.argv[1]):
    r = json.loads(line)
    if r.get("type") == "eval":
        last = r
if last is None:
    sys.exit(f"{sys.argv[1]}: no validation loss recorded")
if sys.argv[2] and last["step"] != int(sys.argv[2]):
    sys.exit(f"{sys.argv[1]}: the last validation loss is at step {last['step']}, not {sys.argv[2]}: the run did not finish")
print(f"{last['val_loss']:.6f}")
PY
}
