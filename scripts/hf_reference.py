#!/usr/bin/env python3
"""Validation loss of a Hugging Face OLMoE / Qwen3-MoE folder, computed with numpy alone.

An independent reading of what `transformers` does with such a folder (modeling_olmoe.py,
modeling_qwen3_moe.py: RMSNorm, rotate-half RoPE, QK-norm over the whole q/k vector or per
head, grouped-query attention, softmax router with top-k, SwiGLU experts, untied head), used to
check `spes ckpt export` without transformers on the machine. It reads config.json and
model.safetensors and the first windows of a spes token shard, the same windows `spes eval`
takes, and prints the mean cross-entropy.

usage: hf_reference.py HF_DIR TOKENS.bin --seq-len S --windows N
"""
import argparse
import json
import struct
import sys

import numpy as np


def read_safetensors(path):
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    out = {}
    for name, h in header.items():
        if name == "__metadata__":
            continue
        if h["dtype"] != "F32":
            sys.exit(f"{path}: {name} is {h['dtype']}; this reference reads F32")
        a, b = h["data_offsets"]
        out[name] = np.frombuffer(data[8 + n + a:8 + n + b], dtype="<f4").reshape(h["shape"]).astype(np.float64)
    return out


def read_tokens(path):
    with open(path, "rb") as f:
        data = f.read()
    if data[:8] != b"SPESTOK\0":
        sys.exit(f"{path}: not a spes token shard")
    (count,) = struct.unpack("<Q", data[16:24])
    return np.frombuffer(data[32:32 + 4 * count], dtype="<u4").astype(np.int64)


def rms_norm(x, w, eps):
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * w


def rope(x, theta):  # x: [H, S, hd], rotate-half layout
    hd, S = x.shape[-1], x.shape[-2]
    inv_freq = 1.0 / theta ** (np.arange(0, hd, 2) / hd)
    freqs = np.outer(np.arange(S), inv_freq)
    emb = np.concatenate([freqs, freqs], -1)
    half = hd // 2
    rotated = np.concatenate([-x[..., half:], x[..., :half]], -1)
    return x * np.cos(emb) + rotated * np.sin(emb)


def softmax(x):
    x = x - x.max(-1, keepdims=True)
    e = np.exp(x)
    return e / e.sum(-1, keepdims=True)


def forward(cfg, W, ids):
    per_head = cfg["model_type"] == "qwen3_moe"
    d, H = cfg["hidden_size"], cfg["num_attention_heads"]
    KV = cfg.get("num_key_value_heads") or H
    hd = cfg.get("head_dim") or d // H
    eps, theta, k = cfg["rms_norm_eps"], cfg["rope_theta"], cfg["num_experts_per_tok"]
    S = len(ids)
    x = W["model.embed_tokens.weight"][ids]
    causal = np.triu(np.full((S, S), -np.inf), 1)
    for l in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{l}."
        h = rms_norm(x, W[p + "input_layernorm.weight"], eps)
        q, kk, v = (h @ W[p + f"self_attn.{n}_proj.weight"].T for n in "qkv")
        if not per_head:  # OLMoE: over the whole projected vector
            q = rms_norm(q, W[p + "self_attn.q_norm.weight"], eps)
            kk = rms_norm(kk, W[p + "self_attn.k_norm.weight"], eps)
        q = q.reshape(S, H, hd).transpose(1, 0, 2)
        kk = kk.reshape(S, KV, hd).transpose(1, 0, 2)
        v = v.reshape(S, KV, hd).transpose(1, 0, 2)
        if per_head:  # Qwen3: per head, before RoPE
            q = rms_norm(q, W[p + "self_attn.q_norm.weight"], eps)
            kk = rms_norm(kk, W[p + "self_attn.k_norm.weight"], eps)
        q, kk = rope(q, theta), rope(kk, theta)
        kk, v = np.repeat(kk, H // KV, 0), np.repeat(v, H // KV, 0)
        att = softmax(q @ kk.transpose(0, 2, 1) / np.sqrt(hd) + causal) @ v
        x = x + att.transpose(1, 0, 2).reshape(S, H * hd) @ W[p + "self_attn.o_proj.weight"].T
        h = rms_norm(x, W[p + "post_attention_layernorm.weight"], eps)
        probs = softmax(h @ W[p + "mlp.gate.weight"].T)
        top = np.argsort(-probs, axis=-1, kind="stable")[:, :k]
        weights = np.take_along_axis(probs, top, -1)
        if cfg.get("norm_topk_prob"):
            weights = weights / weights.sum(-1, keepdims=True)
        y = np.zeros_like(h)
        for t in range(S):
            for slot in range(k):
                e = f"{p}mlp.experts.{top[t, slot]}."
                g = h[t] @ W[e + "gate_proj.weight"].T
                u = h[t] @ W[e + "up_proj.weight"].T
                y[t] += weights[t, slot] * ((g / (1 + np.exp(-g)) * u) @ W[e + "down_proj.weight"].T)
        x = x + y
    x = rms_norm(x, W["model.norm.weight"], eps)
    return x @ W["lm_head.weight"].T


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("hf_dir")
    ap.add_argument("tokens")
    ap.add_argument("--seq-len", type=int, required=True)
    ap.add_argument("--windows", type=int, default=2)
    a = ap.parse_args()
    cfg = json.load(open(f"{a.hf_dir}/config.json"))
    if cfg["model_type"] not in ("olmoe", "qwen3_moe"):
        sys.exit(f"model_type {cfg['model_type']} is not olmoe or qwen3_moe")
    W = read_safetensors(f"{a.hf_dir}/model.safetensors")
    tokens = read_tokens(a.tokens)
    losses = []
    for w in range(a.windows):
        window = tokens[w * a.seq_len:w * a.seq_len + a.seq_len + 1]
        logits = forward(cfg, W, window[:-1])
        lse = np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(-1)) + logits.max(-1)
        losses.append((lse - logits[np.arange(a.seq_len), window[1:]]).mean())
    print(f"loss {np.mean(losses):.6f}")


if __name__ == "__main__":
    main()
