#!/usr/bin/env bash
# Plots the training and validation loss of one or more metrics.jsonl files to a PNG.
# usage: scripts/plot_loss.sh METRICS.jsonl [MORE.jsonl ...] OUT.png
set -euo pipefail
if [[ $# -lt 2 ]]; then
  echo "usage: $0 METRICS.jsonl [MORE.jsonl ...] OUT.png" >&2
  exit 2
fi
out=${!#}
inputs=("${@:1:$#-1}")
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# One colour per file (validation solid, training the same colour, faint).
colors=(1b9e77 d95f02 7570b3 e7298a 66a61e e6ab02 a6761d 666666)
plot=""
for i in "${!inputs[@]}"; do
  f=${inputs[$i]}
  [[ -f "$f" ]] || { echo "plot_loss: no such file: $f" >&2; exit 2; }
  label=$(basename "$(dirname "$f")")
  python3 - "$f" "$tmp/train$i.tsv" "$tmp/val$i.tsv" <<'PY'
import json, sys
src, train, val = sys.argv[1:4]
with open(src) as f, open(train, "w") as t, open(val, "w") as v:
    for line in f:
        line = line.strip()
        if not line:
            continue
        r = json.loads(line)
        if r.get("type") == "train":
            t.write(f"{r['step']}\t{r['ce']}\n")
        elif r.get("type") == "eval":
            v.write(f"{r['step']}\t{r['val_loss']}\n")
PY
  c=${colors[$((i % ${#colors[@]}))]}
  plot+="'$tmp/train$i.tsv' using 1:2 with lines lw 1 lc rgb '#A0$c' title '$label train CE', "
  if [[ -s "$tmp/val$i.tsv" ]]; then
    plot+="'$tmp/val$i.tsv' using 1:2 with linespoints lw 2 pt 7 lc rgb '#$c' title '$label validation', "
  fi
done
gnuplot <<GP
set terminal pngcairo size 1000,600 enhanced font 'sans,11'
set output '$out'
set xlabel 'step'
set ylabel 'loss (nats/token)'
set grid
set key top right
plot ${plot%, }
GP
echo "wrote $out"
