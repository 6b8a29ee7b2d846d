// Using models outside training: the KV cache against full recomputation, sampling, upcycling
// against the dense model, and the tensor list the checkpoint tools rely on.
#include <gtest/gtest.h>

#include <map>

#include "spes/ckpt/upcycle.h"
#include "spes/data/loader.h"
#include "spes/data/shard.h"
#include "spes/model/size.h"
#include "spes/train/inference.h"
#include "torch_helpers.h"

namespace spes {
namespace {

ModelConfig test_model(std::int64_t experts, QkNorm qk = QkNorm::Full) {
  ModelConfig m;
  m.vocab_size = 64;
  m.d_model = 32;
  m.n_layers = 2;
  m.n_heads = 4;
  m.n_kv_heads = 2;
  m.d_ff = 48;
  m.n_experts = experts;
  m.top_k = experts > 1 ? 2 : 1;
  m.qk_norm = qk;
  m.max_seq_len = 40;
  return m;
}

// A weights-only folder holding the model's current weights.
Shard folder_of(MoeTransformer& model) {
  Shard s;
  s.info.kind = "imported";
  s.info.node_id = -1;
  s.info.config_fields = model_fields(model->config());
  for (const auto& item : model->named_parameters()) {
    auto t = item.value().contiguous();
    s.model[item.key()] = {t.sizes().vec(), std::vector<float>(t.data_ptr<float>(), t.data_ptr<float>() + t.numel())};
  }
  return s;
}

TEST(ParameterShapes, MatchTheModelsTensorsInOrder) {
  for (QkNorm qk : {QkNorm::None, QkNorm::Full, QkNorm::PerHead}) {
    const ModelConfig m = test_model(3, qk);
    MoeTransformer model(m, 1);
    const auto shapes = parameter_shapes(m);
    const auto params = model->named_parameters();
    ASSERT_EQ(shapes.size(), params.size());
    for (std::size_t i = 0; i < shapes.size(); ++i) {
      EXPECT_EQ(shapes[i].first, params[i].key());
      EXPECT_EQ(shapes[i].second, params[i].value().sizes().vec()) << shapes[i].first;
    }
  }
}

// Which validation tokens count must not depend on the batch size: a run with 4x the batch
// (the centralized side of the quality experiment) is compared with SPES nodes on the same windows.
TEST(Evaluate, SameWindowsWhateverTheBatchSize) {
  ModelConfig m = test_model(4);
  m.vocab_size = 512;  // the tiny fixture's vocabulary
  MoeTransformer model(m, 5);
  const TokenShard val(std::filesystem::path(test::tiny_data_dir()) / "val.bin");
  const EvalStats one = evaluate_model(model, val, 32, 1, 10);
  EXPECT_EQ(one.tokens, 10 * 32);
  for (std::int64_t batch : {3, 4, 10, 64}) {
    const EvalStats e = evaluate_model(model, val, 32, batch, 10);
    EXPECT_EQ(e.tokens, one.tokens) << "batch " << batch;
    EXPECT_NEAR(e.loss, one.loss, 1e-5) << "batch " << batch;
  }
  // A different window set gives a different loss (the comparison above can fail).
  EXPECT_GT(std::abs(evaluate_model(model, val, 32, 4, 11).loss - one.loss), 1e-6);
  // 0 = every whole window once.
  EXPECT_EQ(evaluate_model(model, val, 32, 64, 0).tokens, validation_windows(val, 32) * 32);
}

// Feeding a sequence in pieces through the cache gives the logits of one full forward pass.
TEST(KvCache, ChunkedForwardEqualsTheFullPass) {
  torch::NoGradGuard no_grad;
  for (QkNorm qk : {QkNorm::Full, QkNorm::PerHead}) {
    MoeTransformer model(test_model(4, qk), 7);
    auto ids = torch::randint(0, 64, {2, 23}, torch::TensorOptions().dtype(torch::kInt64));
    auto full = model->forward(ids).logits;
    KvCache cache;
    std::vector<torch::Tensor> parts;
    std::int64_t at = 0;
    for (std::int64_t len : {5, 1, 9, 1, 7}) {
      parts.push_back(model->forward_cached(ids.narrow(1, at, len), cache));
      at += len;
    }
    EXPECT_EQ(cache.length(), 23);
    EXPECT_LT(test::max_abs_diff(torch::cat(parts, 1), full), 1e-5);
  }
}

TEST(Generate, CacheMatchesRecomputationAndSeedsRepeat) {
  MoeTransformer model(test_model(4), 3);
  const std::vector<std::uint32_t> prompt{5, 17, 33, 2};
  GenerateOptions o;
  o.max_tokens = 20;
  o.sampling.temperature = 0.9;
  o.sampling.top_k = 20;
  o.sampling.top_p = 0.95;
  o.seed = 11;
  const auto cached = generate(model, prompt, o);
  EXPECT_EQ(cached.size(), 20u);
  EXPECT_EQ(generate(model, prompt, o), cached);  // deterministic under a seed
  o.use_cache = false;
  EXPECT_EQ(generate(model, prompt, o), cached);  // the cache changes nothing
  o.seed = 12;
  EXPECT_NE(generate(model, prompt, o), cached);
  o.max_tokens = 100;  // stops at the context (40 positions)
  EXPECT_EQ(generate(model, prompt, o).size(), 36u);
  o.stop_token = cached[2];
  o.seed = 11;
  o.use_cache = true;
  o.max_tokens = 20;
  EXPECT_LE(generate(model, prompt, o).size(), 3u);
}

TEST(Sampling, FollowsTemperatureTopKAndTopP) {
  const std::vector<float> logits{1.0f, 3.0f, 2.0f, 3.0f};
  std::mt19937_64 rng(1);
  SamplingOptions greedy;
  greedy.temperature = 0;
  EXPECT_EQ(sample_token(logits, greedy, rng), 1u);  // ties go to the lower id
  SamplingOptions top1;
  top1.top_k = 1;
  EXPECT_EQ(sample_token(logits, top1, rng), 1u);
  // Plain sampling at temperature 1 follows the softmax.
  std::map<std::uint32_t, int> counts;
  const int draws = 40000;
  for (int i = 0; i < draws; ++i) ++counts[sample_token(logits, SamplingOptions{}, rng)];
  double z = 0;
  for (float l : logits) z += std::exp(l);
  for (std::uint32_t id = 0; id < 4; ++id)
    EXPECT_NEAR(counts[id] / static_cast<double>(draws), std::exp(logits[id]) / z, 0.01) << id;
  // top-p 0.6 keeps the two tokens of logit 3 (together 0.66), never the others.
  SamplingOptions nucleus;
  nucleus.top_p = 0.6;
  counts.clear();
  for (int i = 0; i < 2000; ++i) ++counts[sample_token(logits, nucleus, rng)];
  EXPECT_EQ(counts[0] + counts[2], 0);
  EXPECT_GT(counts[1], 800);
  EXPECT_GT(counts[3], 800);
}

// Upcycling with no noise and renormalized top-k weights keeps the dense model's function: every
// expert is the dense MLP and the weights of the chosen experts add up to one.
TEST(Upcycle, WithoutNoiseGivesTheDenseModelsLogits) {
  torch::NoGradGuard no_grad;
  for (const char* router : {"zeros", "normal"}) {
    MoeTransformer dense(test_model(1), 5);
    auto ids = torch::randint(0, 64, {2, 17}, torch::TensorOptions().dtype(torch::kInt64));
    auto want = dense->forward(ids).logits;
    UpcycleOptions o;
    o.n_experts = 6;
    o.top_k = 2;
    o.noise_std = 0;
    o.router = router;
    MoeTransformer moe = build_model(upcycle(folder_of(dense), o));
    EXPECT_EQ(moe->config().n_experts, 6);
    EXPECT_LT(test::max_abs_diff(moe->forward(ids).logits, want), 1e-5) << router;
    o.noise_std = 0.02;  // with noise the experts differ, and so do the logits
    MoeTransformer noisy = build_model(upcycle(folder_of(dense), o));
    EXPECT_GT(test::max_abs_diff(noisy->forward(ids).logits, want), 1e-4) << router;
  }
}

}  // namespace
}  // namespace spes
