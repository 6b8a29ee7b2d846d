#!/usr/bin/env bash
# Fuzzes the parsers that read what users and peers hand a node — the config loader, the
# safetensors reader, the token shard reader, the sync payload decoder and the checkpoint
# manifest reader — with libFuzzer and
# AddressSanitizer (clang, a second build in build-fuzz with -DSPES_FUZZ=ON: no torch). For each
# target: its seeds (valid inputs from spes's own writers), every saved regression input
# (tests/fuzz/regressions/NAME/, run once each), then SECONDS of fuzzing. Stops at the first
# crash, leaving the input in build-fuzz/crashes/NAME/ (copy it to the regressions folder once fixed).
# usage: scripts/fuzz.sh [SECONDS]   (default 30 per target)
set -euo pipefail
cd "$(dirname "$0")/.."
SECONDS_EACH=${1:-30}
BUILD=${SPES_FUZZ_BUILD:-build-fuzz}
TARGETS=(config safetensors token_shard sync_payload checkpoint_manifest)
command -v clang++ > /dev/null || { echo "fuzz: clang++ is missing (scripts/setup.sh installs it)" >&2; exit 2; }
if [[ ! -f $BUILD/build.ninja ]]; then
  CXX=clang++ cmake -S . -B "$BUILD" -G Ninja -DSPES_FUZZ=ON -DCMAKE_BUILD_TYPE=RelWithDebInfo > /dev/null
fi
cmake --build "$BUILD" -j2 --target "${TARGETS[@]/#/fuzz_}" | grep -v "^\[" || true
for name in "${TARGETS[@]}"; do
  bin=$BUILD/tests/fuzz/fuzz_$name
  seeds=$BUILD/seeds/$name corpus=$BUILD/corpus/$name crashes=$BUILD/crashes/$name
  rm -rf "$seeds" && mkdir -p "$corpus" "$crashes"
  SPES_FUZZ_SEEDS=$seeds "$bin"
  shopt -s nullglob
  regressions=(tests/fuzz/regressions/$name/*)
  shopt -u nullglob
  if [[ ${#regressions[@]} -gt 0 ]]; then
    "$bin" -timeout=10 "${regressions[@]}" > "$BUILD/$name.regressions.log" 2>&1 ||
      { tail -30 "$BUILD/$name.regressions.log"; echo "fuzz_$name: a saved regression input fails" >&2; exit 1; }
  fi
  if ! "$bin" -max_total_time="$SECONDS_EACH" -timeout=10 -rss_limit_mb=2048 -artifact_prefix="$crashes/" \
       "$corpus" "$seeds" > "$BUILD/$name.log" 2>&1; then
    tail -40 "$BUILD/$name.log"
    echo "fuzz_$name: crash; input in $crashes/" >&2
    exit 1
  fi
  runs=$(grep -o "Done [0-9]* runs" "$BUILD/$name.log" | awk '{print $2}')
  echo "fuzz_$name: ${runs:-?} inputs in ${SECONDS_EACH} s, corpus $(ls "$corpus" | wc -l) inputs, ${#regressions[@]} regression input(s), no crash"
done
