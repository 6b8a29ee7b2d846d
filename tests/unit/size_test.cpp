#include <gtest/gtest.h>

#include "spes/config/config.h"
#include "spes/model/size.h"
#include "test_paths.h"

namespace spes {
namespace {

// SPES.md's table: total and active parameters of the paper's shapes.
struct PaperShape {
  const char* config;
  double total, active;
};

TEST(ModelSize, PaperShapesMatchTheTableWithinOnePercent) {
  for (const PaperShape& s : {PaperShape{"1b", 1.17e9, 0.38e9}, PaperShape{"7b", 7.33e9, 1.70e9},
                              PaperShape{"9b-upcycle", 9.43e9, 3.09e9}}) {
    SCOPED_TRACE(s.config);
    Config c = load_config(test::config_path(s.config));
    ParamCounts p = count_params(c.model, c.model.n_experts);
    EXPECT_NEAR(static_cast<double>(p.total) / s.total, 1.0, 0.01) << p.total;
    EXPECT_NEAR(static_cast<double>(p.active) / s.active, 1.0, 0.01) << p.active;
    EXPECT_EQ(p.trainable, p.total);
  }
}

TEST(ModelSize, TrainableCountsOwnedExpertsOnly) {
  Config c = load_config(test::config_path("tiny"));
  ParamCounts all = count_params(c.model, 8), two = count_params(c.model, 2);
  EXPECT_EQ(all.trainable - two.trainable, 6 * c.model.n_layers * 3 * c.model.d_model * c.model.d_ff);
  EXPECT_EQ(two.shared, all.shared);
}

TEST(ModelSize, FrozenExpertsSaveTheirWeightGradientFlops) {
  Config c = load_config(test::config_path("tiny"));
  const auto& m = c.model;
  StepFlops trainable = count_train_flops(m, 64, 512, 0.0);
  StepFlops frozen = count_train_flops(m, 64, 512, 0.75);
  EXPECT_DOUBLE_EQ(trainable.backward, 2 * trainable.forward);
  EXPECT_DOUBLE_EQ(frozen.forward, trainable.forward);
  const double expert_fwd = 512.0 * m.n_layers * m.top_k * 2 * 3 * m.d_model * m.d_ff;
  EXPECT_DOUBLE_EQ(trainable.backward - frozen.backward, 0.75 * expert_fwd);
}

}  // namespace
}  // namespace spes
