// The learning-rate schedule as a pure function of the step: linear warm-up from
// warmup_start_ratio * lr to lr, then cosine decay to min_lr_ratio * lr at total_steps.
#pragma once

#include <cstdint>

#include "spes/config/config.h"

namespace spes {

// step: 0-based optimizer step. Past total_steps the rate stays at the minimum.
double learning_rate(double lr, const ScheduleConfig& schedule, std::int64_t total_steps, std::int64_t step);

}  // namespace spes
