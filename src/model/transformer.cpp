#include "spes/model/transformer.h"

#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include <regex>

#include "spes/model/init.h"
#include "spes/util/error.h"

namespace spes {

BlockImpl::BlockImpl(const ModelConfig& c) {
  input_layernorm = register_module("input_layernorm", RMSNorm(c.d_model, c.rms_eps));
  self_attn = register_module("self_attn", Attention(c));
  post_attention_layernorm = register_module("post_attention_layernorm", RMSNorm(c.d_model, c.rms_eps));
  mlp = register_module("mlp", MoeLayer(c));
}

torch::Tensor BlockImpl::forward(const torch::Tensor& x, const RopeTables& rope, MoeOutput& moe_out, KvLayer* cache) {
  auto h = x + self_attn(input_layernorm(x), rope, cache);
  const auto B = h.size(0), S = h.size(1), d = h.size(2);
  moe_out = mlp(post_attention_layernorm(h).reshape({B * S, d}));
  auto y = h + moe_out.y.view({B, S, d});
  moe_out.y = torch::Tensor();
  return y;
}

LossTerms compute_loss(const ModelOutput& out, const torch::Tensor& targets, const LossConfig& w) {
  const auto V = out.logits.size(-1);
  // In fp32 whatever the forward's precision (bf16 logits under autocast).
  auto logits = out.logits.reshape({-1, V}).to(torch::kFloat32);
  // One logsumexp serves both the cross-entropy and the output z-loss.
  auto lse = torch::logsumexp(logits, -1);
  auto target_logit = logits.gather(1, targets.reshape({-1, 1})).squeeze(1);
  LossTerms t;
  t.ce = (lse - target_logit).mean();
  t.z_loss = lse.pow(2).mean();
  t.load_balance = torch::stack(out.load_balance).sum();
  t.router_z = torch::stack(out.router_z).sum();
  t.total = t.ce + w.z_loss * t.z_loss + w.load_balance * t.load_balance + w.router_z_loss * t.router_z;
  return t;
}

MoeTransformerImpl::MoeTransformerImpl(const ModelConfig& c, std::uint64_t seed) : config_(c) {
  embed_tokens = register_module("embed_tokens", torch::nn::Embedding(c.vocab_size, c.d_model));
  layers = register_module("layers", torch::nn::ModuleList());
  for (std::int64_t l = 0; l < c.n_layers; ++l) {
    blocks_.push_back(Block(c));
    layers->push_back(blocks_.back());
  }
  norm = register_module("norm", RMSNorm(c.d_model, c.rms_eps));
  lm_head = register_module("lm_head", torch::nn::Linear(torch::nn::LinearOptions(c.d_model, c.vocab_size).bias(false)));
  initialize(seed);
}

void MoeTransformerImpl::initialize(std::uint64_t seed) {
  // Every matrix (embeddings, attention, router, experts, head) gets the truncated normal;
  // norm scales stay at one. Parameters are visited in registration order, so the weights
  // depend on the seed and the shapes only.
  at::Generator gen = at::detail::createCPUGenerator(seed);
  torch::NoGradGuard no_grad;
  for (auto& p : named_parameters()) {
    auto t = p.value();
    if (t.dim() >= 2) trunc_normal_(t, config_.init_std, 3.0, gen);
  }
}

const RopeTables& MoeTransformerImpl::rope_for(std::int64_t seq_len) {
  if (!rope_.cos.defined() || rope_.cos.size(0) < seq_len || rope_.cos.device() != device()) {
    rope_ = rope_tables(seq_len, config_.head_dim(), config_.rope_theta);
    rope_.cos = rope_.cos.to(device());
    rope_.sin = rope_.sin.to(device());
  }
  return rope_;
}

ModelOutput MoeTransformerImpl::forward(const torch::Tensor& input_ids) {
  const auto S = input_ids.size(1);
  if (S > config_.max_seq_len)
    raise(ErrorKind::Usage, "sequence of {} tokens exceeds model.max_seq_len {}", S, config_.max_seq_len);
  const RopeTables& full = rope_for(S);
  RopeTables rope{full.cos.narrow(0, 0, S), full.sin.narrow(0, 0, S)};

  ModelOutput out;
  auto x = embed_tokens(input_ids);
  for (auto& block : blocks_) {
    MoeOutput aux;
    x = block->forward(x, rope, aux);
    out.load_balance.push_back(aux.load_balance);
    out.router_z.push_back(aux.router_z);
    out.expert_counts.push_back(aux.expert_counts);
  }
  out.logits = lm_head(norm(x));
  return out;
}

torch::Tensor MoeTransformerImpl::forward_cached(const torch::Tensor& input_ids, KvCache& cache) {
  const auto past = cache.length(), S = input_ids.size(1);
  if (past + S > config_.max_seq_len)
    raise(ErrorKind::Usage, "{} cached + {} new tokens exceed model.max_seq_len {}", past, S, config_.max_seq_len);
  const RopeTables& full = rope_for(past + S);
  RopeTables rope{full.cos.narrow(0, past, S), full.sin.narrow(0, past, S)};
  cache.layers.resize(blocks_.size());
  auto x = embed_tokens(input_ids);
  for (std::size_t l = 0; l < blocks_.size(); ++l) {
    MoeOutput aux;
    x = blocks_[l]->forward(x, rope, aux, &cache.layers[l]);
  }
  return lm_head(norm(x));
}

void MoeTransformerImpl::set_owned_experts(const std::vector<int>& owned, c10::ScalarType frozen_dtype) {
  std::vector<bool> is_owned(static_cast<std::size_t>(config_.n_experts), false);
  for (int e : owned) {
    if (e < 0 || e >= config_.n_experts)
      raise(ErrorKind::Config, "owned expert {} is out of range 0..{}", e, config_.n_experts - 1);
    is_owned[static_cast<std::size_t>(e)] = true;
  }
  for (auto& block : blocks_)
    for (std::int64_t e = 0; e < config_.n_experts; ++e) block->mlp->set_expert_trainable(e, is_owned[e], frozen_dtype);
}

std::vector<torch::Tensor> MoeTransformerImpl::trainable_parameters() const {
  std::vector<torch::Tensor> out;
  for (const auto& p : parameters())
    if (p.requires_grad()) out.push_back(p);
  return out;
}

bool MoeTransformerImpl::is_expert_parameter(const std::string& name) {
  static const std::regex pattern(R"(layers\.\d+\.mlp\.experts\.\d+\..*)");
  return std::regex_match(name, pattern);
}

}  // namespace spes
