// Robust merging (sync.robust, docs/security.md): what one dishonest peer can do to a round is
// bounded. Shared slices: the plain or the coordinate-wise trimmed mean of the contributions.
// Experts: an owner's update is checked against that owner's own recent updates. Internal to the
// sync module; every node computes the same results from the same inputs (same bits).
#pragma once

#include <cstddef>
#include <deque>
#include <string>
#include <vector>

#include "spes/config/config.h"

namespace spes::sync_detail {

// The fp32 mean of equally long contributions, summed in the order given (node-id order), then divided.
std::vector<float> fp32_mean(const std::vector<const std::vector<float>*>& parts);
// Per value: the contributions sorted, the `trim` smallest and largest dropped, the rest summed in
// sorted order and divided. Needs more than 2 x trim contributions.
std::vector<float> trimmed_mean(const std::vector<const std::vector<float>*>& parts, int trim);
// The average sync.robust.shared asks for: trimmed with at least 2 x trim + 2 contributors, else the mean.
std::vector<float> shared_average(const std::vector<const std::vector<float>*>& parts, const RobustConfig& robust);

// One owner's accepted expert updates (relative norms), newest last.
class UpdateHistory {
 public:
  explicit UpdateHistory(const RobustConfig& robust = {}) : robust_(robust) {}
  // Why an update of relative size `relative` is out of line with the history, or "" if it is not
  // (or the bound is off, or the history is still shorter than min_history).
  std::string check(double relative) const;
  void record(double relative);
  double median() const;
  std::size_t size() const { return past_.size(); }

 private:
  RobustConfig robust_;
  std::deque<double> past_;
};

}  // namespace spes::sync_detail
