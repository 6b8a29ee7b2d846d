#!/usr/bin/env bash
# Models leaving and entering spes, as a user runs it (tiny config):
#   A. export a trained shard as a Hugging Face OLMoE folder: an independent numpy reading of the
#      folder (scripts/hf_reference.py, the transformers semantics) gives the loss `spes eval`
#      gives; import → export again is byte-identical;
#   B. the same for per-head QK-norm with grouped-query attention (Qwen3-MoE layout);
#   C. upcycle a dense (1-expert) model with no noise: the same validation loss as the dense one;
#      training starts from the upcycled folder, and from a Hugging Face folder;
#   D. generate: the same text under the same seed, with and without the KV cache;
#   E. bad input: clear messages and exit codes;
#   F. the exports of A and B loaded by Hugging Face transformers (OlmoeForCausalLM,
#      Qwen3MoeForCausalLM, installed by scripts/setup.sh): its loss equals `spes eval`'s (relative
#      difference <= 1e-4) and its logits the numpy reference's.
# usage: model_tools.sh SPES SOURCE_DIR TEST_DATA_DIR
set -uo pipefail
SPES=$1
SRC=$2
DATA=$3
source "$(dirname "$0")/lib.sh"

TINY=$SRC/configs/tiny.yaml
VAL=$DATA/tiny/val.bin
PY=/usr/bin/python3
[[ -x $PY ]] || PY=python3
COMMON=(--set "data.dir=$DATA/tiny" --set train.eval_every=0 --set train.log_every=10)

# train NAME STEPS [--set ...]: a short run that leaves its last step's shard.
train() {
  local name=$1 steps=$2
  shift 2
  "$SPES" train -c "$TINY" "${COMMON[@]}" --set "run.out_dir=$TMP/$name" --set train.steps="$steps" \
    --set checkpoint.every="$steps" "$@" > "$TMP/$name.log" 2>&1 || fail "$name: training failed"
  printf '%s/%s/checkpoints/step-%08d' "$TMP" "$name" "$steps"
}
eval_loss() { "$SPES" eval "$1" --data "$VAL" --seq-len 64 --batch-size 2 --windows 2 | grep -o "loss [0-9.]*" | awk '{print $2}'; }
ref_loss() { "$PY" "$SRC/scripts/hf_reference.py" "$1" "$VAL" --seq-len 64 --windows 2 | awk '{print $2}'; }
close() { "$PY" -c "import sys; a, b = float(sys.argv[1]), float(sys.argv[2]); sys.exit(abs(a - b) > $3 * max(1, abs(a)))" "$1" "$2"; }

# ---- A: OLMoE export against the reference, import round trip ----
shard=$(train olmoe 30)
"$SPES" ckpt export "$shard" "$TMP/hf" > "$TMP/a.log" 2>&1 || fail "A: export failed"
grep -q "as olmoe: 69 tensors" "$TMP/a.log" || fail "A: export report"
for f in config.json model.safetensors tokenizer.model tokenizer_config.json generation_config.json; do
  [[ -f $TMP/hf/$f ]] || fail "A: export lacks $f"
done
grep -q '"model_type": "olmoe"' "$TMP/hf/config.json" || fail "A: config.json is not olmoe"
ours=$(eval_loss "$TMP/hf") theirs=$(ref_loss "$TMP/hf")
close "$ours" "$theirs" 1e-4 || fail "A: spes eval $ours vs the reference $theirs"
[[ $(eval_loss "$shard") == "$ours" ]] || fail "A: the shard and its export evaluate differently"
"$SPES" ckpt import "$TMP/hf" -o "$TMP/imported" > /dev/null 2>&1 || fail "A: import failed"
"$SPES" ckpt export "$TMP/imported" "$TMP/hf2" > /dev/null 2>&1 || fail "A: re-export failed"
cmp -s "$TMP/hf/model.safetensors" "$TMP/hf2/model.safetensors" || fail "A: export → import → export changed bytes"
cmp -s "$TMP/hf/config.json" "$TMP/hf2/config.json" || fail "A: config.json changed in the round trip"
[[ $failures -eq 0 ]] && echo "ok   A: OLMoE export: spes eval $ours = reference $theirs; round trip byte-identical"

# ---- B: Qwen3-MoE layout (per-head QK-norm, 2 KV heads) ----
shard=$(train qwen 10 --set model.qk_norm=per_head --set model.n_kv_heads=2 --set model.norm_topk_prob=true)
"$SPES" ckpt export "$shard" "$TMP/qwen_hf" --no-tokenizer > /dev/null 2>&1 || fail "B: export failed"
grep -q '"model_type": "qwen3_moe"' "$TMP/qwen_hf/config.json" || fail "B: config.json is not qwen3_moe"
ours=$(eval_loss "$TMP/qwen_hf") theirs=$(ref_loss "$TMP/qwen_hf")
close "$ours" "$theirs" 1e-4 || fail "B: spes eval $ours vs the reference $theirs"
[[ $failures -eq 0 ]] && echo "ok   B: Qwen3-MoE export: spes eval $ours = reference $theirs"

# ---- C: upcycle a dense model ----
dense=$(train dense 30 --set model.n_experts=1 --set model.top_k=1)
"$SPES" ckpt upcycle "$dense" -o "$TMP/moe" --experts 8 --top-k 2 --noise-std 0 > "$TMP/c.log" 2>&1 ||
  fail "C: upcycle failed"
d=$(eval_loss "$dense") m=$(eval_loss "$TMP/moe")
close "$d" "$m" 1e-5 || fail "C: dense loss $d, upcycled $m"
"$SPES" ckpt upcycle "$dense" -o "$TMP/moe_noisy" --experts 8 --top-k 2 > /dev/null 2>&1 || fail "C: noisy upcycle failed"
[[ $(eval_loss "$TMP/moe_noisy") != "$m" ]] || fail "C: noise changed nothing"
"$SPES" train -c "$TINY" "${COMMON[@]}" --set "run.out_dir=$TMP/from_moe" --set train.steps=10 \
  --set model.norm_topk_prob=true --set "checkpoint.resume=$TMP/moe_noisy" > "$TMP/c_train.log" 2>&1 ||
  fail "C: training from the upcycled model failed"
grep -q "resumed from .*moe_noisy at step 0 (sync round 0, upcycled folder)" "$TMP/c_train.log" || fail "C: no resume line"
"$SPES" train -c "$TINY" "${COMMON[@]}" --set "run.out_dir=$TMP/from_hf" --set train.steps=4 \
  --set "checkpoint.resume=$TMP/hf" > "$TMP/c_hf.log" 2>&1 || fail "C: training from the Hugging Face folder failed"
grep -q "resumed from .*hf at step 0 (sync round 0, imported folder)" "$TMP/c_hf.log" || fail "C: no resume line for hf"
[[ $failures -eq 0 ]] && echo "ok   C: upcycled (noise 0) loss $m = dense $d; training starts from it"

# ---- D: generation ----
gen() { "$SPES" generate "$TMP/hf" -p "The jury said" -n 24 --temperature 0.8 --top-k 40 --top-p 0.95 "$@" 2>/dev/null; }
one=$(gen --seed 5) two=$(gen --seed 5) slow=$(gen --seed 5 --no-cache) other=$(gen --seed 6)
[[ -n $one && $one == "$two" ]] || fail "D: the same seed gave different text"
[[ $one == "$slow" ]] || fail "D: the KV cache changed the text"
[[ $one != "$other" ]] || fail "D: another seed gave the same text"
[[ $one == "The jury said"* ]] || fail "D: output does not start with the prompt"
[[ $failures -eq 0 ]] && echo "ok   D: generate is deterministic under a seed and the cache changes nothing: $one"

# ---- F: transformers loads the exports ----
source "$SRC/scripts/torch_env.sh"
HF_PY=$SPES_TORCH_HOME/bin/python
if [[ ! -x $HF_PY ]]; then
  fail "F: no python with transformers at $HF_PY: run scripts/setup.sh"
else
  for folder in hf qwen_hf; do
    out=$("$HF_PY" "$SRC/scripts/hf_transformers_check.py" "$TMP/$folder" "$VAL" --seq-len 64 --windows 2 2>&1) ||
      { fail "F: transformers on $folder: $(echo "$out" | tail -3)"; continue; }
    theirs=$(echo "$out" | grep -o "^loss [0-9.]*" | awk '{print $2}') ours=$(eval_loss "$TMP/$folder")
    close "$ours" "$theirs" 1e-4 || fail "F: $folder: spes eval $ours vs transformers $theirs"
    [[ $failures -eq 0 ]] && echo "ok   F: $folder: transformers $(echo "$out" | grep "^loss" | cut -d' ' -f3- ) loss $theirs = spes eval $ours; $(echo "$out" | grep "logits vs")"
  done
fi

# ---- E: bad input ----
# expect NAME EXIT_CODE SUBSTRING -- command...
expect() {
  local name=$1 code=$2 needle=$3 out rc
  shift 4
  out=$("$@" 2>&1)
  rc=$?
  if [[ $rc -ne $code || "$out" != *"$needle"* ]]; then
    fail "E $name: exit $rc (expected $code), output: $(echo "$out" | tail -2)"
  fi
}
expect export-exists 7 "exists already" -- "$SPES" ckpt export "$shard" "$TMP/hf"
expect import-not-hf 5 "has no config.json" -- "$SPES" ckpt import "$TMP" -o "$TMP/x"
part=$(train part 2 --set "train.owned_experts=[0, 1, 2, 3]")
expect merge-missing 5 "no shard owns expert(s) 4,5,6,7" -- "$SPES" ckpt merge "$part" -o "$TMP/x"
expect eval-no-data 4 "val.bin" -- "$SPES" eval "$TMP/hf" --data "$TMP/val.bin"
expect upcycle-moe 5 "upcycle starts from a dense model" -- "$SPES" ckpt upcycle "$TMP/imported" -o "$TMP/x"
expect generate-bad-p 2 "--top-p" -- "$SPES" generate "$TMP/hf" -p hi --top-p 0
expect eval-bad-windows 2 "--windows must be 0" -- "$SPES" eval "$TMP/hf" --data "$VAL" --windows -1
expect eval-not-model 5 "neither a spes checkpoint folder" -- "$SPES" eval "$TMP" --data "$VAL"
[[ -e $TMP/x ]] && fail "E: a failed command left $TMP/x behind"
[[ $failures -eq 0 ]] && echo "ok   E: bad input is refused with clear messages"

if [[ $failures -ne 0 ]]; then
  echo "$failures failure(s)"
  exit 1
fi
echo "all model tool checks passed"
