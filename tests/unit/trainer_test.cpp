// The trainer on the tiny config and the real corpus: learning, determinism, frozen experts.
#include <gtest/gtest.h>

#include "spes/model/size.h"
#include "spes/train/optimizer.h"
#include "spes/train/trainer.h"
#include "spes/util/error.h"
#include "torch_helpers.h"

namespace spes {
namespace {

TEST(Trainer, LossFallsOnTheKingJamesBible) {
  Config c = test::tiny_config({"train.steps=150"});
  Trainer trainer(c, test::quiet());
  const double val_before = trainer.evaluate().loss;
  std::vector<double> ce;
  for (int i = 0; i < 150; ++i) ce.push_back(trainer.step().ce);
  const double first = ce.front();
  double last10 = 0;
  for (int i = 140; i < 150; ++i) last10 += ce[i] / 10;
  EXPECT_NEAR(first, std::log(512.0), 0.3);
  EXPECT_LT(last10, first - 1.0) << "first " << first << " last " << last10;
  const double val_after = trainer.evaluate().loss;
  EXPECT_LT(val_after, val_before - 0.8) << val_before << " -> " << val_after;
}

TEST(Trainer, SameSeedGivesBitIdenticalLossesAndWeights) {
  Config c = test::tiny_config({"train.steps=20"});
  Trainer a(c, test::quiet()), b(c, test::quiet());
  for (int i = 0; i < 6; ++i) {
    StepStats sa = a.step(), sb = b.step();
    EXPECT_EQ(sa.loss, sb.loss) << i;
    EXPECT_EQ(sa.grad_norm, sb.grad_norm) << i;
  }
  auto pa = a.model()->parameters(), pb = b.model()->parameters();
  for (std::size_t i = 0; i < pa.size(); ++i) EXPECT_TRUE(torch::equal(pa[i], pb[i]));

  Config other_node = test::tiny_config({"train.steps=20", "run.node_id=1"});
  Trainer n1(other_node, test::quiet());
  Trainer n0(c, test::quiet());
  EXPECT_NE(n1.step().loss, n0.step().loss);  // same weights, other batch
}

TEST(Trainer, FrozenExpertsStayBitIdenticalAndHoldNoState) {
  Config c = test::tiny_config({"train.steps=40", "train.owned_experts=[2, 5]"});
  Trainer trainer(c, test::quiet());
  auto& model = trainer.model();
  std::map<std::string, torch::Tensor> before;
  for (const auto& p : model->named_parameters()) before[p.key()] = p.value().clone();
  double frozen_share = 0;
  for (int i = 0; i < 40; ++i) frozen_share += trainer.step().frozen_share / 40;
  EXPECT_GT(frozen_share, 0.4);  // most tokens do go through frozen experts

  std::int64_t trainable = 0;
  for (const auto& p : model->named_parameters()) {
    const std::string& name = p.key();
    const bool expert = MoeTransformerImpl::is_expert_parameter(name);
    const bool owned = name.find("experts.2.") != std::string::npos || name.find("experts.5.") != std::string::npos;
    if (expert && !owned) {
      EXPECT_TRUE(torch::equal(p.value(), before[name])) << name;
      EXPECT_FALSE(p.value().requires_grad()) << name;
      EXPECT_FALSE(p.value().grad().defined()) << name;
    } else {
      EXPECT_FALSE(torch::equal(p.value(), before[name])) << name << " did not train";
      trainable += p.value().numel();
    }
  }
  ParamCounts counts = count_params(c.model, 2);
  EXPECT_EQ(trainable, counts.trainable);
  TrainingMemory mem = trainer.memory();
  EXPECT_EQ(mem.trainable_params, counts.trainable);
  EXPECT_EQ(mem.grad_bytes, 4 * counts.trainable);
  EXPECT_EQ(mem.optimizer_bytes, 2 * 4 * counts.trainable);  // two fp32 moments per trainable parameter
  EXPECT_EQ(mem.frozen_grad_bytes, 0);
  EXPECT_EQ(trainer.optimizer().state().size(), trainer.model()->trainable_parameters().size());
}

TEST(Trainer, GradAccumulationAveragesMicroBatches) {
  // Two micro-batches of 4 give the same first-step gradient as one batch of 8 windows.
  Config one = test::tiny_config({"train.batch_size=8", "optim.grad_clip=0"});
  Config two = test::tiny_config({"train.batch_size=4", "train.grad_accum=2", "optim.grad_clip=0"});
  Trainer a(one, test::quiet()), b(two, test::quiet());
  StepStats sa = a.step(), sb = b.step();
  EXPECT_NEAR(sa.ce, sb.ce, 1e-5);
  EXPECT_NEAR(sa.grad_norm, sb.grad_norm, 1e-4 * sa.grad_norm);
  EXPECT_EQ(sa.tokens, sb.tokens);
}

TEST(Trainer, LearningRateFollowsTheSchedule) {
  Config c = test::tiny_config({"train.steps=30", "schedule.warmup_steps=10", "optim.lr=1e-2"});
  Trainer t(c, test::quiet());
  EXPECT_DOUBLE_EQ(t.step().lr, 1e-3);
  for (int i = 1; i < 10; ++i) t.step();
  EXPECT_DOUBLE_EQ(t.step().lr, 1e-2);
  EXPECT_DOUBLE_EQ(t.optimizer().param_groups()[0].options().get_lr(), 1e-2);
}

TEST(Trainer, ShardFromAnotherVocabularyIsRefused) {
  Config c = test::tiny_config({"model.vocab_size=256"});
  try {
    Trainer t(c, test::quiet());
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::Data);
    EXPECT_NE(std::string(e.what()).find("vocabulary of 512 but model.vocab_size is 256"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace spes
