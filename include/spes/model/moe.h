// The mixture-of-experts feed-forward layer: a bias-free softmax router over E experts,
// top-k routing (optionally renormalized) and dropless grouped dispatch — (token, slot) pairs
// are sorted by expert, each expert runs once on its contiguous slice, and the weighted
// outputs are scattered back. No capacity limit, no token dropped.
//
// Each expert's three matrices are separate parameters so that single experts can be frozen:
// set_expert_trainable(e, false) turns off requires_grad, after which autograd computes no
// weight gradient for that expert while input gradients still flow through it.
#pragma once

#include <torch/nn/module.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/pimpl.h>

#include "spes/config/config.h"

namespace spes {

// expert(x) = down_proj(SiLU(gate_proj(x)) * up_proj(x)); gate/up: [F, d], down: [d, F].
// Weights stored in another dtype than x (bf16 frozen experts) are cast to x's dtype for the
// product, unless autocast already decides the dtype.
class ExpertImpl : public torch::nn::Module {
 public:
  ExpertImpl(std::int64_t d_model, std::int64_t d_ff);
  torch::Tensor forward(const torch::Tensor& x);
  torch::nn::Linear gate_proj{nullptr}, up_proj{nullptr}, down_proj{nullptr};
};
TORCH_MODULE(Expert);

struct MoeOutput {
  torch::Tensor y;              // [T, d]
  torch::Tensor load_balance;   // scalar: E * sum_e f_e * P_e
  torch::Tensor router_z;       // scalar: mean over tokens of logsumexp(router logits)^2
  torch::Tensor expert_counts;  // [E] int64: (token, slot) pairs routed to each expert
};

// The routing decision for T tokens (exposed for tests and the reference implementation).
struct Routing {
  torch::Tensor logits;   // [T, E]
  torch::Tensor probs;    // [T, E] softmax over all experts
  torch::Tensor weights;  // [T, k] combine weights (renormalized when configured)
  torch::Tensor experts;  // [T, k] int64 expert indices
};

class MoeLayerImpl : public torch::nn::Module {
 public:
  explicit MoeLayerImpl(const ModelConfig& config);
  // x: [T, d] (tokens flattened)
  MoeOutput forward(const torch::Tensor& x);
  Routing route(const torch::Tensor& x);

  // A frozen expert is stored in `frozen_dtype` (fp32 or bf16) and has no gradient buffer; a
  // trainable one is fp32. The parameter tensors keep their identity (optimizer keys).
  void set_expert_trainable(std::int64_t e, bool trainable, c10::ScalarType frozen_dtype = c10::kFloat);
  bool expert_trainable(std::int64_t e) const;
  Expert& expert(std::int64_t e) { return experts_[static_cast<std::size_t>(e)]; }
  std::int64_t n_experts() const { return n_experts_; }
  std::int64_t top_k() const { return top_k_; }

  torch::nn::Linear gate{nullptr};  // the router (HF name mlp.gate), [E, d]
  torch::nn::ModuleList experts{nullptr};

 private:
  std::int64_t n_experts_, top_k_;
  bool norm_topk_prob_;
  std::vector<Expert> experts_;
};
TORCH_MODULE(MoeLayer);

}  // namespace spes
