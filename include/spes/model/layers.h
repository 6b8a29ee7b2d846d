// Building blocks of the decoder: RMSNorm, rotary position embedding (rotate-half layout),
// causal attention (fused SDPA, with the plain form as its reference), and the attention module with
// QK-norm and grouped-query heads. Parameter names follow the Hugging Face OLMoE layout.
#pragma once

#include <torch/nn/module.h>
#include <torch/nn/modules/container/any.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/pimpl.h>

#include "spes/config/config.h"

namespace spes {

// y = x / sqrt(mean(x^2) + eps) * weight, over the last dimension. No bias.
class RMSNormImpl : public torch::nn::Module {
 public:
  RMSNormImpl(std::int64_t dim, double eps);
  torch::Tensor forward(const torch::Tensor& x);
  torch::Tensor weight;

 private:
  double eps_;
};
TORCH_MODULE(RMSNorm);

// cos and sin tables [seq_len, head_dim] for positions 0..seq_len-1 (rotate-half layout).
struct RopeTables {
  torch::Tensor cos, sin;
};
RopeTables rope_tables(std::int64_t seq_len, std::int64_t head_dim, double theta);
// x: [B, H, S, head_dim] → x * cos + rotate_half(x) * sin.
torch::Tensor apply_rope(const torch::Tensor& x, const RopeTables& rope);

// softmax(q k^T / sqrt(d) + causal mask) v for q: [B, H, S, d], k and v: [B, H, T, d] with T >= S:
// the S queries are the last S of the T positions (T > S when earlier keys come from a cache).
// The plain form, kept as the reference for the fused one.
torch::Tensor causal_attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v);
// The same through at::scaled_dot_product_attention: flash / memory-efficient kernels on a GPU,
// a fused kernel on the CPU. What the model uses.
torch::Tensor fused_causal_attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v);

// One layer's keys and values of the positions seen so far, [B, H_kv, T, head_dim] (generation).
struct KvLayer {
  torch::Tensor k, v;
  std::int64_t length() const { return k.defined() ? k.size(2) : 0; }
};

class AttentionImpl : public torch::nn::Module {
 public:
  explicit AttentionImpl(const ModelConfig& config);
  // x: [B, S, d_model] → [B, S, d_model]. With a cache, x holds the S positions after the cached
  // ones (rope: the tables of those positions) and their keys and values are appended to it.
  torch::Tensor forward(const torch::Tensor& x, const RopeTables& rope, KvLayer* cache = nullptr);

  torch::nn::Linear q_proj{nullptr}, k_proj{nullptr}, v_proj{nullptr}, o_proj{nullptr};
  RMSNorm q_norm{nullptr}, k_norm{nullptr};  // null when qk_norm is none

 private:
  std::int64_t n_heads_, n_kv_heads_, head_dim_;
  QkNorm qk_norm_;
};
TORCH_MODULE(Attention);

}  // namespace spes
