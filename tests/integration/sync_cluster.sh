#!/usr/bin/env bash
# SPES synchronization between separate `spes node` processes on loopback (tiny config):
#   A. 4 nodes, fp32: after every round all four hold bit-identical parameters equal to the SPES
#      result computed independently from their pre-round dumps (sync_check);
#   B. 4 nodes, int8 deltas + merge warm-up: bit-identical after every round;
#   C. 1 node with sync equals `spes train` bit for bit (every loss of every step);
#   D. a node killed mid-run: the other three skip it and finish;
#   E. 2 nodes killed (SIGKILL) after their step-20 shards, resumed from them: the weights after
#      the last round are bit-identical to an uninterrupted run's;
#   E2. the same with int8 deltas and bf16 on the wire: bit-identical too (residuals in the shard);
#   E3. the same with sparse deltas (top 5% per chunk, 2 bits), the weights holding part of the
#       unsent remainders (the default; the shard holds the synced copy too): bit-identical after
#       rounds 3 and 4;  E4. the same with the remainders only in their buffers (local_* off);
#       E5. sparse in two fragments (a round every 5 steps), bit-identical after rounds 5 and 6;
#   F. `spes ckpt merge` of E's two step-20 shards: the whole model (equal to what each node held
#      after the round), exported, then resumed by one node owning all experts (a new node count).
# usage: sync_cluster.sh SPES SYNC_CHECK SOURCE_DIR TEST_DATA_DIR
set -uo pipefail
source "$(dirname "$0")/cluster_lib.sh" "$@"

# kill_after_step20_shards NAME: once both nodes of 2-node cluster NAME have written their step-20
# shard, kills them (SIGKILL) and waits for them.
kill_after_step20_shards() {
  local name=$1
  for _ in $(seq 1 600); do
    [[ -f $TMP/$name/node0/checkpoints/step-00000020/manifest.json &&
       -f $TMP/$name/node1/checkpoints/step-00000020/manifest.json ]] && break
    sleep 0.1
  done
  for p in "${node_pids[@]}"; do kill -9 "$p" 2>/dev/null; done
  for p in "${node_pids[@]}"; do wait "$p" 2>/dev/null; done
}


# ---- A: 4 nodes, fp32, exact SPES result ----
start_cluster a 4 30 10 --set merge.alpha=0
wait_cluster a
if "$CHECK" "$TMP/a/dump" 4 3; then echo "ok   A: 3 rounds, 4 nodes bit-identical and equal to the SPES result"; else fail "A: sync_check"; fi
losses=$(for i in 0 1 2 3; do final_loss "$TMP/a/node$i.log"; done | sort -u | wc -l)
[[ $losses -eq 1 ]] && echo "ok   A: same final validation loss on all nodes" || fail "A: final losses differ"
grep -q "sync  round   3" "$TMP/a/node0.log" || fail "A: no round 3 line in the log"
grep -q '"type":"sync"' "$TMP/a/node0/metrics.jsonl" || fail "A: no sync records in metrics.jsonl"

# ---- B: int8 deltas for shared and experts, merge warm-up every round ----
start_cluster b 4 30 10 --set sync.encoding.shared=int8_delta --set sync.encoding.experts=int8_delta \
  --set merge.alpha=0.05 --set merge.every=10 --set merge.horizon=1000
wait_cluster b
if "$CHECK" "$TMP/b/dump" 4 3 --identical-only; then echo "ok   B: int8 deltas + merge: bit-identical after every round"; else fail "B: sync_check"; fi
grep -q "merged experts" "$TMP/b/node0.log" && echo "ok   B: merge warm-up ran" || fail "B: no merge in the log"

# ---- C: one node with sync == spes train ----
start_cluster c 1 30 10 --set merge.alpha=0
wait_cluster c
"$SPES" train -c "$TINY" --set "data.dir=$DATA/tiny" --set train.eval_every=0 --set train.log_every=10 \
  --set train.steps=30 --set "run.out_dir=$TMP/c/single" > "$TMP/c/single.log" 2>&1 || fail "C: spes train failed"
python3 - "$TMP/c/node0/metrics.jsonl" "$TMP/c/single/metrics.jsonl" <<'PY' && echo "ok   C: 1-node SPES run equals single-node training bit for bit" || fail "C: losses differ"
import json, sys
def losses(path):
    return [(r["step"], r["loss"], r["ce"]) for r in map(json.loads, open(path)) if r.get("type") == "train"]
a, b = losses(sys.argv[1]), losses(sys.argv[2])
sys.exit(0 if a == b and len(a) == 30 else 1)
PY

# ---- D: node 3 killed after its first round; the others skip it and finish ----
start_cluster d 4 40 10 --set merge.alpha=0 --set sync.dump_dir= --set sync.peer_wait_s=3
victim=${node_pids[3]}
wait_log "$TMP/d/node3.log" "sync  round   1"
kill -9 "$victim" 2>/dev/null
expect_dead=3 wait_cluster d
for i in 0 1 2; do
  grep -q "skipped node 3" "$TMP/d/node$i.log" || fail "D: node $i did not report skipping node 3"
  grep -q "node $i done: 4 rounds" "$TMP/d/node$i.log" || fail "D: node $i did not finish its 4 rounds"
done
[[ $failures -eq 0 ]] && echo "ok   D: killed node skipped, the other three finished"

# ---- E: 2-node exact resume at a round boundary ----
start_cluster e_full 2 100 10 --set merge.alpha=0
wait_cluster e_full
start_cluster e 2 100 10 --set merge.alpha=0 --set checkpoint.every=20 --set checkpoint.keep=10
kill_after_step20_shards e
rm -f "$TMP"/e/dump/node*/round10_post.safetensors
start_cluster e 2 100 10 --set merge.alpha=0 --set checkpoint.every=20 --set checkpoint.keep=10 \
  --set checkpoint.resume=step-00000020
wait_cluster e
grep -q "resumed from .*step-00000020 at step 20 (sync round 2)" "$TMP/e/node0.log" || fail "E: node 0 did not resume at step 20"
same=1
for i in 0 1; do cmp -s "$TMP/e_full/dump/node$i/round10_post.safetensors" "$TMP/e/dump/node$i/round10_post.safetensors" || same=0; done
[[ $same -eq 1 ]] && echo "ok   E: 2 nodes killed and resumed from step 20: bit-identical to the uninterrupted run after round 10" ||
  fail "E: resumed run differs from the uninterrupted one"

# ---- E2/E3: the same with lossy encodings (residuals and baselines live in the shard) ----
# resume_lossy NAME LABEL --set ...: runs 40 steps whole, then killed after step 20 and resumed.
# RESUMED_ROUND: the round the step-20 shard holds (2; 4 with two fragments); COMPARED: the rounds
# after it that must come out bit-identical ("3 4").
resume_lossy() {
  local name=$1 label=$2
  shift 2
  local at=${RESUMED_ROUND:-2} compared=${COMPARED:-3 4}
  start_cluster "${name}_full" 2 40 10 "$@"
  wait_cluster "${name}_full"
  start_cluster "$name" 2 40 10 "$@" --set checkpoint.every=20
  kill_after_step20_shards "$name"
  local same=1 i r
  for r in $compared; do rm -f "$TMP/$name"/dump/node*/round${r}_post.safetensors; done
  [[ -f $TMP/$name/node0/checkpoints/step-00000020/sync.safetensors ]] || fail "$name: the shard holds no residuals"
  start_cluster "$name" 2 40 10 "$@" --set checkpoint.every=20 --set checkpoint.resume=step-00000020
  wait_cluster "$name"
  grep -q "restored the error-feedback residuals and baselines of round $at" "$TMP/$name/node1.log" ||
    fail "$name: node 1 did not restore its residuals"
  for i in 0 1; do
    for r in $compared; do
      cmp -s "$TMP/${name}_full/dump/node$i/round${r}_post.safetensors" "$TMP/$name/dump/node$i/round${r}_post.safetensors" || same=0
    done
  done
  [[ $same -eq 1 ]] && echo "ok   $name: $label run killed and resumed from step 20: bit-identical after rounds ${compared// / and }" ||
    fail "$name: resumed $label run differs from the uninterrupted one"
}
resume_lossy e2 int8/bf16 --set merge.alpha=0 --set sync.encoding.shared=int8_delta --set sync.encoding.experts=bf16
resume_lossy e3 "sparse (remainders in the weights)" --set merge.alpha=0 --set sync.encoding.shared=sparse \
  --set sync.encoding.experts=sparse --set sync.sparse.chunk=256 --set sync.sparse.density=0.05
resume_lossy e4 "sparse (remainders in buffers)" --set merge.alpha=0 --set sync.encoding.shared=sparse \
  --set sync.encoding.experts=sparse --set sync.sparse.chunk=256 --set sync.sparse.density=0.05 \
  --set sync.sparse.local_experts=false --set sync.sparse.local_shared=off
RESUMED_ROUND=4 COMPARED="5 6" resume_lossy e5 "sparse in 2 fragments" --set merge.alpha=0 \
  --set sync.encoding.shared=sparse --set sync.encoding.experts=sparse --set sync.sparse.chunk=256 \
  --set sync.sparse.density=0.05 --set sync.fragments=2

# ---- F: merge the step-20 shards, export, reshard to one node ----
E0=$TMP/e/node0/checkpoints/step-00000020
E1=$TMP/e/node1/checkpoints/step-00000020
"$SPES" ckpt merge "$E1" "$E0" -o "$TMP/f/merged" > "$TMP/f.log" 2>&1 || fail "F: ckpt merge failed"
grep -q "merged 2 shard(s) of step 20 (sync round 2)" "$TMP/f.log" || fail "F: merge did not report step 20, round 2"
grep -q "differ between the shards" "$TMP/f.log" && fail "F: shared tensors differ right after a round"
"$SPES" ckpt inspect "$TMP/f/merged" > "$TMP/f_inspect.log" 2>&1 || fail "F: merged folder does not verify"
# Checkpoint folders instead of shards: the newest step both hold (step 100, after the last round).
"$SPES" ckpt merge "$TMP/e/node0/checkpoints" "$TMP/e/node1/checkpoints" -o "$TMP/f/merged_last" > "$TMP/f_last.log" 2>&1 ||
  fail "F: merge of checkpoint folders failed"
grep -q "merged 2 shard(s) of step 100" "$TMP/f_last.log" || fail "F: merge of folders did not take step 100"
grep -q "from node 1: experts 4,5,6,7" "$TMP/f_inspect.log" || fail "F: inspect does not list node 1's experts"
for what in merged node0; do
  src=$TMP/f/merged; [[ $what == node0 ]] && src=$E0
  "$SPES" ckpt export "$src" "$TMP/f/hf_$what" >> "$TMP/f.log" 2>&1 || fail "F: export of $what failed"
done
cmp -s "$TMP/f/hf_merged/model.safetensors" "$TMP/f/hf_node0/model.safetensors" ||
  fail "F: the merged model differs from node 0's synced weights"
"$SPES" train -c "$TINY" "${COMMON[@]}" --set train.steps=24 --set "run.out_dir=$TMP/f/single" \
  --set "checkpoint.resume=$TMP/f/merged" > "$TMP/f_refused.log" 2>&1 && fail "F: resumed despite other train.steps"
grep -q "train.steps: shard 100, config 24" "$TMP/f_refused.log" || fail "F: refusal does not name train.steps"
"$SPES" train -c "$TINY" "${COMMON[@]}" --set train.steps=24 --set "run.out_dir=$TMP/f/single" \
  --set "checkpoint.resume=$TMP/f/merged" --set checkpoint.allow_mismatch=true > "$TMP/f_single.log" 2>&1 ||
  fail "F: one node could not resume from the merged model"
grep -q "resumed from .*merged at step 20 (sync round 2, merged folder)" "$TMP/f_single.log" || fail "F: no resume line"
grep -q "expert(s) 4,5,6,7 are newly owned by node 0: their AdamW moments start at zero" "$TMP/f_single.log" ||
  fail "F: newly owned experts not reported"
grep -q "final validation loss" "$TMP/f_single.log" || fail "F: the resharded run did not finish"
[[ $failures -eq 0 ]] && echo "ok   F: merged 2 shards (= the synced model), exported, resumed on 1 node owning all experts"

if [[ $failures -ne 0 ]]; then
  for f in "$TMP"/*/node*.log; do echo "== $f"; tail -3 "$f"; done
  echo "$failures failure(s)"
  exit 1
fi
echo "all sync cluster checks passed"
