# Shared by scripts/quality_experiment.sh and scripts/quality_sweep.sh (sourced, not run).
#
# quality_launch DIR PORT CONFIG SET_LINES
#   Runs 4 SPES nodes and a coordinator on 127.0.0.1 (ports PORT..PORT+4) with `spes launch-local`,
#   training CONFIG with the config overrides SET_LINES ("  key: value" lines); the cluster file,
#   the log (DIR.log) and the run (DIR/run) go under DIR. Needs $SPES (the binary).
quality_launch() {
  local dir=$1 port=$2 config=$3 set_lines=$4
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
  "$SPES" launch-local "$dir/cluster.yaml" --refresh 60 --no-plot > "$dir.log" 2>&1
}

# quality_final_val METRICS.jsonl: prints the last validation loss the run recorded.
quality_final_val() {
  python3 - "$1" <<'PY'
import json, sys
last = None
for line in open(sys.argv[1]):
    r = json.loads(line)
    if r.get("type") == "eval":
        last = r["val_loss"]
if last is None:
    sys.exit(f"{sys.argv[1]}: no validation loss recorded")
print(f"{last:.6f}")
PY
}
