#!/usr/bin/env bash
# The quality sweep of docs/quality.md (issue 17): the validation-loss gap between SPES (4 nodes)
# and one centralized run at equal tokens, against the tokens each node takes per optimizer step.
# Tokens per node-step grow by gradient accumulation (train.grad_accum A = 1, 4, 16, 64 micro-batches
# of NODE_BATCH sequences); the centralized run takes 4 × NODE_BATCH per micro-batch and the same A,
# so both sides see the same tokens per step and in total. Same STEPS at every point.
#
# Runs, each under OUT/a<A>/<variant>-s<seed>:
#   central   1 node, all experts, run.threads = cores
#   spes      4 nodes, sync every 20 steps (fp32), merge warm-up: alpha 0.05 at every round,
#             decaying to 0 at 40% of the run (SPES.md's alpha0 0.05, T 20k of 50k steps, scaled)
#   nowarmup  spes without the warm-up (merge.alpha 0)
#   int8      spes with int8 deltas (error feedback) for shared parameters and experts
#   h50       spes syncing every 50 steps instead of 20;  h10, h5: every 10 / 5 steps
#   lrhalf    spes with half the config's optim.lr on every node (the nodes' batches are 4x smaller)
#   sparse    spes with sparse deltas: 2% of each chunk of 4096 for experts and shared contributions
#             alike (shared_density 0), 2 bits, each node's weights holding its whole unsent remainder
#             (local_experts, local_shared whole), no decay, averages at 4 x 2% (average_density 0).
#             sync.sparse's defaults since 2026-12-07 are sparse-sh1 (the shared part whole, below)
#   sparse5   the same at 5% (averages 20%);  sparse-4b: at 4 bits;  sparse-d9: decay 0.9 a round
#   sparse-a1 averages published at the contributions' 2%;  sparse-a2: at 2 x 2%;  sparse5-a1,
#             sparse-4b-a1, sparse-d9-a1: sparse5, sparse-4b, sparse-d9 with averages as the contributions
#   sparse-m  1/4 of the shared remainder in the weights (local_shared mean), averages at 8%;
#             sparse-md9, sparse-md95: with decay 0.9, 0.95
#   sparse-ls the shared remainder in the weights, each owner's expert remainder only in its
#             buffer (local_experts off), averages at 8%
#   sparse-le only the experts' remainder in the weights (local_shared off), averages at 2%
#   sparse-b  the remainders only in the buffers (local_* off), averages at 2%;  sparse-bd9: the
#             same with decay 0.9 (SparseLoCo's scheme)
#   sparse-sh1 experts at 2%, the shared contributions and averages whole (sync.sparse.shared_density 1:
#             every value at 2 bits, a least-squares scale per chunk);  sparse1-sh1, sparse5-sh1: experts
#             at 1%, 5%;  sparse-sh1-4b: everything at 4 bits;  sparse-sh1-c1k, sparse-sh1-c256: chunks of
#             1024 / 256 values (sync.sparse.chunk: a scale per chunk, positions of 10 / 8 bits);
#             sparse-sh1-m, sparse-sh1-off: a node's weights keep 1/4 of its shared remainder (local_shared
#             mean) or none of it (off);  sparse-sh1-a4: the averages published at 4 bits
#             (sync.sparse.average_bits);  sparse-sh1-m-a4: both
#   sparse-d0 every tensor sparse, however small (sync.sparse.dense_below 0; the default sends
#             tensors under 4096 values, router and norms here, as int8 deltas)
#   sparse-xe sparse for the experts only (shared parameters int8);  sparse-xs: for the shared only;
#             sparse-xs-d1, sparse-xs-d1-4b: shared at density 1 (every value, 2 or 4 bits), experts int8
#   norobust  spes without the robust expert bound (sync.robust.expert_factor 0; spes has SWEEP_EXPERT_FACTOR)
#   trimmed   spes with the trimmed shared mean (sync.robust.shared trimmed)
#   poisonx   node 3 publishes its experts x1.5 more every round from round 4 (SPES_POISON; a drift),
#             robust bound off;  poisonx-r: the same with the bound on (the default)
#   poisons   node 3 scales its shared contributions x1.5 every round from round 4, plain mean;
#             (round 4: SWEEP_POISON_FROM). Nodes log at debug level: each expert update's size.
#             poisons-r: the same with the trimmed mean
# Order: central and spes at every point (seed 1, small to large), then the variants at the
# points in SWEEP_VARIANT_ACCUMS, then the other seeds. Resumable: a run whose final.json exists
# is skipped, so the sweep can be stopped (Ctrl-C, or SIGTERM to the script) and started again
# across sittings; the run it stopped writes checkpoint shards (every node at its current step;
# on a schedule too: every 5 steps centralized, after every round in SPES) and continues from
# them, exactly (`spes train --resume`, `spes launch-local --resume`). Its wall_s adds the sittings.
#
# Threads: each of the 4 SPES nodes runs on max(1, cores / 4) threads and the centralized run on
# all cores. On a 2-core machine the 4 nodes therefore share 2 cores two by two (each on 1 thread):
# this changes the wall time, never the losses (rounds are in lock-step).
#
# usage: scripts/quality_sweep.sh [STEPS]              (default 100)
#        scripts/quality_sweep.sh --report             (table and plot of what is done, no runs)
#        scripts/quality_sweep.sh --archive            (copy SWEEP_OUT's finished runs into SWEEP_ARCHIVE)
#        scripts/quality_sweep.sh --restore            (SWEEP_ARCHIVE's runs of SWEEP_OUT's folder name back into
#                                                       SWEEP_OUT as final.json, e.g. on a fresh machine: a sweep
#                                                       continued there skips them)
# The report also takes the runs kept in SWEEP_ARCHIVE (a JSON line per run: its final.json plus
# "source", the sweep folder's name), e.g. docs/data/quality-runs.jsonl, the runs behind
# docs/quality.md's curve and plot. A variant's gap is taken against the centralized run of the
# same accum and seed from its own source, else from the first source that has one.
# env:   SWEEP_OUT (runs/quality-sweep), SWEEP_CONFIG (configs/tiny.yaml), SWEEP_NODE_BATCH (8),
#        SWEEP_ACCUMS ("1 4 16 64"), SWEEP_VARIANT_ACCUMS (the largest accum),
#        SWEEP_VARIANTS ("nowarmup int8 h50"), SWEEP_SEEDS ("1 2"),
#        SWEEP_ARCHIVE (none), SWEEP_PLOT_VARIANTS (every variant; e.g. "spes h5 int8"),
#        SWEEP_POISON_FROM (4), SWEEP_EXPERT_FACTOR (2.5), SPES_BIN (./build/spes; a copy, so that rebuilding mid-sweep changes nothing)
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/quality_lib.sh
REPORT_ONLY=0
if [[ ${1:-} == --report ]]; then REPORT_ONLY=1; shift; fi
ARCHIVE_ONLY=0
if [[ ${1:-} == --archive ]]; then ARCHIVE_ONLY=1; REPORT_ONLY=1; shift; fi
RESTORE_ONLY=0
if [[ ${1:-} == --restore ]]; then RESTORE_ONLY=1; REPORT_ONLY=1; shift; fi
STEPS=${1:-100}
OUT=${SWEEP_OUT:-runs/quality-sweep}
CONFIG=${SWEEP_CONFIG:-configs/tiny.yaml}
NODE_BATCH=${SWEEP_NODE_BATCH:-8}
read -r -a ACCUMS <<< "${SWEEP_ACCUMS:-1 4 16 64}"
read -r -a VARIANT_ACCUMS <<< "${SWEEP_VARIANT_ACCUMS:-${ACCUMS[-1]}}"
read -r -a VARIANTS <<< "${SWEEP_VARIANTS:-nowarmup int8 h50}"
read -r -a SEEDS <<< "${SWEEP_SEEDS:-1 2}"
SPES=${SPES_BIN:-./build/spes}
POISON_FROM=${SWEEP_POISON_FROM:-4}
EXPERT_FACTOR=${SWEEP_EXPERT_FACTOR:-2.5}  # sync.robust.expert_factor where the variant does not turn it off
ARCHIVE=${SWEEP_ARCHIVE:-}
PLOT_VARIANTS=${SWEEP_PLOT_VARIANTS:-}
if [[ $ARCHIVE_ONLY == 1 && -z $ARCHIVE ]]; then echo "--archive needs SWEEP_ARCHIVE (the file to copy the runs into)" >&2; exit 2; fi
if [[ $RESTORE_ONLY == 1 && -z $ARCHIVE ]]; then echo "--restore needs SWEEP_ARCHIVE (the file to take the runs from)" >&2; exit 2; fi
if [[ -n $ARCHIVE && $ARCHIVE_ONLY == 0 && ! -f $ARCHIVE ]]; then echo "SWEEP_ARCHIVE: no file $ARCHIVE" >&2; exit 2; fi
CORES=$(nproc)
SEQ_LEN=$(awk '$1 == "seq_len:" {print $2; exit}' "$CONFIG")  # data.seq_len, for tokens per node-step
NODE_THREADS=$(( CORES / 4 > 0 ? CORES / 4 : 1 ))
EVAL_EVERY=$(( STEPS / 4 ))
HORIZON=$(( STEPS * 2 / 5 ))
mkdir -p "$OUT"

# run_one ACCUM VARIANT SEED: trains one run unless it is done; writes its final.json.
run_one() {
  local accum=$1 variant=$2 seed=$3
  local dir=$OUT/a$accum/$variant-s$seed
  [[ -f $dir/final.json ]] && return 0
  # A run stopped midway continues from its shards (centralized: any; SPES: one on every node).
  local resume=0 shards
  if [[ $variant == central ]]; then
    shards=$( (ls -d "$dir"/checkpoints/step-* 2>/dev/null || true) | wc -l)
    [[ $shards -gt 0 ]] && resume=1
  else
    shards=$(for n in 0 1 2 3; do (ls -d "$dir/run/node$n/checkpoints"/step-* 2>/dev/null || true) | head -1; done | wc -l)
    [[ $shards -eq 4 && -f $dir/cluster.yaml ]] && resume=1
  fi
  local before=0
  if [[ $resume == 1 ]]; then
    before=$(cat "$dir.wall_s" 2>/dev/null || echo 0)
  else
    rm -rf "$dir" "$dir.log" "$dir.wall_s"
  fi
  mkdir -p "$(dirname "$dir")"
  local common=(train.steps="$STEPS" train.grad_accum="$accum" run.seed="$seed" train.eval_every="$EVAL_EVERY"
                train.eval_windows=64 schedule.warmup_steps=$(( STEPS / 10 )))
  local t0; t0=$(date +%s)
  # The seconds of this sitting go into DIR.wall_s however it ends (a stop included).
  trap "echo \$(( $before + \$(date +%s) - $t0 )) > '$dir.wall_s'" EXIT
  local metrics batch
  echo "$(date +%T) a$accum $variant seed $seed ...$([[ $resume == 1 ]] && echo " (continuing from its checkpoint shards)")"
  if [[ $variant == central ]]; then
    batch=$(( 4 * NODE_BATCH ))
    local sets=()
    for kv in "${common[@]}"; do sets+=(--set "$kv"); done
    [[ $resume == 1 ]] || : > "$dir.log"
    quality_run_child "$dir.log" "$SPES" train -c "$CONFIG" "${sets[@]}" --set train.batch_size=$batch \
      --set run.threads="$CORES" --set checkpoint.every=5 --set "run.out_dir=$dir" \
      $([[ $resume == 1 ]] && echo --resume)
    metrics=$dir/metrics.jsonl
  else
    batch=$NODE_BATCH
    local every=20 alpha=0.05 encoding=fp32 density=0.02 local_e=true local_s=whole avg=nodes bits=2 decay=1 factor=$EXPERT_FACTOR shared=mean poison="" lr="" enc_e="" enc_s="" dense=4096 shd=0 chunk=4096 avg_bits=0
    case $variant in
      spes) ;;
      norobust) factor=0 ;;
      trimmed) shared=trimmed ;;
      poisonx) poison=experts:1.5@3 factor=0 ;;
      poisonx-r) poison=experts:1.5@3 ;;
      poisons) poison=shared:1.5@3 ;;
      poisons-r) poison=shared:1.5@3 shared=trimmed ;;
      nowarmup) alpha=0 ;;
      int8) encoding=int8_delta ;;
      h50) every=50 ;;
      h10) every=10 ;;
      h5) every=5 ;;
      lrhalf) lr=$(python3 -c "import yaml; print(yaml.safe_load(open('$CONFIG'))['optim']['lr'] / 2)") ;;
      sparse) encoding=sparse ;;
      sparse5) encoding=sparse density=0.05 ;;
      sparse-4b) encoding=sparse bits=4 ;;
      sparse-d9) encoding=sparse decay=0.9 ;;
      sparse-a1) encoding=sparse avg=0.02 ;;
      sparse5-a1) encoding=sparse density=0.05 avg=0.05 ;;
      sparse-4b-a1) encoding=sparse bits=4 avg=0.02 ;;
      sparse-d9-a1) encoding=sparse decay=0.9 avg=0.02 ;;
      sparse-a2) encoding=sparse avg=0.04 ;;
      sparse-m) encoding=sparse local_s=mean avg=0.08 ;;
      sparse-md9) encoding=sparse local_s=mean avg=0.08 decay=0.9 ;;
      sparse-md95) encoding=sparse local_s=mean avg=0.08 decay=0.95 ;;
      sparse-ls) encoding=sparse local_e=false avg=0.08 ;;
      sparse-le) encoding=sparse local_s=off avg=0.02 ;;
      sparse-b) encoding=sparse local_e=false local_s=off avg=0.02 ;;
      sparse-bd9) encoding=sparse local_e=false local_s=off avg=0.02 decay=0.9 ;;
      sparse-d0) encoding=sparse dense=0 ;;
      sparse-xe) encoding=sparse enc_s=int8_delta ;;
      sparse-xs) encoding=sparse enc_e=int8_delta ;;
      sparse-sh1) encoding=sparse shd=1 avg=1 ;;
      sparse1-sh1) encoding=sparse density=0.01 shd=1 avg=1 ;;
      sparse5-sh1) encoding=sparse density=0.05 shd=1 avg=1 ;;
      sparse-sh1-4b) encoding=sparse shd=1 avg=1 bits=4 ;;
      sparse-sh1-c1k) encoding=sparse shd=1 avg=1 chunk=1024 ;;
      sparse-sh1-c256) encoding=sparse shd=1 avg=1 chunk=256 ;;
      sparse-sh1-m) encoding=sparse shd=1 avg=1 local_s=mean ;;
      sparse-sh1-off) encoding=sparse shd=1 avg=1 local_s=off ;;
      sparse-sh1-a4) encoding=sparse shd=1 avg=1 avg_bits=4 ;;
      sparse-sh1-m-a4) encoding=sparse shd=1 avg=1 local_s=mean avg_bits=4 ;;
      sparse-xs-d1) encoding=sparse enc_e=int8_delta density=1 avg=1 ;;
      sparse-xs-d1-4b) encoding=sparse enc_e=int8_delta density=1 avg=1 bits=4 ;;
      *) echo "unknown variant '$variant' (central spes nowarmup int8 h50 h10 h5 lrhalf sparse sparse5 sparse-4b sparse-d9 sparse-a1 sparse-a2 sparse5-a1 sparse-4b-a1 sparse-d9-a1 sparse-m sparse-md9 sparse-md95 sparse-ls sparse-le sparse-b sparse-bd9 sparse-d0 sparse-sh1 sparse1-sh1 sparse5-sh1 sparse-sh1-4b sparse-sh1-c1k sparse-sh1-c256 sparse-sh1-m sparse-sh1-off sparse-sh1-a4 sparse-sh1-m-a4 sparse-xe sparse-xs sparse-xs-d1 sparse-xs-d1-4b norobust" \
              "trimmed poisonx poisonx-r poisons poisons-r)" >&2; exit 2 ;;
    esac
    [[ $avg == nodes ]] && avg=$(python3 -c "print(min(1.0, 4 * $density))")
    local lines="" kv
    for kv in "${common[@]}" train.batch_size="$batch" run.threads="$NODE_THREADS" sync.every="$every" \
              sync.peer_wait_s=120 merge.alpha="$alpha" merge.every="$every" merge.horizon="$HORIZON" \
              sync.encoding.shared="${enc_s:-$encoding}" sync.encoding.experts="${enc_e:-$encoding}" sync.sparse.density="$density" \
              sync.sparse.local_experts="$local_e" sync.sparse.local_shared="$local_s" sync.sparse.average_density="$avg" sync.sparse.bits="$bits" sync.sparse.decay="$decay" sync.sparse.dense_below="$dense" sync.sparse.shared_density="$shd" sync.sparse.chunk="$chunk" sync.sparse.average_bits="$avg_bits" \
              sync.robust.expert_factor="$factor" sync.robust.shared="$shared" run.log_level=debug checkpoint.every="$every" \
              ${lr:+optim.lr=$lr}; do
      lines+="  ${kv%%=*}: ${kv#*=}"$'\n'
    done
    SPES_POISON=$poison SPES_POISON_FROM=$POISON_FROM QUALITY_RESUME=$resume \
      quality_launch "$dir" $(( 7500 + 10 * (RANDOM % 40) )) "$CONFIG" "$lines"
    metrics=$dir/run/node0/metrics.jsonl
    # Exact unless a node was stopped a step short of a round its peers were already in: then it
    # caught up from them after the restart (correct SPES, not the bits of a run never stopped).
    if grep -l "catching up" "$dir"/run/node*/console.log > /dev/null 2>&1; then
      echo "note: a node of $dir caught up from its peers after a restart: the run is not bit-identical to one never stopped"
    fi
  fi
  local val; val=$(quality_final_val "$metrics" "$STEPS")
  local wall=$(( before + $(date +%s) - t0 ))
  trap - EXIT
  rm -f "$dir.wall_s"
  cat > "$dir/final.json" <<JSON
{"accum": $accum, "variant": "$variant", "seed": $seed, "steps": $STEPS, "batch": $batch,
 "node_batch": $NODE_BATCH, "seq_len": $SEQ_LEN, "val_loss": $val, "wall_s": $wall}
JSON
  echo "$(date +%T) a$accum $variant seed $seed: val loss $val ($wall s)"
}

if [[ $REPORT_ONLY == 0 ]]; then
  [[ -x $SPES ]] || { echo "build first: bash scripts/build.sh (or set SPES_BIN)" >&2; exit 2; }
  echo "sweep: $CONFIG, $STEPS steps, node batch $NODE_BATCH, accum ${ACCUMS[*]}, into $OUT"
  echo "threads: $CORES cores; each of 4 nodes on $NODE_THREADS, the centralized run on $CORES"
  first_seed=${SEEDS[0]}
  for a in "${ACCUMS[@]}"; do run_one "$a" central "$first_seed"; run_one "$a" spes "$first_seed"; done
  for a in "${VARIANT_ACCUMS[@]}"; do for v in "${VARIANTS[@]}"; do run_one "$a" "$v" "$first_seed"; done; done
  for s in "${SEEDS[@]:1}"; do
    for a in "${ACCUMS[@]}"; do run_one "$a" central "$s"; run_one "$a" spes "$s"; done
  done
fi

# The report: every run's final validation loss, the gap of each SPES variant to the centralized
# run of the same accum and seed, and the plot (gap % against tokens per node-step, log x).
# With --archive: OUT's runs go into ARCHIVE instead (a run already there, same source, accum,
# variant and seed, is replaced), and nothing is reported. With --restore: ARCHIVE's runs whose
# source is OUT's folder name are written back as OUT's final.json files (none is overwritten).
python3 - "$OUT" "$ARCHIVE" "$ARCHIVE_ONLY" "$PLOT_VARIANTS" "$RESTORE_ONLY" <<'PY'
import glob, json, os, sys
from collections import defaultdict
out, archive, archive_only, plot_variants = sys.argv[1], sys.argv[2], sys.argv[3] == "1", sys.argv[4].split()
restore_only = sys.argv[5] == "1"
source = os.path.basename(os.path.normpath(out))
def key(r):
    return (r["source"], r["accum"], r["variant"], r["seed"])
own = [{"source": source, **json.load(open(p))} for p in sorted(glob.glob(os.path.join(out, "a*", "*", "final.json")))]
kept = []
if archive and os.path.exists(archive):
    with open(archive) as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                r = json.loads(line)
                key(r), float(r["val_loss"]), int(r["node_batch"]), int(r["seq_len"]), r["wall_s"]
            except (ValueError, KeyError, TypeError) as e:
                sys.exit(f"{archive}:{n}: not a run record ({type(e).__name__}: {e})")
            kept.append(r)
mine = {key(r) for r in own}
if restore_only:
    restored = there = 0
    for r in kept:
        if r["source"] != source:
            continue
        path = os.path.join(out, f"a{r['accum']}", f"{r['variant']}-s{r['seed']}", "final.json")
        if os.path.exists(path):
            there += 1
            continue
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            f.write(json.dumps({k: v for k, v in r.items() if k != "source"}) + "\n")
        restored += 1
    print(f"{out}: {restored} run(s) of {source} restored from {archive}" + (f", {there} already there" if there else ""))
    sys.exit(0)
runs = [r for r in kept if key(r) not in mine] + own
if archive_only:
    os.makedirs(os.path.dirname(archive) or ".", exist_ok=True)
    with open(archive, "w") as f:
        for r in runs:
            f.write(json.dumps(r) + "\n")
    print(f"{archive}: {len(own)} run(s) of {source} copied, {len(runs)} in all")
    sys.exit(0)
if not runs:
    sys.exit(f"no finished runs in {out}" + (f" or {archive}" if archive else ""))
central, central_any = {}, {}
for r in runs:
    if r["variant"] == "central":
        central[(r["source"], r["accum"], r["seed"])] = r["val_loss"]
        central_any.setdefault((r["accum"], r["seed"]), r["val_loss"])
def central_of(r):
    return central.get((r["source"], r["accum"], r["seed"]), central_any.get((r["accum"], r["seed"])))
def tokens(r):
    return r["node_batch"] * r["accum"] * r["seq_len"]
print(f"{'accum':>5} {'tok/node-step':>13} {'variant':>9} {'seed':>4} {'val loss':>9} {'central':>9} {'gap':>8} {'wall s':>7}  source")
gaps = defaultdict(lambda: defaultdict(list))
for r in sorted(runs, key=lambda r: (r["accum"], r["variant"] != "central", r["variant"], r["seed"], r["source"])):
    c = central_of(r)
    gap = ""
    if r["variant"] != "central" and c is not None:
        g = 100 * (r["val_loss"] - c) / c
        gaps[r["variant"]][tokens(r)].append(g)
        gap = f"{g:+.2f}%"
    print(f"{r['accum']:>5} {tokens(r):>13} {r['variant']:>9} {r['seed']:>4} {r['val_loss']:>9.4f} "
          f"{(f'{c:.4f}' if c is not None else '-'):>9} {gap:>8} {r['wall_s']:>7}  {r['source']}")
print("\nmean gap per point (seeds averaged; ± half the spread when there are two or more):")
with open(os.path.join(out, "gaps.tsv"), "w") as f:
    for v in sorted(gaps):
        plotted = not plot_variants or v in plot_variants
        for t in sorted(gaps[v]):
            g = gaps[v][t]
            m = sum(g) / len(g)
            half = (max(g) - min(g)) / 2
            print(f"  {v:>9} {t:>8} tokens/node-step: {m:+.2f}%" + (f" ± {half:.2f} ({len(g)} seeds)" if len(g) > 1 else ""))
            if plotted:
                f.write(f"{v}\t{t}\t{m}\t{half}\n")
        if plotted:
            f.write("\n\n")
print(f"table: {os.path.join(out, 'gaps.tsv')}")
PY
[[ $ARCHIVE_ONLY == 1 || $RESTORE_ONLY == 1 ]] && exit 0
variants=$(awk -F'\t' 'NF {print $1}' "$OUT/gaps.tsv" | uniq | tr '\n' ' ')
plot=""; i=0
for v in $variants; do
  plot+="${plot:+, }'$OUT/gaps.tsv' index $i using 2:3:4 with yerrorlines lw 2 pt 7 title '$v'"
  i=$(( i + 1 ))
done
if [[ -z $plot ]]; then
  echo "no plot: no variant has its centralized run (same accum and seed) in $OUT yet"
  exit 0
fi
gnuplot <<GP
set terminal pngcairo size 900,560 font ",11"
set output '$OUT/quality-vs-batch.png'
set logscale x 2
set xlabel 'tokens per node-step (node batch × grad accum × seq len)'
set ylabel 'validation loss gap to centralized (%)'
set title 'SPES (4 nodes) vs centralized at equal tokens — $(basename "$CONFIG" .yaml), $STEPS steps'
set grid
set offsets graph 0.04, graph 0.04, graph 0.05, graph 0.05
set key top right
plot $plot, 3 with lines dt 2 lc rgb '#888888' title '3% target'
GP
echo "plot: $OUT/quality-vs-batch.png"
