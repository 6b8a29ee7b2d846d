// AdamW over exactly the trainable set (shared parameters + owned experts), with decoupled
// weight decay on matrices only (norm scales are never decayed), global grad-norm clipping,
// and the byte accounting the memory benchmark reports.
#pragma once

#include <torch/optim/adamw.h>

#include <memory>
#include <vector>

#include "spes/config/config.h"

namespace spes {

class MoeTransformerImpl;

// Two parameter groups in a fixed order: 0 = decayed matrices, 1 = norm scales (no decay).
std::unique_ptr<torch::optim::AdamW> make_adamw(const std::vector<torch::Tensor>& trainable,
                                                const OptimConfig& config);
void set_learning_rate(torch::optim::Optimizer& optimizer, double lr);

// Global L2 norm of the gradients; scales them down to max_norm when larger (max_norm 0 = off).
double clip_grad_norm(const std::vector<torch::Tensor>& params, double max_norm);

struct TrainingMemory {
  std::int64_t weight_bytes = 0;     // every parameter at its storage dtype (bf16 frozen experts: 2 B)
  std::int64_t trainable_params = 0;
  std::int64_t grad_bytes = 0;       // allocated gradient buffers
  std::int64_t optimizer_bytes = 0;  // AdamW moments
  std::int64_t frozen_grad_bytes = 0;  // gradient buffers on frozen parameters (should be 0)
};
TrainingMemory training_memory(const std::vector<torch::Tensor>& all_params,
                               const torch::optim::AdamW& optimizer);

}  // namespace spes
