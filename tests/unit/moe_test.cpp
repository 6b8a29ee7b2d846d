// The grouped-dispatch MoE layer against a naive per-token loop, and frozen-expert behaviour.
#include <gtest/gtest.h>

#include "spes/model/moe.h"
#include "spes/model/transformer.h"
#include "torch_helpers.h"

namespace spes {
namespace {

ModelConfig moe_config(bool renormalize) {
  ModelConfig c;
  c.vocab_size = 32;
  c.d_model = 16;
  c.n_layers = 1;
  c.n_heads = 2;
  c.d_ff = 24;
  c.n_experts = 6;
  c.top_k = 2;
  c.norm_topk_prob = renormalize;
  return c;
}

// y_t = sum over t's top-k experts e of w_te * expert_e(x_t), one token at a time.
torch::Tensor naive_moe(MoeLayerImpl& layer, const torch::Tensor& x, std::int64_t top_k, bool renormalize) {
  std::vector<torch::Tensor> rows;
  for (std::int64_t t = 0; t < x.size(0); ++t) {
    auto xt = x[t].unsqueeze(0);
    auto probs = torch::softmax(torch::matmul(xt, layer.gate->weight.t()), -1).squeeze(0);
    auto [w, e] = probs.topk(top_k);
    if (renormalize) w = w / w.sum();
    auto y = torch::zeros({1, x.size(1)});
    for (std::int64_t j = 0; j < top_k; ++j) {
      auto& ex = layer.expert(e[j].item<std::int64_t>());
      auto h = torch::silu(torch::matmul(xt, ex->gate_proj->weight.t())) * torch::matmul(xt, ex->up_proj->weight.t());
      y = y + w[j] * torch::matmul(h, ex->down_proj->weight.t());
    }
    rows.push_back(y);
  }
  return torch::cat(rows, 0);
}

void expect_grads_match(MoeLayer& layer, bool renormalize) {
  torch::manual_seed(3);
  for (auto& p : layer->parameters()) torch::nn::init::normal_(p, 0, 0.3);
  auto x = torch::randn({40, 16}, torch::requires_grad());
  auto upstream = torch::randn({40, 16});

  auto fast = layer->forward(x).y;
  (fast * upstream).sum().backward();
  auto fast_x_grad = x.grad().clone();
  std::vector<torch::Tensor> fast_grads;
  for (auto& p : layer->parameters()) fast_grads.push_back(p.grad().defined() ? p.grad().clone() : torch::zeros_like(p));

  x.grad().zero_();
  for (auto& p : layer->parameters())
    if (p.grad().defined()) p.grad().zero_();
  auto slow = naive_moe(*layer, x, 2, renormalize);
  (slow * upstream).sum().backward();

  EXPECT_LT(test::max_abs_diff(fast, slow), 1e-5);
  EXPECT_LT(test::max_abs_diff(fast_x_grad, x.grad()), 1e-5);
  auto params = layer->named_parameters();
  for (std::size_t i = 0; i < params.size(); ++i) {
    auto slow_grad = params[i].value().grad().defined() ? params[i].value().grad() : torch::zeros_like(params[i].value());
    // Relative to the gradient's scale: the summation order of the BLAS differs between the paths.
    const double scale = std::max(1.0, slow_grad.abs().max().item<double>());
    EXPECT_LT(test::max_abs_diff(fast_grads[i], slow_grad), 1e-5 * scale) << params[i].key();
  }
}

TEST(Moe, GroupedDispatchEqualsNaiveLoopForwardAndGradients) {
  MoeLayer layer(moe_config(false));
  expect_grads_match(layer, false);
}

TEST(Moe, RenormalizedTopKEqualsNaiveLoop) {
  MoeLayer layer(moe_config(true));
  expect_grads_match(layer, true);
  auto r = layer->route(torch::randn({10, 16}));
  EXPECT_LT(test::max_abs_diff(r.weights.sum(-1), torch::ones({10})), 1e-6);
}

TEST(Moe, AuxiliaryLossesFollowTheirFormulas) {
  MoeLayer layer(moe_config(false));
  torch::manual_seed(4);
  auto x = torch::randn({50, 16});
  MoeOutput out = layer->forward(x);
  Routing r = layer->route(x);
  auto counts = torch::zeros({6});
  for (std::int64_t t = 0; t < 50; ++t)
    for (std::int64_t j = 0; j < 2; ++j) counts[r.experts[t][j].item<std::int64_t>()] += 1;
  EXPECT_TRUE(torch::equal(out.expert_counts, counts.to(torch::kInt64)));
  EXPECT_EQ(out.expert_counts.sum().item<std::int64_t>(), 100);  // dropless: every pair is routed
  double lb = 0;
  for (int e = 0; e < 6; ++e) lb += counts[e].item<double>() / 100.0 * r.probs.select(1, e).mean().item<double>();
  EXPECT_NEAR(out.load_balance.item<double>(), 6 * lb, 1e-6);
  double z = 0;
  for (std::int64_t t = 0; t < 50; ++t) z += std::pow(torch::logsumexp(r.logits[t], 0).item<double>(), 2);
  EXPECT_NEAR(out.router_z.item<double>(), z / 50, 1e-5);
}

TEST(Moe, FrozenExpertsGetNoWeightGradientButPassInputGradients) {
  MoeLayer layer(moe_config(false));
  torch::manual_seed(5);
  auto x = torch::randn({64, 16}, torch::requires_grad());
  auto upstream = torch::randn({64, 16});
  (layer->forward(x).y * upstream).sum().backward();
  auto x_grad_trainable = x.grad().clone();
  auto router_grad_trainable = layer->gate->weight.grad().clone();

  layer->zero_grad();
  x.grad().zero_();
  for (std::int64_t e = 1; e < 6; ++e) layer->set_expert_trainable(e, false);
  for (auto& p : layer->parameters()) p.mutable_grad() = torch::Tensor();
  (layer->forward(x).y * upstream).sum().backward();

  for (std::int64_t e = 1; e < 6; ++e) {
    EXPECT_FALSE(layer->expert_trainable(e));
    for (auto& p : layer->expert(e)->parameters()) EXPECT_FALSE(p.grad().defined());
  }
  EXPECT_TRUE(layer->expert(0)->gate_proj->weight.grad().defined());
  // Freezing changes nothing upstream: the same input and router gradients.
  EXPECT_TRUE(torch::allclose(x.grad(), x_grad_trainable, 0, 1e-7));
  EXPECT_TRUE(torch::allclose(layer->gate->weight.grad(), router_grad_trainable, 0, 1e-7));
}

TEST(Moe, ModelRoutesTokensOfFrozenExpertsIntoRouterAndAttentionGradients) {
  Config c = test::tiny_config();
  MoeTransformer model(c.model, 11);
  model->set_owned_experts({0});
  torch::manual_seed(6);
  auto ids = torch::randint(0, c.model.vocab_size, {2, 32}, torch::kInt64);
  ModelOutput out = model->forward(ids);
  // Keep only the loss of tokens whose every expert in the last layer is frozen: rerun the
  // model up to the last router to see where each token went.
  Routing r;
  {
    torch::NoGradGuard no_grad;
    const auto rope = rope_tables(32, c.model.head_dim(), c.model.rope_theta);
    auto x = model->embed_tokens(ids);
    for (std::int64_t l = 0; l + 1 < c.model.n_layers; ++l) {
      MoeOutput aux;
      x = model->block(l)->forward(x, rope, aux);
    }
    auto& last = model->block(c.model.n_layers - 1);
    auto h = x + last->self_attn(last->input_layernorm(x), rope);
    r = last->mlp->route(last->post_attention_layernorm(h).reshape({64, c.model.d_model}));
  }
  auto frozen_only = (r.experts != 0).all(1).to(torch::kFloat32);  // [64]
  ASSERT_GT(frozen_only.sum().item<double>(), 10);
  auto per_token = torch::logsumexp(out.logits.reshape({64, -1}), -1);
  (per_token * frozen_only).sum().backward();
  auto& last = model->block(c.model.n_layers - 1);
  EXPECT_GT(last->mlp->gate->weight.grad().abs().sum().item<double>(), 0);
  EXPECT_GT(model->block(0)->self_attn->q_proj->weight.grad().abs().sum().item<double>(), 0);
  EXPECT_GT(model->embed_tokens->weight.grad().abs().sum().item<double>(), 0);
  for (std::int64_t e = 1; e < c.model.n_experts; ++e)
    EXPECT_FALSE(last->mlp->expert(e)->down_proj->weight.grad().defined());
}

}  // namespace
}  // namespace spes
