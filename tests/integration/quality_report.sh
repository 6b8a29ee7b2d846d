#!/usr/bin/env bash
# scripts/quality_sweep.sh's report as docs/quality.md uses it, on runs made up here (no training):
#   A. runs of a sweep folder and of an archive together: each variant's gap against the
#      centralized run of its own source, else of the first source with one; means over seeds;
#   B. --archive copies a folder's runs into the archive, replacing the ones it already holds;
#      B2: --restore writes an archive's runs of a folder back into it, overwriting none;
#   C. bad input: a malformed archive line and --archive without SWEEP_ARCHIVE are refused;
#   D. (with SPES and TEST_DATA_DIR) a real 40-step sweep, the script stopped (SIGTERM) in its
#      centralized run and again in its SPES run, then run again: both continue from their shards
#      and end with the validation losses of a sweep never stopped; no final.json for a stopped run.
# usage: quality_report.sh SOURCE_DIR [SPES TEST_DATA_DIR]
set -uo pipefail
SRC=$1
SPES=${2:-}
DATA=${3:-}
source "$(dirname "$0")/lib.sh"
SWEEP=$SRC/scripts/quality_sweep.sh

# run_json DIR ACCUM VARIANT SEED VAL: a finished run's final.json, as the sweep writes it.
run_json() {
  mkdir -p "$1/a$2/$3-s$4"
  printf '{"accum": %s, "variant": "%s", "seed": %s, "steps": 100, "batch": 8, "node_batch": 8, "seq_len": 64, "val_loss": %s, "wall_s": 1}\n' \
    "$2" "$3" "$4" "$5" > "$1/a$2/$3-s$4/final.json"
}
line() { printf '{"source": "%s", "accum": %s, "variant": "%s", "seed": %s, "steps": 100, "batch": 8, "node_batch": 8, "seq_len": 64, "val_loss": %s, "wall_s": 1}\n' "$@"; }

# The archive: an old sweep with its own centrals at accum 4, and a remedies sweep with its own
# central for seed 1 only.
{
  line old 4 central 1 4.0
  line old 4 central 2 5.0
  line old 4 spes 1 4.4
  line old 4 spes 2 5.25
  line rem 4 central 1 2.0
  line rem 4 h5 1 2.1
  line rem 4 h5 2 5.5
} > "$TMP/archive.jsonl"
# The sweep folder: a new point (accum 16), and a rerun of old's spes seed 1 under the folder's own name.
NEW=$TMP/old
run_json "$NEW" 16 central 1 3.0
run_json "$NEW" 16 spes 1 3.3
run_json "$NEW" 4 spes 1 4.2

# ---- A: the report over both ----
out=$(SWEEP_OUT=$NEW SWEEP_ARCHIVE=$TMP/archive.jsonl bash "$SWEEP" --report 2>&1) || fail "A: report failed: $out"
gap() { awk -F'\t' -v v="$1" -v t="$2" '$1 == v && $2 == t {printf "%.4f %.4f", $3, $4}' "$NEW/gaps.tsv"; }
# old's spes seed 1 is the folder's rerun (4.2, not 4.4): +5% and +5% -> mean 5, spread 0
[[ $(gap spes 2048) == "5.0000 0.0000" ]] || fail "A: spes at 2048 is '$(gap spes 2048)', expected 5 ± 0"
[[ $(gap spes 8192) == "10.0000 0.0000" ]] || fail "A: spes at 8192 is '$(gap spes 8192)', expected 10"
# h5 seed 1 against rem's own central (+5%), seed 2 against old's (rem has none): +10% -> 7.5 ± 2.5
[[ $(gap h5 2048) == "7.5000 2.5000" ]] || fail "A: h5 at 2048 is '$(gap h5 2048)', expected 7.5 ± 2.5"
grep -q "h5 *2048 tokens/node-step: +7.50% ± 2.50 (2 seeds)" <<< "$out" || fail "A: the mean line for h5: $out"
[[ -s $NEW/quality-vs-batch.png ]] || fail "A: no plot"
out=$(SWEEP_OUT=$NEW SWEEP_ARCHIVE=$TMP/archive.jsonl SWEEP_PLOT_VARIANTS=spes bash "$SWEEP" --report 2>&1) ||
  fail "A: report with SWEEP_PLOT_VARIANTS failed: $out"
[[ -z $(gap h5 2048) && -n $(gap spes 2048) ]] || fail "A: SWEEP_PLOT_VARIANTS=spes still plots h5"

# ---- B: --archive ----
cp "$TMP/archive.jsonl" "$TMP/copy.jsonl"
out=$(SWEEP_OUT=$NEW SWEEP_ARCHIVE=$TMP/copy.jsonl bash "$SWEEP" --archive 2>&1) || fail "B: --archive failed: $out"
[[ $(wc -l < "$TMP/copy.jsonl") == 9 ]] || fail "B: the archive has $(wc -l < "$TMP/copy.jsonl") runs, expected 7 - 1 + 3"
grep -c '"source": "old", "accum": 4, "variant": "spes", "seed": 1,' "$TMP/copy.jsonl" | grep -qx 1 ||
  fail "B: old's spes seed 1 is not there once"
grep -q '"variant": "spes", "seed": 1, .*"val_loss": 4.2' "$TMP/copy.jsonl" || fail "B: the rerun did not replace the archived run"
out=$(SWEEP_OUT=$TMP/none SWEEP_ARCHIVE=$TMP/copy.jsonl bash "$SWEEP" --report 2>&1) || fail "B: report from the archive alone: $out"
grep -q "spes *8192 tokens/node-step: +10.00%" <<< "$out" || fail "B: the archived folder's runs are not in the report: $out"

# ---- B2: --restore puts an archive's runs of a folder back (none overwritten) ----
run_json "$TMP/back/rem" 4 h5 1 9.9
out=$(SWEEP_OUT=$TMP/back/rem SWEEP_ARCHIVE=$TMP/archive.jsonl bash "$SWEEP" --restore 2>&1) || fail "B2: --restore failed: $out"
grep -q "2 run(s) of rem restored from $TMP/archive.jsonl, 1 already there" <<< "$out" || fail "B2: --restore said: $out"
grep -q '"val_loss": 2.0' "$TMP/back/rem/a4/central-s1/final.json" 2>/dev/null || fail "B2: rem's central run was not restored"
grep -q source "$TMP/back/rem/a4/central-s1/final.json" && fail "B2: the restored final.json keeps the archive's source"
grep -q '"val_loss": 9.9' "$TMP/back/rem/a4/h5-s1/final.json" || fail "B2: --restore overwrote a run already there"
[[ -e $TMP/back/rem/a4/h5-s2 ]] || fail "B2: rem's h5 seed 2 was not restored"

# ---- C: bad input ----
echo '{"source": "x", "accum": 4}' >> "$TMP/copy.jsonl"
out=$(SWEEP_OUT=$TMP/none SWEEP_ARCHIVE=$TMP/copy.jsonl bash "$SWEEP" --report 2>&1) && fail "C: a malformed line was accepted"
grep -q "copy.jsonl:10: not a run record" <<< "$out" || fail "C: the error does not name the file and line: $out"
out=$(SWEEP_OUT=$NEW bash "$SWEEP" --archive 2>&1) && fail "C: --archive without SWEEP_ARCHIVE was accepted"
grep -q "needs SWEEP_ARCHIVE" <<< "$out" || fail "C: unclear error: $out"
out=$(SWEEP_OUT=$NEW SWEEP_ARCHIVE=$TMP/missing.jsonl bash "$SWEEP" --report 2>&1) && fail "C: a missing archive was accepted"
grep -q "no file" <<< "$out" || fail "C: unclear error for a missing archive: $out"

# ---- D: a sweep stopped in each run and continued ----
if [[ -n $SPES ]]; then
  sed "s#^\( *dir:\).*#\1 $DATA/tiny#" "$SRC/configs/tiny.yaml" > "$TMP/tiny.yaml"
  grep -q "dir: $DATA/tiny" "$TMP/tiny.yaml" || fail "D: could not point the config at the test data"
  # The 40-step sweep of one point (accum 1, seed 1): SWEEP_OUT=OUT bash "$SWEEP" 40 >> OUT.log
  export SPES_BIN=$SPES SWEEP_CONFIG=$TMP/tiny.yaml SWEEP_ACCUMS=1 SWEEP_VARIANT_ACCUMS=" " SWEEP_SEEDS=1
  SWEEP_OUT=$TMP/ref bash "$SWEEP" 40 >> "$TMP/ref.log" 2>&1 || fail "D: the sweep never stopped failed: $(tail -3 "$TMP/ref.log")"
  for run in central spes; do
    metrics=$TMP/cut/a1/central-s1/metrics.jsonl
    [[ $run == spes ]] && metrics=$TMP/cut/a1/spes-s1/run/node0/metrics.jsonl
    SWEEP_OUT=$TMP/cut bash "$SWEEP" 40 >> "$TMP/cut.log" 2>&1 &
    pid=$!
    pids+=("$pid")
    for _ in $(seq 1 1500); do grep -q '"step":12,' "$metrics" 2>/dev/null && break; sleep 0.2; done
    kill -TERM "$pid"
    wait "$pid"; rc=$?
    [[ $rc -eq 130 ]] || fail "D: the sweep stopped in its $run run exited $rc: $(tail -3 "$TMP/cut.log")"
    [[ -f $TMP/cut/a1/$run-s1/final.json ]] && fail "D: the stopped $run run has a final.json"
    [[ -s $TMP/cut/a1/$run-s1.wall_s ]] || fail "D: the stopped $run run kept no wall_s"
  done
  SWEEP_OUT=$TMP/cut bash "$SWEEP" 40 >> "$TMP/cut.log" 2>&1 || fail "D: the continued sweep failed: $(tail -3 "$TMP/cut.log")"
  grep -q "a1 spes seed 1 ... (continuing from its checkpoint shards)" "$TMP/cut.log" || fail "D: the SPES run did not continue"
  for run in central spes; do
    want=$(grep -o '"val_loss": [0-9.]*' "$TMP/ref/a1/$run-s1/final.json")
    got=$(grep -o '"val_loss": [0-9.]*' "$TMP/cut/a1/$run-s1/final.json" 2>/dev/null)
    [[ -n $want && $got == "$want" ]] || fail "D: the $run run stopped and continued ends with '$got', never stopped '$want'"
  done
  [[ $failures == 0 ]] && echo "ok   D: a sweep stopped in each run continues from the shards to the same validation losses"
fi

[[ $failures == 0 ]] && echo "quality_report: all checks passed"
exit $(( failures > 0 ))
