// Device placement and precision: the fused attention against the plain one, start-up errors
// for what the machine cannot do, bf16 frozen experts, and the one-transfer host copies that
// sync rounds and checkpoints use. Runs on the CPU; scripts/gpu_check.sh covers the GPU.
#include <gtest/gtest.h>

#include "spes/model/layers.h"
#include "spes/sync/model_params.h"
#include "spes/train/device.h"
#include "spes/train/host_copy.h"
#include "spes/util/error.h"
#include "torch_helpers.h"

namespace spes {
namespace {

TEST(Attention, FusedEqualsPlainForFullCachedAndSingleQueries) {
  torch::manual_seed(7);
  for (auto [S, T] : {std::pair<int, int>{9, 9}, {3, 7}, {1, 6}}) {
    auto q = torch::randn({2, 4, S, 16}), k = torch::randn({2, 4, T, 16}), v = torch::randn({2, 4, T, 16});
    auto plain = causal_attention(q, k, v), fused = fused_causal_attention(q, k, v);
    ASSERT_EQ(fused.sizes(), plain.sizes());
    EXPECT_LT(test::max_abs_diff(fused, plain), 1e-5) << "S=" << S << " T=" << T;
  }
  // The mask is really there: the first query of a full sequence sees only the first value.
  auto q = torch::randn({1, 1, 4, 8}), k = torch::randn({1, 1, 4, 8}), v = torch::randn({1, 1, 4, 8});
  EXPECT_LT(test::max_abs_diff(fused_causal_attention(q, k, v)[0][0][0], v[0][0][0]), 1e-6);
}

std::string config_error_of(const Config& c) {
  try {
    resolve_device_plan(c);
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::Config);
    return e.what();
  }
  return "";
}

TEST(Device, WhatTheMachineCannotDoIsAStartUpErrorNamingTheKey) {
  if (cuda_device_count() > 0) GTEST_SKIP() << "this machine has a GPU";
  std::string msg = config_error_of(test::tiny_config({"train.device=cuda"}));
  EXPECT_NE(msg.find("train.device"), std::string::npos) << msg;
  EXPECT_NE(msg.find("has none visible"), std::string::npos) << msg;
  msg = config_error_of(test::tiny_config({"train.device=cuda:1"}));
  EXPECT_NE(msg.find("train.device"), std::string::npos) << msg;
  msg = config_error_of(test::tiny_config({"train.precision=bf16"}));
  EXPECT_NE(msg.find("train.precision"), std::string::npos) << msg;
  EXPECT_NE(msg.find("bf16 needs a CUDA device"), std::string::npos) << msg;
  // auto falls back to the CPU in fp32.
  DevicePlan plan = resolve_device_plan(test::tiny_config());
  EXPECT_TRUE(plan.device.is_cpu());
  EXPECT_FALSE(plan.bf16_autocast);
  EXPECT_NE(plan.describe().find("cpu, fp32, frozen experts fp32"), std::string::npos) << plan.describe();
}

TEST(Device, BadDeviceAndPrecisionValuesAreConfigErrors) {
  for (std::string bad : {"train.device=gpu", "train.device=cuda:x", "train.precision=fp16", "train.frozen_dtype=int8"}) {
    try {
      test::tiny_config({bad});
      ADD_FAILURE() << bad << " accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(bad.substr(0, bad.find('='))), std::string::npos) << e.what();
    }
  }
}

TEST(HostCopy, OneBufferForMixedDtypesAndBack) {
  torch::manual_seed(1);
  std::vector<torch::Tensor> ts = {torch::randn({3, 4}), torch::randn({5}).to(torch::kBFloat16), torch::randn({2, 2, 2})};
  HostCopy host = copy_to_host(ts);
  ASSERT_EQ(host.flat.numel(), 12 + 5 + 8);
  ASSERT_EQ(host.views.size(), 3u);
  for (std::size_t i = 0; i < ts.size(); ++i) {
    EXPECT_EQ(host.views[i].scalar_type(), torch::kFloat32);
    EXPECT_TRUE(torch::equal(host.views[i], ts[i].to(torch::kFloat32))) << i;
  }
  const float* before = host.flat.data_ptr<float>();
  host.flat.fill_(0.5f);
  copy_from_host(host, ts);
  EXPECT_TRUE(torch::all(ts[0] == 0.5f).item<bool>());
  EXPECT_EQ(ts[1].scalar_type(), torch::kBFloat16);
  EXPECT_TRUE(torch::all(ts[1] == 0.5f).item<bool>());
  // A refill reuses the buffer (the sync engine holds pointers into it).
  HostCopy again = copy_to_host(ts, std::move(host));
  EXPECT_EQ(again.flat.data_ptr<float>(), before);
  EXPECT_TRUE(torch::all(again.flat == 0.5f).item<bool>());
}

bool is_frozen_expert(const std::string& name) {
  return MoeTransformerImpl::is_expert_parameter(name) && name.find("experts.0.") == std::string::npos &&
         name.find("experts.1.") == std::string::npos;
}

TEST(Device, Bf16FrozenExpertsTrainSyncAndChangeHands) {
  Config c = test::tiny_config({"train.owned_experts=[0, 1]", "train.frozen_dtype=bf16", "train.steps=20"});
  Trainer trainer(c, test::quiet());
  auto& model = trainer.model();
  std::int64_t frozen_bytes = 0, fp32_frozen_bytes = 0;
  for (const auto& p : model->named_parameters()) {
    const bool frozen = is_frozen_expert(p.key());
    EXPECT_EQ(p.value().scalar_type(), frozen ? torch::kBFloat16 : torch::kFloat32) << p.key();
    if (frozen) {
      frozen_bytes += p.value().numel() * p.value().element_size();
      fp32_frozen_bytes += p.value().numel() * 4;
    }
  }
  EXPECT_EQ(frozen_bytes * 2, fp32_frozen_bytes);
  std::map<std::string, torch::Tensor> before;
  for (const auto& p : model->named_parameters()) before[p.key()] = p.value().clone();
  for (int i = 0; i < 5; ++i) EXPECT_TRUE(std::isfinite(trainer.step().loss));
  for (const auto& p : model->named_parameters())
    if (is_frozen_expert(p.key())) EXPECT_TRUE(torch::equal(p.value(), before[p.key()])) << p.key();

  // The sync buffers are an fp32 host copy; a round's result comes back rounded to bf16.
  ModelParamMirror mirror(model);
  ASSERT_TRUE(mirror.staged());
  mirror.to_host();
  const ParamSet& set = mirror.params();
  const long i = set.find("layers.0.mlp.experts.5.up_proj.weight");
  ASSERT_GE(i, 0);
  auto frozen = model->block(0)->mlp->expert(5)->up_proj->weight;
  EXPECT_EQ(set[i].data[3], frozen.reshape({-1})[3].item<float>());
  set[i].data[3] = 1.01f;                 // not a bf16 value: rounds to 1 + 2^-7
  const long j = set.find("layers.0.mlp.experts.0.up_proj.weight");
  set[j].data[3] = 0.123456789f;          // an owned (fp32) expert keeps every bit
  mirror.to_model();
  EXPECT_EQ(frozen.reshape({-1})[3].item<float>(), 1.0078125f);
  EXPECT_EQ(model->block(0)->mlp->expert(0)->up_proj->weight.reshape({-1})[3].item<float>(), 0.123456789f);

  // Taking over expert 5 makes it fp32 and trainable; giving up expert 1 makes it bf16.
  trainer.set_owned_experts({0, 5});
  EXPECT_EQ(model->block(0)->mlp->expert(5)->up_proj->weight.scalar_type(), torch::kFloat32);
  EXPECT_TRUE(model->block(0)->mlp->expert(5)->up_proj->weight.requires_grad());
  EXPECT_EQ(model->block(0)->mlp->expert(1)->up_proj->weight.scalar_type(), torch::kBFloat16);
  EXPECT_FALSE(model->block(0)->mlp->expert(1)->up_proj->weight.requires_grad());
  EXPECT_TRUE(std::isfinite(trainer.step().loss));
  // The mirror follows the dtype change (one fp32 buffer either way).
  mirror.to_host();
  EXPECT_EQ(set[j].data[3], model->block(0)->mlp->expert(0)->up_proj->weight.reshape({-1})[3].item<float>());
}

TEST(Device, Fp32CpuModelIsSyncedInPlace) {
  Config c = test::tiny_config({"train.owned_experts=[0, 1]"});
  Trainer trainer(c, test::quiet());
  ModelParamMirror mirror(trainer.model());
  EXPECT_FALSE(mirror.staged());
  EXPECT_EQ(mirror.params()[0].data, trainer.model()->parameters()[0].data_ptr<float>());
}

}  // namespace
}  // namespace spes
