# Two network namespaces joined by a veth pair, for the link scripts (link_bench.sh, net_faults.sh).
# Source it, set NETNS_PREFIX, then:
#   netns_up RATE_MBIT   namespaces ${NS[0]} ${NS[1]} with addresses ${IP[0]} ${IP[1]}, the veth
#                        capped with tc tbf at RATE Mbit/s in each direction
#   netns_delay_proxies DELAY_MS LOGDIR
#                        scripts/delay_proxy.py on ${IP[i]}:7401 in front of each node's service on
#                        :7400 (DELAY_MS each way; this kernel has no netem); peers dial :7401
#   netns_down           kills the processes in ${pids[@]} (by id) and deletes the namespaces
# Needs root (ip netns, tc).
NS=("${NETNS_PREFIX:-spes_ns}0" "${NETNS_PREFIX:-spes_ns}1")
IP=(10.77.0.1 10.77.0.2)
pids=()

netns_down() {
  for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  for ns in "${NS[@]}"; do ip netns del "$ns" 2>/dev/null || true; done
}

netns_up() {
  local rate=$1 i
  [[ $(id -u) -eq 0 ]] || { echo "$(basename "$0") needs root for ip netns and tc" >&2; exit 2; }
  for i in 0 1; do ip netns add "${NS[$i]}"; done
  ip link add "${NS[0]}v" type veth peer name "${NS[1]}v"
  for i in 0 1; do
    ip link set "${NS[$i]}v" netns "${NS[$i]}"
    ip -n "${NS[$i]}" addr add "${IP[$i]}/24" dev "${NS[$i]}v"
    ip -n "${NS[$i]}" link set "${NS[$i]}v" up
    ip -n "${NS[$i]}" link set lo up
    # Egress shaping on both ends: RATE in each direction of the full-duplex link.
    ip netns exec "${NS[$i]}" tc qdisc add dev "${NS[$i]}v" root tbf rate "${rate}mbit" burst 64kb latency 50ms
  done
}

netns_delay_proxies() {
  local delay=$1 logdir=$2 i
  for i in 0 1; do
    ip netns exec "${NS[$i]}" python3 scripts/delay_proxy.py "${IP[$i]}:7401" "127.0.0.1:7400" "$delay" \
      > "$logdir/proxy$i.log" 2>&1 &
    pids+=($!)
  done
}
