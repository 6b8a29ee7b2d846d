#!/usr/bin/env bash
# Packs what scripts/gpu_check.sh needs on a GPU machine that has torch (and transformers) in its
# python but no apt: the stripped `spes` binary, its SentencePiece module, every shared library it
# loads that is neither glibc/libstdc++ nor torch/CUDA (gRPC, protobuf, abseil, spdlog, fmt,
# yaml-cpp, OpenSSL, SentencePiece, ...), and prepared data (the GPU machine has no bible-kjv).
# Writes bundle/ (ignored by git; pass it to the device tool as a carried path, with data/).
# usage: scripts/gpu_bundle.sh    (after scripts/build.sh)
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${SPES_BUILD_DIR:-build}
OUT=bundle
rm -rf "$OUT"
mkdir -p "$OUT/bin" "$OUT/lib"
cp "$BUILD/spes" "$BUILD/libspes_sentencepiece.so" "$BUILD/tests/sync_check" "$OUT/bin/"
strip --strip-debug "$OUT"/bin/*
# What the binary and the module load, less what the GPU machine has: glibc, the C++ runtime,
# torch's own libraries and CUDA's (LD_LIBRARY_PATH points at that machine's torch there).
for f in "$OUT/bin/spes" "$OUT/bin/libspes_sentencepiece.so"; do
  ldd "$f" | awk '$3 ~ /^\// {print $3}'
done | sort -u | grep -vE '/(libc|libm|libdl|librt|libpthread|libutil|ld-linux[^/]*|libstdc\+\+|libgcc_s)\.so' |
  grep -vE 'torch/lib|nvidia|cuda' | while read -r lib; do cp -L "$lib" "$OUT/lib/"; done
# Data made here: the small config's (tokenizer + shards) and the 1b shape encoded with that tokenizer
# (a 155k-piece tokenizer cannot be trained on 4 MB of text; the model keeps its 155k vocabulary).
SPES="$BUILD/spes"
"$SPES" data prepare -c configs/small.yaml > /dev/null
"$SPES" data prepare -c configs/1b.yaml --set data.dir=data/1b-gpu --set data.tokenizer=data/small/tokenizer.model > /dev/null
echo "bundle: $(du -sh "$OUT" | cut -f1) in $OUT ($(ls "$OUT/lib" | wc -l) libraries); data: $(du -shc data/small data/1b-gpu | tail -1 | cut -f1)"
