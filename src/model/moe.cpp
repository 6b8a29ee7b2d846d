#include "spes/model/moe.h"

#include <ATen/autocast_mode.h>
#include <torch/torch.h>

namespace spes {

ExpertImpl::ExpertImpl(std::int64_t d_model, std::int64_t d_ff) {
  gate_proj = register_module("gate_proj", torch::nn::Linear(torch::nn::LinearOptions(d_model, d_ff).bias(false)));
  up_proj = register_module("up_proj", torch::nn::Linear(torch::nn::LinearOptions(d_model, d_ff).bias(false)));
  down_proj = register_module("down_proj", torch::nn::Linear(torch::nn::LinearOptions(d_ff, d_model).bias(false)));
}

torch::Tensor ExpertImpl::forward(const torch::Tensor& x) {
  if (gate_proj->weight.scalar_type() == x.scalar_type() || at::autocast::is_autocast_enabled(x.device().type()))
    return down_proj(torch::silu(gate_proj(x)) * up_proj(x));
  auto w = [&](torch::nn::Linear& l) { return l->weight.to(x.scalar_type()); };
  return torch::linear(torch::silu(torch::linear(x, w(gate_proj))) * torch::linear(x, w(up_proj)), w(down_proj));
}

MoeLayerImpl::MoeLayerImpl(const ModelConfig& c)
    : n_experts_(c.n_experts), top_k_(c.top_k), norm_topk_prob_(c.norm_topk_prob) {
  gate = register_module("gate", torch::nn::Linear(torch::nn::LinearOptions(c.d_model, c.n_experts).bias(false)));
  experts = register_module("experts", torch::nn::ModuleList());
  for (std::int64_t e = 0; e < n_experts_; ++e) {
    experts_.push_back(Expert(c.d_model, c.d_ff));
    experts->push_back(experts_.back());
  }
}

Routing MoeLayerImpl::route(const torch::Tensor& x) {
  Routing r;
  r.logits = gate(x);
  r.probs = torch::softmax(r.logits, -1);
  auto [top_w, top_e] = r.probs.topk(top_k_, -1);
  if (norm_topk_prob_) top_w = top_w / top_w.sum(-1, /*keepdim=*/true);
  r.weights = top_w;
  r.experts = top_e;
  return r;
}

MoeOutput MoeLayerImpl::forward(const torch::Tensor& x) {
  const auto T = x.size(0);
  Routing r = route(x);

  // Sort the T*k (token, slot) pairs by expert; a stable sort keeps token order within an
  // expert so results do not depend on the sort implementation.
  auto flat_experts = r.experts.reshape({-1});
  auto sorted = std::get<1>(torch::sort(flat_experts, /*stable=*/true, /*dim=*/0, /*descending=*/false));
  auto token_of_pair = torch::div(sorted, top_k_, "floor");
  auto counts = torch::bincount(flat_experts, {}, n_experts_);
  auto counts_cpu = counts.to(torch::kCPU);
  const auto* count = counts_cpu.data_ptr<std::int64_t>();

  auto x_sorted = x.index_select(0, token_of_pair);
  auto w_sorted = r.weights.reshape({-1}).index_select(0, sorted);
  std::vector<torch::Tensor> outputs;
  outputs.reserve(static_cast<std::size_t>(n_experts_));
  std::int64_t start = 0;
  for (std::int64_t e = 0; e < n_experts_; ++e) {
    if (count[e] == 0) continue;
    outputs.push_back(experts_[static_cast<std::size_t>(e)]->forward(x_sorted.narrow(0, start, count[e])));
    start += count[e];
  }
  auto y_sorted = torch::cat(outputs, 0) * w_sorted.unsqueeze(1);
  auto y = torch::zeros_like(x).index_add_(0, token_of_pair, y_sorted.to(x.scalar_type()));

  MoeOutput out;
  out.y = y;
  auto fraction = counts.to(x.scalar_type()) / static_cast<double>(T * top_k_);  // f_e, no gradient
  out.load_balance = static_cast<double>(n_experts_) * (fraction * r.probs.mean(0)).sum();
  out.router_z = torch::logsumexp(r.logits, -1).pow(2).mean();
  out.expert_counts = counts;
  return out;
}

void MoeLayerImpl::set_expert_trainable(std::int64_t e, bool trainable, c10::ScalarType frozen_dtype) {
  torch::NoGradGuard no_grad;
  const auto dtype = trainable ? torch::kFloat32 : frozen_dtype;
  for (auto& p : experts_.at(static_cast<std::size_t>(e))->parameters()) {
    if (!trainable) p.mutable_grad() = torch::Tensor();
    if (p.scalar_type() != dtype) {
      p.set_requires_grad(false);
      p.set_data(p.to(dtype));
    }
    p.set_requires_grad(trainable);
  }
}

bool MoeLayerImpl::expert_trainable(std::int64_t e) const {
  return experts_.at(static_cast<std::size_t>(e))->gate_proj->weight.requires_grad();
}

}  // namespace spes
