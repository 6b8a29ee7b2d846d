#!/usr/bin/env bash
# Sets up, builds and runs the whole test suite (what CI runs), then prints the slowest tests
# and the suite's wall time, then fuzzes each parser briefly (scripts/fuzz.sh; SPES_FUZZ_SECONDS,
# default 15 per target, 0 = skip).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/build.sh
cd build
start=$(date +%s)
status=0
ctest --output-on-failure -j 2 --timeout 900 | tee ctest.log || status=$?
# "  12/114 Test  #12: name ....   Passed    1.23 sec" → the slowest, longest first.
echo
echo "slowest tests (of $(grep -c ' Test *#' ctest.log || true)):"
# awk, not head, takes the first 15: it reads to the end, so sort never dies of SIGPIPE (which
# pipefail turned into a failed CI run once every test had passed).
sed -n 's/^ *[0-9]*\/[0-9]* Test *#[0-9]*: \([^ ]*\) .* \([0-9.]*\) sec$/\2 \1/p' ctest.log | sort -rn |
  awk 'NR <= 15 {printf "  %8.2f s  %s\n", $1, $2}'
echo "test suite wall time: $(( $(date +%s) - start )) s"
cd ..
fuzz_seconds=${SPES_FUZZ_SECONDS:-15}
if [[ $fuzz_seconds -gt 0 ]]; then
  echo
  bash scripts/fuzz.sh "$fuzz_seconds" || status=1
fi
exit $status
