#!/usr/bin/env bash
# The GPU check: runs on a machine with an NVIDIA GPU, torch 2.11 (+ transformers) in python3, no
# apt and no internet, from a copy of the working tree plus bundle/ and data/ made here by
# scripts/gpu_bundle.sh. Prints everything docs/benchmarks.md records; about 6 minutes on an H200.
#   1. spes bench train on the 1b shape, train.device=cuda, bf16: tokens/s, MFU against the
#      measured bf16 matmul peak, GPU memory with all experts, 1/4 owned, 1/4 owned + bf16 frozen;
#   2. two nodes on the one GPU complete SPES rounds over loopback, bit-identical after each;
#   3. a shard written on the CPU resumes on the GPU, and a GPU shard resumes on the CPU;
#   4. an HF export loaded by transformers (OlmoeForCausalLM) on the GPU: its loss equals spes eval's;
#   5. the sync codec's speed on one core and on all of them (spes bench sync --codec).
# Dry run on a CPU machine: SPES_GPU_CHECK_DEVICE=cpu SPES_GPU_CHECK_CONFIG=configs/tiny.yaml.
set -uo pipefail
cd "$(dirname "$0")/.."
DEVICE=${SPES_GPU_CHECK_DEVICE:-cuda}
CONFIG=${SPES_GPU_CHECK_CONFIG:-configs/1b.yaml}
BENCH_DATA=${SPES_GPU_CHECK_DATA:-data/1b-gpu}
PY=${SPES_GPU_CHECK_PYTHON:-python3}
WORK=$(mktemp -d /tmp/spes-gpu-check.XXXXXX)
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done; rm -rf "$WORK"; }
trap cleanup EXIT
failures=0
fail() { echo "FAIL $*"; failures=$((failures + 1)); }
section() { echo; echo "==== $* ($(date +%T))"; }

# The binary from the bundle against this machine's torch (and its CUDA wheels).
if [[ -x bundle/bin/spes ]]; then
  SPES=bundle/bin/spes CHECK=bundle/bin/sync_check
  torch_lib=$("$PY" -c 'import os, torch; print(os.path.join(os.path.dirname(torch.__file__), "lib"))')
  nv=$(ls -d "$torch_lib"/../../nvidia/*/lib 2>/dev/null | tr '\n' ':')
  export LD_LIBRARY_PATH="$PWD/bundle/lib:$torch_lib:$nv${LD_LIBRARY_PATH:-}"
  export SPES_SENTENCEPIECE_MODULE="$PWD/bundle/bin/libspes_sentencepiece.so"
else
  SPES=${SPES:-build/spes} CHECK=${CHECK:-build/tests/sync_check}
fi
section "machine"
command -v nvidia-smi > /dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
"$PY" -c 'import torch; print("python torch", torch.__version__, "cuda", torch.version.cuda, "gpus", torch.cuda.device_count())'
"$SPES" --version 2>/dev/null || true
common=(--set "train.device=$DEVICE")

section "1. bench train: $CONFIG on $DEVICE"
"$SPES" bench train -c "$CONFIG" "${common[@]}" --set "data.dir=$BENCH_DATA" --set "data.tokenizer=data/small/tokenizer.model" \
  --steps "${SPES_GPU_CHECK_STEPS:-6}" --warmup 2 --json "$WORK/bench.json" || fail "bench train"

section "2. two SPES nodes on one $DEVICE over loopback"
small=(-c configs/small.yaml "${common[@]}" --set data.dir=data/small --set train.steps=30 --set train.eval_every=0
       --set train.log_every=10 --set sync.every=10 --set sync.insecure=true --set sync.token=gpu-check
       --set "sync.peers=[{id: 0, address: '127.0.0.1:7391'}, {id: 1, address: '127.0.0.1:7392'}]"
       --set "sync.dump_dir=$WORK/dump" --set checkpoint.every=30)
for i in 0 1; do
  "$SPES" node "${small[@]}" --set run.node_id=$i --set "run.out_dir=$WORK/n$i" > "$WORK/n$i.log" 2>&1 &
  pids+=($!)
done
for p in "${pids[@]}"; do wait "$p" || fail "a node exited non-zero"; done
pids=()
grep -h "sync  round\|done:" "$WORK/n0.log" "$WORK/n1.log" | cut -c1-160
"$CHECK" "$WORK/dump" 2 3 --identical-only && echo "ok   2 nodes: 3 rounds, bit-identical after each" || fail "sync_check"

section "3. shards across devices"
cpu_run=(-c configs/small.yaml --set data.dir=data/small --set train.eval_every=0 --set train.log_every=5)
"$SPES" train "${cpu_run[@]}" --set train.device=cpu --set train.steps=5 --set checkpoint.every=5 \
  --set "run.out_dir=$WORK/cpu" > "$WORK/cpu.log" 2>&1 || fail "cpu run"
"$SPES" train "${cpu_run[@]}" "${common[@]}" --set train.steps=10 --set checkpoint.every=5 --set "run.out_dir=$WORK/cpu" \
  --set checkpoint.resume=auto --set checkpoint.allow_mismatch=true > "$WORK/cpu2gpu.log" 2>&1 || fail "CPU shard resumed on $DEVICE"
grep -h "resumed from\|device:" "$WORK/cpu2gpu.log" | cut -c1-160
"$SPES" train "${cpu_run[@]}" --set train.device=cpu --set train.steps=15 --set checkpoint.every=5 --set "run.out_dir=$WORK/cpu" \
  --set checkpoint.resume=auto --set checkpoint.allow_mismatch=true > "$WORK/gpu2cpu.log" 2>&1 || fail "$DEVICE shard resumed on the CPU"
grep -h "resumed from\|device:" "$WORK/gpu2cpu.log" | cut -c1-160
grep -h "step    15/15" "$WORK/gpu2cpu.log" | cut -c1-120

section "4. HF export loaded by transformers on $DEVICE"
"$SPES" ckpt export "$WORK/n0/checkpoints/step-00000030" "$WORK/hf" > /dev/null 2>&1 || fail "export"
ours=$("$SPES" eval "$WORK/hf" --data data/small/val.bin --seq-len 256 --batch-size 4 --windows 8 | grep -o "loss [0-9.]*" | awk '{print $2}')
out=$("$PY" scripts/hf_transformers_check.py "$WORK/hf" data/small/val.bin --seq-len 256 --windows 8 --device "$DEVICE" 2>&1 | grep -v "Loading weights")
echo "$out"
theirs=$(echo "$out" | grep -o "^loss [0-9.]*" | awk '{print $2}')
"$PY" -c "import sys; a, b = float(sys.argv[1]), float(sys.argv[2]); print(f'spes eval {a} vs transformers {b}: relative {abs(a-b)/abs(a):.2e}'); sys.exit(abs(a-b) > 1e-4 * abs(a))" \
  "${ours:-nan}" "${theirs:-nan}" || fail "spes eval vs transformers"

section "5. sync codec speed on this machine's cores (sparse selection runs on the host mirror)"
"$SPES" bench sync -c "$CONFIG" --codec || fail "bench sync --codec"

echo
if [[ $failures -ne 0 ]]; then echo "gpu check: $failures failure(s)"; exit 1; fi
echo "gpu check: all passed"
