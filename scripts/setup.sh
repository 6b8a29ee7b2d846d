#!/usr/bin/env bash
# Installs everything spes needs on Debian 12, into fixed places outside the clone, so a fresh
# clone (CI) finds it and downloads nothing again. Safe to run twice: each step checks first.
#   1. Debian packages (compilers, gRPC/protobuf, yaml-cpp, spdlog, SentencePiece, the corpus, ...).
#   2. libtorch from PyPI's torch wheel, pinned (SPES_TORCH_VERSION, default 2.11.0), in a venv at
#      $SPES_TORCH_HOME (default /opt/spes/torch-<version>) with --no-deps plus the CUDA
#      libraries that libtorch_cuda links and /usr/local/cuda lacks or has at another version; the rest of CUDA (cudart,
#      cuBLAS, cuDNN, NCCL) comes from the CUDA toolkit, or from the GPU machine's own install.
#   3. transformers in the same venv, for the ecosystem test (HF export loaded by transformers).
# scripts/torch_env.sh tells the build where this is.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
source "$here/torch_env.sh"

SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi

# ---- 1. Debian packages ----
PACKAGES=(
  build-essential cmake ninja-build ccache pkg-config git
  libgloo-dev
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  libspdlog-dev libfmt-dev libyaml-cpp-dev libcli11-dev
  libgtest-dev libgmock-dev
  libsentencepiece-dev sentencepiece
  nlohmann-json3-dev zlib1g-dev
  libzstd-dev          # sync.compression: zstd frames on the wire
  libssl-dev           # per-node certificates (spes ca)
  prometheus-cpp-dev   # /metrics on every daemon
  prometheus           # the tests' real scrape of a local cluster (not needed to run spes)
  chromium             # the tests load the run's live page in headless Chromium (not needed to run spes)
  clang                # libFuzzer + AddressSanitizer for scripts/fuzz.sh (not needed to run spes)
  iptables             # packet loss and outages in scripts/net_faults.sh and soak.sh (not needed to run spes)
  curl                 # the tests send a raw gRPC call to a node (not needed to run spes)
  gnuplot-nox openssl iproute2 python3 python3-numpy python3-venv
  bible-kjv   # the demo corpus: the King James Bible, printed by `bible -f`
)
missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
else
  echo "setup: all Debian packages present"
fi
# Debian's libtorch 1.13 (what spes used before) would be found by CMake ahead of the wheel.
if dpkg-query -W -f='${Status}' libtorch-dev 2>/dev/null | grep -q "install ok installed"; then
  echo "setup: removing Debian's libtorch-dev (spes now builds against torch $SPES_TORCH_VERSION from PyPI)"
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get remove -y -qq libtorch-dev
fi

# ---- 2. libtorch from the torch wheel ----
if [ -f "$SPES_TORCH_HOME/.spes-torch-ready" ]; then
  echo "setup: torch $SPES_TORCH_VERSION present in $SPES_TORCH_HOME"
else
  echo "setup: installing torch $SPES_TORCH_VERSION (libtorch, --no-deps) into $SPES_TORCH_HOME"
  start=$(date +%s)
  $SUDO rm -rf "$SPES_TORCH_HOME"
  $SUDO mkdir -p "$(dirname "$SPES_TORCH_HOME")"
  $SUDO /usr/bin/python3 -m venv "$SPES_TORCH_HOME"
  # The CUDA build of the wheel, then what libtorch_cuda.so needs beyond /usr/local/cuda, at the
  # versions the wheel's own requirements pin: cuSPARSELt, NVSHMEM and cuFile always; NCCL only
  # when the wheel pins another release than the toolkit's (torch 2.11 pins the toolkit's 2.28.9;
  # 2.15 needs 2.30.7's new symbols).
  $SUDO "$SPES_TORCH_HOME/bin/pip" install -q --no-deps "torch==$SPES_TORCH_VERSION"
  metadata=$(ls "$(spes_torch_site)"/torch-"$SPES_TORCH_VERSION"*.dist-info/METADATA)
  pinned() { sed -n "s/^Requires-Dist: \($1==[0-9.]*\).*/\1/p" "$metadata"; }
  cuda_wheels="$(pinned nvidia-cusparselt-cu13) $(pinned nvidia-nvshmem-cu13) nvidia-cufile==1.15.1.6"
  toolkit_nccl=$(awk '/#define NCCL_(MAJOR|MINOR|PATCH) /{v=v (v?".":"") $3} END{print v}' /usr/local/cuda/include/nccl.h 2>/dev/null || true)
  wheel_nccl=$(pinned nvidia-nccl-cu13)
  if [ -n "$wheel_nccl" ] && [ "${wheel_nccl#*==}" != "$toolkit_nccl" ]; then cuda_wheels="$cuda_wheels $wheel_nccl"; fi
  echo "setup: CUDA libraries from PyPI: $cuda_wheels"
  # shellcheck disable=SC2086
  $SUDO "$SPES_TORCH_HOME/bin/pip" install -q --no-deps $cuda_wheels
  # The wheel ships protobuf 3.13 and fmt 12 headers; spes builds against Debian's protobuf 3.21
  # and fmt 9 (which Debian's spdlog is built on). Torch's own public headers need neither; left in
  # place they shadow Debian's in every file that includes torch.
  $SUDO rm -rf "$(spes_torch_site)/torch/include/google" "$(spes_torch_site)/torch/include/fmt"
  # `import torch` needs its pure-Python requirements (not the CUDA wheels).
  $SUDO "$SPES_TORCH_HOME/bin/pip" install -q filelock "typing-extensions>=4.10.0" "setuptools<82" \
    "sympy>=1.13.3" "networkx>=2.5.1" jinja2 "fsspec>=0.8.5" numpy
  $SUDO touch "$SPES_TORCH_HOME/.spes-torch-ready"
  echo "setup: torch installed in $(( $(date +%s) - start )) s"
fi

# ---- 3. transformers, for the test that loads an exported folder ----
if [ -f "$SPES_TORCH_HOME/.spes-transformers-ready" ]; then
  echo "setup: transformers $SPES_TRANSFORMERS_VERSION present"
else
  echo "setup: installing transformers $SPES_TRANSFORMERS_VERSION into $SPES_TORCH_HOME"
  $SUDO "$SPES_TORCH_HOME/bin/pip" install -q "transformers==$SPES_TRANSFORMERS_VERSION"
  $SUDO touch "$SPES_TORCH_HOME/.spes-transformers-ready"
fi
