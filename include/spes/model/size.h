// Parameter and FLOP counts of the MoE transformer, computed from its configuration alone
// (no torch). The model's real parameter tensors are checked against these in tests.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "spes/config/config.h"

namespace spes {

struct ParamCounts {
  std::int64_t embedding = 0;   // input embedding V x d
  std::int64_t lm_head = 0;     // output projection V x d (untied)
  std::int64_t attention = 0;   // q, k, v, o projections, all layers
  std::int64_t norms = 0;       // every RMSNorm scale, QK-norms included
  std::int64_t router = 0;      // router matrices, all layers
  std::int64_t one_expert = 0;  // one expert (gate, up, down) in one layer
  std::int64_t experts = 0;     // all experts of all layers
  std::int64_t shared = 0;      // everything that is not an expert
  std::int64_t total = 0;
  std::int64_t active = 0;      // used per token: shared + top_k experts per layer
  std::int64_t trainable = 0;   // shared + the owned experts in every layer
};

ParamCounts count_params(const ModelConfig& model, std::int64_t owned_experts);

// Every parameter tensor's name and shape, in the model's registration order (the names are the
// Hugging Face OLMoE ones without the "model." prefix).
using TensorShapes = std::vector<std::pair<std::string, std::vector<std::int64_t>>>;
TensorShapes parameter_shapes(const ModelConfig& model);

struct StepFlops {
  double forward = 0;   // matmul FLOPs of the forward pass (a multiply-add counts 2)
  double backward = 0;  // input gradients everywhere + weight gradients of trainable matrices
  double total() const { return forward + backward; }
};

// FLOPs of one training step on `tokens` tokens in windows of seq_len, counting the matmuls
// the implementation runs (the full S x S attention matrix, no causal saving).
// frozen_share: fraction of routed (token, slot) pairs that go to frozen experts, whose weight
// gradients are not computed.
StepFlops count_train_flops(const ModelConfig& model, std::int64_t seq_len, std::int64_t tokens,
                            double frozen_share);

}  // namespace spes
