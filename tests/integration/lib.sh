# Shared by the integration scripts (source it after `set -uo pipefail`): a temporary folder,
# process bookkeeping that kills every started process on exit, failure counting and free ports.
#   pids+=($!)   after starting a background process
#   fail MSG     counts a failure;  KEEP_TMP=1 keeps $TMP for a look afterwards
TMP=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null; done
  wait 2>/dev/null
  [[ -n "${KEEP_TMP:-}" ]] && echo "kept $TMP" || rm -rf "$TMP"
}
trap cleanup EXIT
export OPENBLAS_NUM_THREADS=1  # several processes share two cores
failures=0
fail() { echo "FAIL $*"; failures=$((failures + 1)); }

# free_ports N: N free TCP ports on 127.0.0.1.
free_ports() {
  python3 - "$1" <<'PY'
import socket, sys
socks = []
for _ in range(int(sys.argv[1])):
    s = socket.socket(); s.bind(("127.0.0.1", 0)); socks.append(s)
print(" ".join(str(s.getsockname()[1]) for s in socks))
PY
}
