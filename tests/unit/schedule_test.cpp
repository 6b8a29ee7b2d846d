#include <gtest/gtest.h>

#include <cmath>
#include <numbers>

#include "spes/train/schedule.h"

namespace spes {
namespace {

TEST(Schedule, LinearWarmupFromTenPercentThenCosineToMin) {
  ScheduleConfig s;
  s.warmup_steps = 10;
  s.warmup_start_ratio = 0.1;
  s.min_lr_ratio = 0.1;
  const double lr = 1.0;
  EXPECT_DOUBLE_EQ(learning_rate(lr, s, 110, 0), 0.1);
  EXPECT_DOUBLE_EQ(learning_rate(lr, s, 110, 5), 0.1 + 0.9 * 0.5);
  EXPECT_DOUBLE_EQ(learning_rate(lr, s, 110, 10), 1.0);
  // Halfway through the decay the cosine is at the midpoint of lr and min_lr.
  EXPECT_NEAR(learning_rate(lr, s, 110, 60), 0.55, 1e-12);
  EXPECT_NEAR(learning_rate(lr, s, 110, 35), 0.1 + 0.9 * 0.5 * (1 + std::cos(std::numbers::pi * 0.25)), 1e-12);
  EXPECT_NEAR(learning_rate(lr, s, 110, 110), 0.1, 1e-12);
  EXPECT_NEAR(learning_rate(lr, s, 110, 500), 0.1, 1e-12);
  double prev = 2.0;
  for (int t = 10; t <= 110; ++t) {
    double now = learning_rate(lr, s, 110, t);
    EXPECT_LE(now, prev + 1e-15);
    prev = now;
  }
}

TEST(Schedule, NoWarmup) {
  ScheduleConfig s;
  s.warmup_steps = 0;
  EXPECT_DOUBLE_EQ(learning_rate(2.0, s, 100, 0), 2.0);
}

}  // namespace
}  // namespace spes
