#!/usr/bin/env bash
# `spes launch-local` on a terminal: a tmux pane (its own tmux server, killed at the end) runs a
# coordinator and two nodes of the tiny config; two captures of the pane a few seconds apart must
# each show one progress block — one line per node and the cluster totals, redrawn in place, not
# scrolled — with the nodes' steps advancing between them.
# usage: live_view.sh SPES SOURCE_DIR TEST_DATA_DIR
set -uo pipefail
SPES=$1
SRC=$2
DATA=$3
source "$(dirname "$0")/lib.sh"
if ! command -v tmux > /dev/null; then echo "FAIL tmux is not installed (scripts/setup.sh)"; exit 1; fi

read -r -a ports <<< "$(free_ports 3)"
cat > "$TMP/cluster.yaml" <<YAML
run: live-view-test
config: $SRC/configs/tiny.yaml
out_dir: $TMP/run
token_file: $TMP/token
insecure: true
set: {data.dir: $DATA/tiny, train.steps: 3000, train.eval_every: 0, sync.every: 20, merge.alpha: 0}
coordinator: {address: '127.0.0.1:${ports[0]}', heartbeat_s: 0.3}
nodes:
  - {id: 0, address: '127.0.0.1:${ports[1]}'}
  - {id: 1, address: '127.0.0.1:${ports[2]}'}
YAML
sock=spes-live-$$
tmux_() { tmux -L "$sock" "$@"; }
trap 'tmux_ kill-server 2>/dev/null; cleanup' EXIT
tmux_ new-session -d -x 160 -y 40 "TERM=xterm $SPES launch-local $TMP/cluster.yaml --no-plot; sleep 60"
pids+=($(tmux_ display-message -p '#{pane_pid}'))

# block: the pane's node lines and totals line.
capture() { tmux_ capture-pane -p -S -200; }
step_of() { grep "node $1 |" <<< "$2" | grep -o "step *[0-9]*" | grep -o "[0-9]*"; }
for _ in $(seq 1 120); do
  first=$(capture)
  [[ $(step_of 0 "$first") -gt 0 && $(step_of 1 "$first") -gt 0 ]] 2>/dev/null && break
  sleep 0.5
done
sleep 3
second=$(capture)
for pane in "$first" "$second"; do
  n0=$(grep -c "node 0 |" <<< "$pane"); n1=$(grep -c "node 1 |" <<< "$pane"); tot=$(grep -c "cluster |" <<< "$pane")
  [[ $n0 -eq 1 && $n1 -eq 1 && $tot -eq 1 ]] || fail "pane shows $n0 node-0 lines, $n1 node-1 lines, $tot totals lines (want 1 each):
$pane"
done
s1=$(step_of 0 "$first"); s2=$(step_of 0 "$second")
[[ -n $s1 && -n $s2 && $s2 -gt $s1 ]] && echo "ok   one block redrawn in place: node 0 went from step $s1 to $s2, one line per node" ||
  fail "node 0's step did not advance in place ($s1 → $s2)"
grep -q "2 of 2 nodes training" <<< "$second" && echo "ok   cluster totals line: 2 of 2 nodes training" || fail "no totals line: $second"
tmux_ send-keys C-c
for _ in $(seq 1 100); do pgrep -f -- "$TMP/cluster.yaml" > /dev/null || break; sleep 0.2; done
[[ -z $(pgrep -f -- "$TMP/run") ]] && echo "ok   Ctrl-C in the pane stopped the cluster" || fail "processes left: $(pgrep -fa -- "$TMP/run")"
[[ $failures -eq 0 ]] && echo "live_view: all passed" || { echo "live_view: $failures failure(s)"; exit 1; }
