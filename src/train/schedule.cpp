#include "spes/train/schedule.h"

#include <algorithm>
#include <cmath>
#include <numbers>

namespace spes {

double learning_rate(double lr, const ScheduleConfig& s, std::int64_t total_steps, std::int64_t step) {
  if (step < s.warmup_steps) {
    const double t = static_cast<double>(step) / static_cast<double>(s.warmup_steps);
    return lr * (s.warmup_start_ratio + (1.0 - s.warmup_start_ratio) * t);
  }
  const double min_lr = lr * s.min_lr_ratio;
  const std::int64_t decay_steps = total_steps - s.warmup_steps;
  if (decay_steps <= 0) return lr;
  const double progress =
      std::clamp(static_cast<double>(step - s.warmup_steps) / static_cast<double>(decay_steps), 0.0, 1.0);
  return min_lr + (lr - min_lr) * 0.5 * (1.0 + std::cos(std::numbers::pi * progress));
}

}  // namespace spes
