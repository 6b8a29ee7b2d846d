#!/usr/bin/env bash
# Watching a run as an operator does: `spes launch-local` runs a coordinator and two nodes (tiny
# config) with metrics and the live page on loopback.
#   Prometheus: Debian's `prometheus` server, started here with a generated config, scrapes all three
#   every second; queries through its HTTP API must return the nodes' training and sync series and
#   the coordinator's per-node series, with sane values.
#   The live page: refused without the run token; headless Chromium (Debian's chromium) loads it with
#   the token and the rendered page shows both nodes alive and a loss curve for each.
# usage: metrics_scrape.sh SPES SOURCE_DIR TEST_DATA_DIR
set -uo pipefail
SPES=$1
SRC=$2
DATA=$3
source "$(dirname "$0")/lib.sh"
if ! command -v prometheus > /dev/null; then echo "FAIL prometheus is not installed (scripts/setup.sh)"; exit 1; fi

read -r -a ports <<< "$(free_ports 8)"  # coordinator, 2 sync, coordinator metrics, 2 node metrics, prometheus, page
mkdir -p "$TMP/run"
cat > "$TMP/cluster.yaml" <<YAML
run: metrics-test
config: $SRC/configs/tiny.yaml
out_dir: $TMP/run
token_file: $TMP/token
insecure: true
set:
  data.dir: $DATA/tiny
  train.steps: 3000
  train.eval_every: 0
  train.log_every: 50
  sync.every: 10
  sync.round_timeout_s: 60
  merge.alpha: 0
coordinator: {address: '127.0.0.1:${ports[0]}', heartbeat_s: 0.3, metrics: '127.0.0.1:${ports[3]}', http: '127.0.0.1:${ports[7]}'}
nodes:
  - {id: 0, address: '127.0.0.1:${ports[1]}', metrics: '127.0.0.1:${ports[4]}'}
  - {id: 1, address: '127.0.0.1:${ports[2]}', metrics: '127.0.0.1:${ports[5]}'}
YAML
"$SPES" launch-local "$TMP/cluster.yaml" --refresh 60 --no-plot > "$TMP/launch.log" 2>&1 &
launch=$!
pids+=($launch)

cat > "$TMP/prometheus.yml" <<YAML
global: {scrape_interval: 1s, scrape_timeout: 900ms}
scrape_configs:
  - job_name: spes
    static_configs:
      - targets: ['127.0.0.1:${ports[3]}', '127.0.0.1:${ports[4]}', '127.0.0.1:${ports[5]}']
YAML
prometheus --config.file="$TMP/prometheus.yml" --storage.tsdb.path="$TMP/tsdb" \
  --web.listen-address="127.0.0.1:${ports[6]}" > "$TMP/prometheus.log" 2>&1 &
pids+=($!)

# query EXPR: the result vector of an instant query, one "labels value" line per series.
query() {
  curl -s --max-time 5 "http://127.0.0.1:${ports[6]}/api/v1/query" --data-urlencode "query=$1" | python3 -c '
import json, sys
try:
    data = json.load(sys.stdin)["data"]["result"]
except Exception:
    sys.exit(0)
for r in data:
    labels = ",".join(f"{k}={v}" for k, v in sorted(r["metric"].items()) if k not in ("job", "instance"))
    print(labels, r["value"][1])'
}
# wait_series EXPR N: until EXPR returns N series (60 s at most); prints them.
wait_series() {
  local out
  for _ in $(seq 1 120); do
    out=$(query "$1")
    [[ $(grep -c . <<< "$out") -ge $2 ]] && { echo "$out"; return 0; }
    sleep 0.5
  done
  echo "$out"
  return 1
}

if out=$(wait_series 'up{job="spes"} == 1' 3); then echo "ok   prometheus scrapes all three daemons"; else fail "up: $out"; tail -3 "$TMP/prometheus.log"; fi
if out=$(wait_series 'spes_sync_rounds_total > 0' 2); then
  echo "ok   rounds counted on both nodes: $(tr '\n' ';' <<< "$out")"
else fail "spes_sync_rounds_total: $out"; tail -5 "$TMP/launch.log"; fi
out=$(query 'spes_train_step > 0')
[[ $(grep -c "node=" <<< "$out") -eq 2 ]] && echo "ok   spes_train_step of nodes 0 and 1: $(tr '\n' ';' <<< "$out")" || fail "spes_train_step: $out"
out=$(query 'spes_train_loss > 0 and spes_train_loss < 20')
[[ $(grep -c . <<< "$out") -eq 2 ]] && echo "ok   spes_train_loss finite and sane on both nodes" || fail "spes_train_loss: $out"
out=$(wait_series 'rate(spes_train_tokens_total[10s]) > 0' 2) && echo "ok   tokens counter rising on both nodes" || fail "tokens rate: $out"
out=$(query 'spes_sync_received_bytes_total > 0')
grep -q "node=0,peer=1" <<< "$out" && grep -q "node=1,peer=0" <<< "$out" &&
  echo "ok   sync bytes per peer: $(tr '\n' ';' <<< "$out")" || fail "spes_sync_received_bytes_total: $out"
out=$(query 'spes_sync_received_bytes_by_encoding_total{encoding="fp32"} > 0')
[[ $(grep -c . <<< "$out") -eq 2 ]] && echo "ok   bytes by encoding (fp32) on both nodes" || fail "bytes by encoding: $out"
out=$(query 'spes_sync_sent_bytes_by_encoding_total{encoding="fp32"} > 0')
[[ $(grep -c . <<< "$out") -eq 2 ]] && echo "ok   bytes sent by encoding (fp32) on both nodes" || fail "bytes sent by encoding: $out"
out=$(query 'spes_node_step')  # from the coordinator, one series per node
[[ $(grep -c "node=" <<< "$out") -eq 2 ]] && echo "ok   coordinator reports both nodes' steps" || fail "spes_node_step: $out"
out=$(query 'spes_coordinator_nodes{state="alive"}')
[[ $(awk '{print $2}' <<< "$out") == 2 ]] && echo "ok   coordinator: 2 nodes alive" || fail "spes_coordinator_nodes: $out"
text=$(curl -s --max-time 5 "http://127.0.0.1:${ports[4]}/metrics")
grep -q "^# TYPE spes_train_tokens_total counter" <<< "$text" && grep -q 'spes_train_step{node="0",run="metrics-test"}' <<< "$text" &&
  echo "ok   text format: counter types and the run/node labels" || fail "text format: $(head -5 <<< "$text")"

# The Grafana dashboard uses only metrics that exist: every name in its queries is in the
# documented tables, and those seen in this run are in Prometheus now.
missing=$(python3 - "$SRC/docs/grafana-dashboard.json" "$SRC/docs/operations.md" <<'PY'
import json, re, sys
dash = json.load(open(sys.argv[1]))
names = {n for p in dash["panels"] for t in p["targets"] for n in re.findall(r"\bspes_[a-z_]+", t["expr"])}
doc = open(sys.argv[2]).read()
print(" ".join(sorted(n for n in names if f"`{n}" not in doc)))
PY
)
[[ -z $missing ]] && echo "ok   every metric the Grafana dashboard queries is documented" || fail "dashboard metrics not in docs/operations.md: $missing"
for m in spes_train_loss spes_train_tokens_per_second spes_sync_round_duration_seconds spes_train_mfu_ratio \
         spes_process_resident_memory_peak_bytes spes_coordinator_nodes spes_sync_round_seconds_total; do
  [[ -n $(query "$m") ]] || fail "dashboard metric $m has no series"
done

# ---- the live page ----
page="http://127.0.0.1:${ports[7]}"
code=$(curl -s -o /dev/null -w "%{http_code}" "$page/api/status")
[[ $code == 401 ]] && echo "ok   page: /api/status without the token refused (401)" || fail "page without token: HTTP $code"
code=$(curl -s -o /dev/null -w "%{http_code}" "$page/?token=wrong")
[[ $code == 401 ]] && echo "ok   page: a wrong token refused (401)" || fail "page with a wrong token: HTTP $code"
if command -v chromium > /dev/null; then
  dom=$(timeout 60 chromium --headless --no-sandbox --disable-gpu --user-data-dir="$TMP/chromium" \
        --virtual-time-budget=5000 --dump-dom "$page/?token=$(cat "$TMP/token")" 2>/dev/null)
  rows=$(grep -o 'id="node-[01]"' <<< "$dom" | sort -u | wc -l)
  alive=$(grep -o '<td class="l alive">alive' <<< "$dom" | wc -l)
  curves=$(grep -o '<polyline[^>]*data-node="[01]"' <<< "$dom" | wc -l)
  [[ $rows -eq 2 && $alive -eq 2 && $curves -eq 2 ]] && echo "ok   page in headless Chromium: 2 nodes alive, 2 loss curves" ||
    fail "page in Chromium: $rows rows, $alive alive, $curves curves: $(grep -o 'id="summary"[^<]*<[^<]*' <<< "$dom")"
else
  fail "chromium is not installed (scripts/setup.sh)"
fi

kill -INT "$launch"
wait "$launch" 2>/dev/null
# Not a terminal: progress blocks as plain lines, no cursor movement.
grep -q $'\x1b\[' "$TMP/launch.log" && fail "launch-local wrote terminal control codes into a file" ||
  echo "ok   launch-local into a file: plain lines, no control codes"
[[ $failures -eq 0 ]] && echo "metrics_scrape: all passed" || { echo "metrics_scrape: $failures failure(s)"; exit 1; }
