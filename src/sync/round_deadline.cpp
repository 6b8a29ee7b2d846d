#include "round_deadline.h"

#include <algorithm>

namespace spes::sync_detail {

RoundDeadline::RoundDeadline(double factor, double floor_s, double ceiling_s, std::size_t window)
    : factor_(factor), floor_(std::min(floor_s, ceiling_s)), ceiling_(ceiling_s), window_(std::max<std::size_t>(window, 1)) {}

double RoundDeadline::next() const {
  if (factor_ <= 0 || clean_.empty()) return ceiling_;
  const double slowest = *std::max_element(clean_.begin(), clean_.end());
  return std::clamp(factor_ * slowest * backoff_, floor_, ceiling_);
}

void RoundDeadline::record(double seconds, bool clean, bool slow_link) {
  if (clean) {
    clean_.push_back(seconds);
    if (clean_.size() > window_) clean_.pop_front();
    backoff_ = 1;
  } else if (slow_link && backoff_ * factor_ < 1e6) {
    backoff_ *= 2;
  }
}

}  // namespace spes::sync_detail
