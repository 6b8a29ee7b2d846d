#!/usr/bin/env python3
"""Loads a `spes ckpt export` folder with Hugging Face transformers and checks it.

It loads the folder as OlmoeForCausalLM or Qwen3MoeForCausalLM (by its config.json), in fp32,
offline, then reads the first windows of a spes token shard (the windows `spes eval` takes) and
  - prints the mean cross-entropy of those windows under transformers ("loss X"), which the
    caller compares with `spes eval` on the same folder;
  - compares transformers' logits of the first window with those of the independent numpy
    reading in hf_reference.py (max |difference| relative to max |logit|), failing above --tol.

usage: hf_transformers_check.py HF_DIR TOKENS.bin --seq-len S --windows N [--device cpu|cuda] [--tol 1e-4]
"""
import argparse
import json
import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402
import transformers  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hf_reference  # noqa: E402

CLASSES = {"olmoe": "OlmoeForCausalLM", "qwen3_moe": "Qwen3MoeForCausalLM"}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("hf_dir")
    ap.add_argument("tokens")
    ap.add_argument("--seq-len", type=int, required=True)
    ap.add_argument("--windows", type=int, default=2)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--tol", type=float, default=1e-4)
    ap.add_argument("--no-reference", action="store_true", help="skip the numpy comparison (large models)")
    a = ap.parse_args()

    cfg = json.load(open(os.path.join(a.hf_dir, "config.json")))
    name = CLASSES.get(cfg.get("model_type"))
    if name is None:
        sys.exit(f"{a.hf_dir}: model_type {cfg.get('model_type')} is not olmoe or qwen3_moe")
    cls = getattr(transformers, name)
    model = cls.from_pretrained(a.hf_dir, dtype=torch.float32, attn_implementation="eager").to(a.device).eval()
    if type(model).__name__ != name:
        sys.exit(f"loaded {type(model).__name__}, expected {name}")

    tokens = hf_reference.read_tokens(a.tokens)
    losses, first_logits = [], None
    with torch.no_grad():
        for w in range(a.windows):
            window = torch.from_numpy(tokens[w * a.seq_len:w * a.seq_len + a.seq_len + 1].copy())
            ids = window[:-1].unsqueeze(0).to(a.device)
            logits = model(input_ids=ids).logits[0].float().cpu()
            if first_logits is None:
                first_logits = logits.numpy()
            losses.append(torch.nn.functional.cross_entropy(logits, window[1:]).item())
    print(f"loss {np.mean(losses):.6f} ({name}, transformers {transformers.__version__}, torch {torch.__version__})")

    if not a.no_reference:
        W = hf_reference.read_safetensors(os.path.join(a.hf_dir, "model.safetensors"))
        ref = hf_reference.forward(cfg, W, tokens[:a.seq_len])
        rel = float(np.abs(first_logits - ref).max() / max(1.0, np.abs(ref).max()))
        print(f"logits vs numpy reference: max relative difference {rel:.2e}")
        if rel > a.tol:
            sys.exit(f"transformers' logits differ from the reference by {rel:.2e} > {a.tol}")


if __name__ == "__main__":
    main()
