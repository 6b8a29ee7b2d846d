#include "spes/train/optimizer.h"

#include <torch/torch.h>

#include <cmath>

namespace spes {

std::unique_ptr<torch::optim::AdamW> make_adamw(const std::vector<torch::Tensor>& trainable,
                                                const OptimConfig& c) {
  std::vector<torch::Tensor> decay, no_decay;
  for (const auto& p : trainable) (p.dim() >= 2 ? decay : no_decay).push_back(p);
  auto options = [&c](double weight_decay) {
    return std::make_unique<torch::optim::AdamWOptions>(
        torch::optim::AdamWOptions(c.lr).betas({c.beta1, c.beta2}).eps(c.eps).weight_decay(weight_decay));
  };
  std::vector<torch::optim::OptimizerParamGroup> groups;
  groups.emplace_back(decay, options(c.weight_decay));
  groups.emplace_back(no_decay, options(0.0));
  return std::make_unique<torch::optim::AdamW>(groups, torch::optim::AdamWOptions(c.lr));
}

void set_learning_rate(torch::optim::Optimizer& optimizer, double lr) {
  for (auto& group : optimizer.param_groups())
    static_cast<torch::optim::AdamWOptions&>(group.options()).lr(lr);
}

double clip_grad_norm(const std::vector<torch::Tensor>& params, double max_norm) {
  torch::NoGradGuard no_grad;
  std::vector<torch::Tensor> grads;
  for (const auto& p : params)
    if (p.grad().defined()) grads.push_back(p.grad());
  if (grads.empty()) return 0.0;
  // Each tensor's squared norm in fp32, added up in double on the device; one value crosses to the host.
  std::vector<torch::Tensor> squares;
  squares.reserve(grads.size());
  for (const auto& g : grads) squares.push_back(g.pow(2).sum().to(torch::kFloat64));
  const double norm = std::sqrt(torch::stack(squares).sum().item<double>());
  if (max_norm > 0 && norm > max_norm) {
    const double scale = max_norm / (norm + 1e-6);
    for (auto& g : grads) g.mul_(scale);
  }
  return norm;
}

TrainingMemory training_memory(const std::vector<torch::Tensor>& all_params,
                               const torch::optim::AdamW& optimizer) {
  TrainingMemory m;
  auto bytes = [](const torch::Tensor& t) {
    return t.defined() ? static_cast<std::int64_t>(t.numel() * t.element_size()) : 0;
  };
  for (const auto& p : all_params) {
    m.weight_bytes += bytes(p);
    if (p.requires_grad()) {
      m.trainable_params += p.numel();
      m.grad_bytes += bytes(p.grad());
    } else {
      m.frozen_grad_bytes += bytes(p.grad());
    }
  }
  for (const auto& entry : optimizer.state()) {
    const auto& s = static_cast<const torch::optim::AdamWParamState&>(*entry.second);
    m.optimizer_bytes += bytes(s.exp_avg()) + bytes(s.exp_avg_sq()) + bytes(s.max_exp_avg_sq());
  }
  return m;
}

}  // namespace spes
