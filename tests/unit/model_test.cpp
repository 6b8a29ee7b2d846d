// The decoder's parts against direct formulas, its parameter layout and its initialization.
#include <gtest/gtest.h>

#include "spes/model/layers.h"
#include "spes/model/size.h"
#include "spes/model/transformer.h"
#include "torch_helpers.h"

namespace spes {
namespace {

std::int64_t numel(const std::vector<torch::Tensor>& ts) {
  std::int64_t n = 0;
  for (const auto& t : ts) n += t.numel();
  return n;
}

TEST(Model, ParameterCountsMatchTheSizeFormula) {
  Config c = test::tiny_config();
  for (auto variant : {std::vector<std::string>{}, std::vector<std::string>{"model.n_kv_heads=2", "model.qk_norm=per_head"},
                       std::vector<std::string>{"model.qk_norm=none"}}) {
    Config v = test::tiny_config(variant);
    MoeTransformer model(v.model, 1);
    ParamCounts p = count_params(v.model, v.model.n_experts);
    EXPECT_EQ(numel(model->parameters()), p.total);
    std::int64_t experts = 0;
    for (const auto& np : model->named_parameters())
      if (MoeTransformerImpl::is_expert_parameter(np.key())) experts += np.value().numel();
    EXPECT_EQ(experts, p.experts);
  }
  (void)c;
}

TEST(Model, ParameterNamesFollowTheOlmoeLayout) {
  Config c = test::tiny_config();
  MoeTransformer model(c.model, 1);
  auto params = model->named_parameters();
  for (const char* name : {"embed_tokens.weight", "layers.0.input_layernorm.weight", "layers.0.self_attn.q_proj.weight",
                           "layers.0.self_attn.k_proj.weight", "layers.0.self_attn.v_proj.weight",
                           "layers.0.self_attn.o_proj.weight", "layers.0.self_attn.q_norm.weight",
                           "layers.0.self_attn.k_norm.weight", "layers.1.post_attention_layernorm.weight",
                           "layers.1.mlp.gate.weight", "layers.1.mlp.experts.7.gate_proj.weight",
                           "layers.1.mlp.experts.7.up_proj.weight", "layers.1.mlp.experts.7.down_proj.weight",
                           "norm.weight", "lm_head.weight"})
    EXPECT_NE(params.find(name), nullptr) << name;
  EXPECT_EQ(params["layers.0.mlp.experts.0.gate_proj.weight"].sizes(), (std::vector<std::int64_t>{128, 64}));
  EXPECT_EQ(params["layers.0.mlp.experts.0.down_proj.weight"].sizes(), (std::vector<std::int64_t>{64, 128}));
  EXPECT_TRUE(MoeTransformerImpl::is_expert_parameter("layers.12.mlp.experts.3.up_proj.weight"));
  EXPECT_FALSE(MoeTransformerImpl::is_expert_parameter("layers.1.mlp.gate.weight"));
}

TEST(Model, TruncatedNormalInitFromTheSeedAlone) {
  Config c = test::tiny_config();
  MoeTransformer a(c.model, 42), b(c.model, 42), other(c.model, 43);
  auto pa = a->named_parameters(), pb = b->named_parameters(), po = other->named_parameters();
  for (const auto& item : pa) {
    const auto& t = item.value();
    EXPECT_TRUE(torch::equal(t, pb[item.key()])) << item.key();
    if (t.dim() >= 2) {
      EXPECT_FALSE(torch::equal(t, po[item.key()])) << item.key();
      EXPECT_LE(t.abs().max().item<double>(), 3 * 0.02 + 1e-7) << item.key();
    } else {
      EXPECT_TRUE(torch::equal(t, torch::ones_like(t))) << item.key();
    }
  }
  auto big = pa["lm_head.weight"];
  // A normal truncated at 3 sigma has std 0.02 * 0.9866.
  EXPECT_NEAR(big.std().item<double>(), 0.02 * 0.9866, 0.0005);
  EXPECT_NEAR(big.mean().item<double>(), 0.0, 0.0005);
}

TEST(Layers, RmsNormMatchesFormula) {
  RMSNorm norm(8, 1e-6);
  torch::manual_seed(1);
  torch::nn::init::normal_(norm->weight);
  auto x = torch::randn({3, 5, 8});
  auto expected = x / torch::sqrt((x * x).mean(-1, true) + 1e-6) * norm->weight;
  EXPECT_LT(test::max_abs_diff(norm(x), expected), 1e-6);
}

TEST(Layers, RopeRotatesPairsAndDependsOnRelativePosition) {
  const std::int64_t hd = 8, S = 10;
  auto rope = rope_tables(S, hd, 10000.0);
  torch::manual_seed(2);
  auto q = torch::randn({hd}), k = torch::randn({hd});
  auto place = [&](const torch::Tensor& v) { return v.expand({1, 1, S, hd}).contiguous(); };
  auto rq = apply_rope(place(q), rope)[0][0], rk = apply_rope(place(k), rope)[0][0];
  EXPECT_LT(test::max_abs_diff(rq[0], q), 1e-6);  // position 0 is unrotated
  EXPECT_NEAR(rq[7].norm().item<double>(), q.norm().item<double>(), 1e-5);
  // <R_m q, R_n k> depends on m - n only.
  EXPECT_NEAR(rq[5].dot(rk[2]).item<double>(), rq[7].dot(rk[4]).item<double>(), 1e-5);
  // Rotate-half layout: element i pairs with element i + hd/2, at angle pos / theta^(2i/hd).
  const double angle = 3.0 / std::pow(10000.0, 2.0 * 1 / hd);
  const double expected = q[1].item<double>() * std::cos(angle) - q[1 + hd / 2].item<double>() * std::sin(angle);
  EXPECT_NEAR(rq[3][1].item<double>(), expected, 1e-5);
}

TEST(Layers, CausalAttentionMatchesPerPositionSoftmax) {
  torch::manual_seed(3);
  auto q = torch::randn({2, 3, 6, 4}), k = torch::randn({2, 3, 6, 4}), v = torch::randn({2, 3, 6, 4});
  auto out = causal_attention(q, k, v);
  for (std::int64_t i = 0; i < 6; ++i) {
    auto scores = torch::matmul(q.select(2, i).unsqueeze(2), k.narrow(2, 0, i + 1).transpose(-2, -1)) / 2.0;
    auto expected = torch::matmul(torch::softmax(scores, -1), v.narrow(2, 0, i + 1)).squeeze(2);
    EXPECT_LT(test::max_abs_diff(out.select(2, i), expected), 1e-5) << i;
  }
}

TEST(Model, ForwardIsCausalAndLossTermsMatchFormulas) {
  Config c = test::tiny_config({"model.n_kv_heads=2"});
  MoeTransformer model(c.model, 7);
  torch::manual_seed(4);
  auto ids = torch::randint(0, c.model.vocab_size, {2, 16}, torch::kInt64);
  ModelOutput out = model->forward(ids);
  EXPECT_EQ(out.logits.sizes(), (std::vector<std::int64_t>{2, 16, c.model.vocab_size}));
  ASSERT_EQ(out.load_balance.size(), 2u);
  auto changed = ids.clone();
  changed[0][10] = (changed[0][10].item<std::int64_t>() + 1) % c.model.vocab_size;
  ModelOutput out2 = model->forward(changed);
  EXPECT_LT(test::max_abs_diff(out.logits[0].narrow(0, 0, 10), out2.logits[0].narrow(0, 0, 10)), 1e-5);
  EXPECT_GT(test::max_abs_diff(out.logits[0][10], out2.logits[0][10]), 1e-4);

  auto targets = torch::randint(0, c.model.vocab_size, {2, 16}, torch::kInt64);
  LossTerms t = compute_loss(out, targets, c.loss);
  auto flat = out.logits.reshape({32, -1});
  auto ce = torch::nn::functional::cross_entropy(flat, targets.reshape({-1}));
  EXPECT_NEAR(t.ce.item<double>(), ce.item<double>(), 1e-5);
  EXPECT_NEAR(t.z_loss.item<double>(), torch::logsumexp(flat, -1).pow(2).mean().item<double>(), 1e-4);
  EXPECT_NEAR(t.load_balance.item<double>(), (out.load_balance[0] + out.load_balance[1]).item<double>(), 1e-6);
  const double total = t.ce.item<double>() + 1e-5 * t.z_loss.item<double>() + 0.01 * t.load_balance.item<double>() +
                       0.001 * t.router_z.item<double>();
  EXPECT_NEAR(t.total.item<double>(), total, 1e-5);
  // An untrained model's loss is near ln(V).
  EXPECT_NEAR(t.ce.item<double>(), std::log(512.0), 0.2);
}

}  // namespace
}  // namespace spes
