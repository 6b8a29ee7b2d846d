// The OLMoE-style MoE decoder (see shared SPES.md): pre-norm blocks
//   h = x + Attn(RMSNorm(x));  y = h + MoE(RMSNorm(h)),
// untied embedding and LM head, no biases, no dropout, truncated-normal init.
//
// forward() returns the logits together with every layer's auxiliary terms (never stored as
// members: see LIBTORCH-NOTES on evaluation order). compute_loss() combines them with the
// configured weights and reports each term on its own.
#pragma once

#include <torch/nn/module.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/pimpl.h>

#include <string>
#include <vector>

#include "spes/config/config.h"
#include "spes/model/layers.h"
#include "spes/model/moe.h"

namespace spes {

class BlockImpl : public torch::nn::Module {
 public:
  explicit BlockImpl(const ModelConfig& config);
  // x: [B, S, d]; aux terms of this layer go to `moe_out` (its y is cleared). With a cache, x
  // continues the cached positions (see AttentionImpl::forward).
  torch::Tensor forward(const torch::Tensor& x, const RopeTables& rope, MoeOutput& moe_out, KvLayer* cache = nullptr);

  RMSNorm input_layernorm{nullptr}, post_attention_layernorm{nullptr};
  Attention self_attn{nullptr};
  MoeLayer mlp{nullptr};
};
TORCH_MODULE(Block);

struct ModelOutput {
  torch::Tensor logits;                       // [B, S, V]
  std::vector<torch::Tensor> load_balance;    // per layer, scalar
  std::vector<torch::Tensor> router_z;        // per layer, scalar
  std::vector<torch::Tensor> expert_counts;   // per layer, [E] int64
};

// Keys and values of every layer for the positions generated so far.
struct KvCache {
  std::vector<KvLayer> layers;
  std::int64_t length() const { return layers.empty() ? 0 : layers.front().length(); }
};

struct LossTerms {
  torch::Tensor total;         // what backward() is called on
  torch::Tensor ce;            // mean token cross-entropy
  torch::Tensor z_loss;        // mean logsumexp(output logits)^2 (unweighted)
  torch::Tensor load_balance;  // summed over layers (unweighted)
  torch::Tensor router_z;      // summed over layers (unweighted)
};

// targets: [B, S] int64.
LossTerms compute_loss(const ModelOutput& out, const torch::Tensor& targets, const LossConfig& weights);

class MoeTransformerImpl : public torch::nn::Module {
 public:
  // Builds and initializes the model from `seed` alone (same weights on every node).
  MoeTransformerImpl(const ModelConfig& config, std::uint64_t seed);
  // input_ids: [B, S] int64, S <= max_seq_len.
  ModelOutput forward(const torch::Tensor& input_ids);
  // The logits [B, S, V] of input_ids [B, S] placed after the cache's positions; appends their
  // keys and values to the cache (an empty cache starts at position 0). No gradient needed.
  torch::Tensor forward_cached(const torch::Tensor& input_ids, KvCache& cache);

  // Freezes every expert not in `owned` (same indices in every layer), stored in `frozen_dtype`,
  // and unfreezes the rest (fp32).
  void set_owned_experts(const std::vector<int>& owned, c10::ScalarType frozen_dtype = c10::kFloat);
  // Where the parameters are (the embedding's device).
  c10::Device device() const { return embed_tokens->weight.device(); }
  // Parameters with requires_grad, in registration order (what the optimizer holds).
  std::vector<torch::Tensor> trainable_parameters() const;
  // True for names of the form layers.{l}.mlp.experts.{e}.*
  static bool is_expert_parameter(const std::string& name);
  const ModelConfig& config() const { return config_; }
  std::int64_t n_layers() const { return static_cast<std::int64_t>(blocks_.size()); }
  Block& block(std::int64_t l) { return blocks_[static_cast<std::size_t>(l)]; }

  torch::nn::Embedding embed_tokens{nullptr};
  torch::nn::ModuleList layers{nullptr};
  RMSNorm norm{nullptr};
  torch::nn::Linear lm_head{nullptr};

 private:
  void initialize(std::uint64_t seed);
  const RopeTables& rope_for(std::int64_t seq_len);
  ModelConfig config_;
  std::vector<Block> blocks_;
  RopeTables rope_;  // cached for the longest sequence seen so far
};
TORCH_MODULE(MoeTransformer);

}  // namespace spes
