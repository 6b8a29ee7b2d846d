#include "spes/model/layers.h"

#include <torch/torch.h>

#include <cmath>

namespace spes {

RMSNormImpl::RMSNormImpl(std::int64_t dim, double eps) : eps_(eps) {
  weight = register_parameter("weight", torch::ones({dim}));
}

torch::Tensor RMSNormImpl::forward(const torch::Tensor& x) {
  // In fp32 even when x is bf16 (autocast): the mean of squares needs the range and precision.
  const auto xf = x.to(torch::kFloat32);
  auto inv_rms = torch::rsqrt(xf.pow(2).mean(-1, /*keepdim=*/true) + eps_);
  return xf * inv_rms * weight;
}

RopeTables rope_tables(std::int64_t seq_len, std::int64_t head_dim, double theta) {
  auto opts = torch::TensorOptions().dtype(torch::kFloat64);
  auto inv_freq = 1.0 / torch::pow(theta, torch::arange(0, head_dim, 2, opts) / static_cast<double>(head_dim));
  auto positions = torch::arange(seq_len, opts);
  auto freqs = torch::outer(positions, inv_freq);  // [S, head_dim/2]
  auto angles = torch::cat({freqs, freqs}, -1);    // rotate-half layout
  return {angles.cos().to(torch::kFloat32), angles.sin().to(torch::kFloat32)};
}

torch::Tensor apply_rope(const torch::Tensor& x, const RopeTables& rope) {
  const auto half = x.size(-1) / 2;
  auto x1 = x.narrow(-1, 0, half);
  auto x2 = x.narrow(-1, half, half);
  auto rotated = torch::cat({-x2, x1}, -1);
  return x * rope.cos + rotated * rope.sin;
}

torch::Tensor causal_attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v) {
  const auto S = q.size(-2), T = k.size(-2);
  const double scale = 1.0 / std::sqrt(static_cast<double>(q.size(-1)));
  auto scores = torch::matmul(q, k.transpose(-2, -1)).mul_(scale);
  // Query i sits at position T - S + i and sees keys 0 .. T - S + i.
  auto mask = torch::ones({S, T}, torch::TensorOptions().dtype(torch::kBool).device(q.device())).triu_(1 + T - S);
  scores.masked_fill_(mask, -std::numeric_limits<float>::infinity());
  return torch::matmul(torch::softmax(scores, -1), v);
}

torch::Tensor fused_causal_attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v) {
  const auto S = q.size(-2), T = k.size(-2);
  // is_causal aligns the mask to the top left, right only when queries and keys start together;
  // one new query (generation) sees every key; otherwise the mask says who sees what.
  if (S == T) return at::scaled_dot_product_attention(q, k, v, std::nullopt, 0.0, /*is_causal=*/true);
  if (S == 1) return at::scaled_dot_product_attention(q, k, v);
  auto allowed = torch::ones({S, T}, torch::TensorOptions().dtype(torch::kBool).device(q.device())).tril_(T - S);
  return at::scaled_dot_product_attention(q, k, v, allowed);
}

AttentionImpl::AttentionImpl(const ModelConfig& c)
    : n_heads_(c.n_heads), n_kv_heads_(c.kv_heads()), head_dim_(c.head_dim()), qk_norm_(c.qk_norm) {
  const auto q_dim = n_heads_ * head_dim_, kv_dim = n_kv_heads_ * head_dim_;
  auto linear = [](std::int64_t in, std::int64_t out) { return torch::nn::LinearOptions(in, out).bias(false); };
  q_proj = register_module("q_proj", torch::nn::Linear(linear(c.d_model, q_dim)));
  k_proj = register_module("k_proj", torch::nn::Linear(linear(c.d_model, kv_dim)));
  v_proj = register_module("v_proj", torch::nn::Linear(linear(c.d_model, kv_dim)));
  o_proj = register_module("o_proj", torch::nn::Linear(linear(q_dim, c.d_model)));
  if (qk_norm_ == QkNorm::Full) {
    q_norm = register_module("q_norm", RMSNorm(q_dim, c.rms_eps));
    k_norm = register_module("k_norm", RMSNorm(kv_dim, c.rms_eps));
  } else if (qk_norm_ == QkNorm::PerHead) {
    q_norm = register_module("q_norm", RMSNorm(head_dim_, c.rms_eps));
    k_norm = register_module("k_norm", RMSNorm(head_dim_, c.rms_eps));
  }
}

torch::Tensor AttentionImpl::forward(const torch::Tensor& x, const RopeTables& rope, KvLayer* cache) {
  const auto B = x.size(0), S = x.size(1);
  auto q = q_proj(x), k = k_proj(x), v = v_proj(x);
  if (qk_norm_ == QkNorm::Full) {
    q = q_norm(q);
    k = k_norm(k);
  }
  q = q.view({B, S, n_heads_, head_dim_});
  k = k.view({B, S, n_kv_heads_, head_dim_});
  v = v.view({B, S, n_kv_heads_, head_dim_});
  if (qk_norm_ == QkNorm::PerHead) {
    q = q_norm(q);
    k = k_norm(k);
  }
  q = apply_rope(q.transpose(1, 2), rope);  // [B, H, S, hd]
  k = apply_rope(k.transpose(1, 2), rope);
  v = v.transpose(1, 2);
  if (cache) {
    if (cache->k.defined()) {
      k = torch::cat({cache->k, k}, 2);
      v = torch::cat({cache->v, v}, 2);
    }
    cache->k = k;
    cache->v = v;
  }
  if (n_kv_heads_ != n_heads_) {  // grouped-query attention: share each KV head
    k = k.repeat_interleave(n_heads_ / n_kv_heads_, 1);
    v = v.repeat_interleave(n_heads_ / n_kv_heads_, 1);
  }
  auto out = fused_causal_attention(q, k, v);  // [B, H, S, hd]
  return o_proj(out.transpose(1, 2).reshape({B, S, n_heads_ * head_dim_}));
}

}  // namespace spes
