#!/usr/bin/env bash
# The spes CLI as a user meets it: bad configs, data and flags give a clear message naming
# the file/key/line and a distinct exit code; a short real run prints progress and metrics.
# usage: cli_errors.sh SPES_BINARY SOURCE_DIR TEST_DATA_DIR
set -uo pipefail
SPES=$1
SRC=$2
DATA=$3
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
failures=0

# expect NAME EXIT_CODE SUBSTRING -- command...
expect() {
  local name=$1 code=$2 needle=$3
  shift 4
  local out rc
  out=$("$@" 2>&1)
  rc=$?
  if [[ $rc -ne $code ]]; then
    echo "FAIL $name: exit $rc, expected $code"; echo "$out" | tail -5; failures=$((failures + 1)); return
  fi
  if [[ "$out" != *"$needle"* ]]; then
    echo "FAIL $name: output lacks '$needle'"; echo "$out" | tail -5; failures=$((failures + 1)); return
  fi
  echo "ok   $name"
}

TINY=$SRC/configs/tiny.yaml
COMMON=(--set "data.dir=$DATA/tiny" --set "run.out_dir=$TMP/run")

sed 's/^  n_heads: 4$/  n_head: 4/' "$TINY" > "$TMP/unknown.yaml"
expect unknown-key 3 "unknown.yaml:12: unknown key 'model.n_head'" -- "$SPES" train -c "$TMP/unknown.yaml"
sed 's/^  n_heads: 4$/  n_heads: 3/' "$TINY" > "$TMP/heads.yaml"
expect heads-divide 3 "heads.yaml:12 (model.n_heads): n_heads (3) must divide d_model (64)" -- "$SPES" train -c "$TMP/heads.yaml"
sed 's/^  steps: 200$/  steps: lots/' "$TINY" > "$TMP/type.yaml"
expect wrong-type 3 "(train.steps): expected an integer, got 'lots'" -- "$SPES" train -c "$TMP/type.yaml"
expect top-k 3 "top_k (9) must be between 1 and n_experts (8)" -- "$SPES" model info -c "$TINY" --set model.top_k=9
expect owned-range 3 "expert 8 is out of range" -- "$SPES" train -c "$TINY" --set "train.owned_experts=[0, 8]"
expect node-no-sync 3 "needs sync.every > 0" -- "$SPES" node -c "$TINY" "${COMMON[@]}"
expect sync-no-tls 3 "(sync.tls): TLS files are required" -- "$SPES" node -c "$TINY" "${COMMON[@]}" \
  --set sync.every=10 --set sync.token=t --set "sync.peers=[{id: 0, address: '127.0.0.1:1'}]"
expect sync-owner-twice 3 "expert 1 is owned by peers 0 and 1" -- "$SPES" node -c "$TINY" "${COMMON[@]}" \
  --set sync.every=10 --set sync.token=t --set sync.insecure=true \
  --set "sync.peers=[{id: 0, address: 'a:1', experts: [0-3]}, {id: 1, address: 'b:1', experts: [1, 4-7]}]"
# Per-node certificates (spes ca): a node starts only with its own certificate from its run's CA.
"$SPES" ca init "$TMP/ca" --run tiny > /dev/null && "$SPES" ca issue "$TMP/ca" --node 0,1 --host 127.0.0.1 > /dev/null &&
  "$SPES" ca init "$TMP/ca2" --run tiny > /dev/null && "$SPES" ca issue "$TMP/ca2" --node 0 > /dev/null ||
  { echo "FAIL spes ca init/issue"; failures=$((failures + 1)); }
expect ca-twice 2 "already holds a CA" -- "$SPES" ca init "$TMP/ca" --run tiny
expect ca-none 2 "make the run's CA first" -- "$SPES" ca issue "$TMP/nothing" --node 1
expect ca-reissue 2 "pass --force to replace it" -- "$SPES" ca issue "$TMP/ca" --node 1
expect ca-bad-node 2 "'x' is not a node id" -- "$SPES" ca issue "$TMP/ca" --node 2,x
expect ca-show 0 "node 1 of run 'tiny'" -- "$SPES" ca show "$TMP/ca/node-1.pem"
TLS_NODE=(node -c "$TINY" "${COMMON[@]}" --set sync.every=10 --set sync.token=t --set "sync.peers=[{id: 0, address: '127.0.0.1:1'}]"
  --set "sync.tls.ca=$TMP/ca/ca.pem")
expect cert-other-node 3 "is the certificate of node 1 of run 'tiny'; this is node 0" -- "$SPES" "${TLS_NODE[@]}" \
  --set "sync.tls.cert=$TMP/ca/node-1.pem" --set "sync.tls.key=$TMP/ca/node-1.key"
expect cert-foreign-ca 3 "('$TMP/ca2/node-0.pem') does not verify against the CA" -- "$SPES" "${TLS_NODE[@]}" \
  --set "sync.tls.cert=$TMP/ca2/node-0.pem" --set "sync.tls.key=$TMP/ca2/node-0.key"
expect cert-wrong-key 3 "('$TMP/ca/node-1.key') is not the key of the certificate" -- "$SPES" "${TLS_NODE[@]}" \
  --set "sync.tls.cert=$TMP/ca/node-0.pem" --set "sync.tls.key=$TMP/ca/node-1.key"
expect cert-garbage 3 "('$TINY') is not a PEM certificate" -- "$SPES" "${TLS_NODE[@]}" \
  --set "sync.tls.cert=$TINY" --set "sync.tls.key=$TMP/ca/node-0.key"
expect missing-config 3 "config file '$TMP/none.yaml' does not exist" -- "$SPES" train -c "$TMP/none.yaml"
expect bad-flag 109 "unknown-flag" -- "$SPES" train -c "$TINY" --unknown-flag

mkdir -p "$TMP/empty"
expect empty-corpus 4 "holds no text" -- "$SPES" data prepare -c "$TINY" --set "data.corpus=$TMP/empty" --set "data.dir=$TMP/d1"
expect missing-tokenizer 4 "tokenizer model '$TMP/no.model' does not exist" -- \
  "$SPES" data prepare -c "$TINY" --set "data.corpus=$SRC/configs" --set "data.dir=$TMP/d2" --set "data.tokenizer=$TMP/no.model"

cp -r "$DATA/tiny" "$TMP/broken"
head -c 100000 "$DATA/tiny/train.bin" > "$TMP/broken/train.bin"
expect truncated-shard 4 "train.bin' is truncated" -- "$SPES" train -c "$TINY" --set "data.dir=$TMP/broken" --set "run.out_dir=$TMP/run"
printf 'not a shard at all, just some text that is long enough' > "$TMP/broken/train.bin"
expect foreign-shard 4 "is not a spes token shard" -- "$SPES" train -c "$TINY" --set "data.dir=$TMP/broken" --set "run.out_dir=$TMP/run"

expect model-info 0 "active per token" -- "$SPES" model info -c "$SRC/configs/1b.yaml"
expect train-runs 0 "final validation loss" -- "$SPES" train -c "$TINY" "${COMMON[@]}" --set train.steps=20 --set train.log_every=5
if [[ $(grep -c '"type":"train"' "$TMP/run/metrics.jsonl") -ne 20 ]] || ! grep -q '"val_loss"' "$TMP/run/metrics.jsonl" \
   || ! grep -q '"expert_load"' "$TMP/run/metrics.jsonl" || ! grep -q 'step    20/20' "$TMP/run/train.log"; then
  echo "FAIL metrics: metrics.jsonl or train.log incomplete"; failures=$((failures + 1))
else
  echo "ok   metrics"
fi

# Checkpoints as a user meets them: --resume continues, inspect verifies, a corrupt shard is named,
# a changed config is refused with the difference.
CK=(--set train.steps=6 --set train.eval_every=0 --set checkpoint.every=2 --set "checkpoint.dir=$TMP/ck")
expect ckpt-write 0 "checkpoint: wrote $TMP/ck/step-00000006" -- "$SPES" train -c "$TINY" "${COMMON[@]}" "${CK[@]}"
expect ckpt-inspect 0 "node 0, step 6, sync round 0" -- "$SPES" ckpt inspect "$TMP/ck/step-00000006"
expect ckpt-resume 0 "resumed from $TMP/ck/step-00000006 at step 6" -- "$SPES" train -c "$TINY" "${COMMON[@]}" "${CK[@]}" --resume
expect ckpt-refuse 5 "train.batch_size: shard 8, config 4" -- "$SPES" train -c "$TINY" "${COMMON[@]}" "${CK[@]}" --resume \
  --set train.batch_size=4
printf 'garbage' >> "$TMP/ck/step-00000006/optimizer.safetensors"
expect ckpt-corrupt 5 "step-00000006: BROKEN" -- "$SPES" ckpt inspect "$TMP/ck"

passed=$(( 20 - failures ))
echo "$passed passed, $failures failed"
[[ $failures -eq 0 ]]
