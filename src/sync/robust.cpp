#include "robust.h"

#include <fmt/format.h>

#include <algorithm>

namespace spes::sync_detail {

std::vector<float> fp32_mean(const std::vector<const std::vector<float>*>& parts) {
  std::vector<float> out(*parts.front());
  for (std::size_t p = 1; p < parts.size(); ++p) {
    const float* src = parts[p]->data();
    for (std::size_t i = 0; i < out.size(); ++i) out[i] += src[i];
  }
  const float n = static_cast<float>(parts.size());
  for (auto& v : out) v /= n;
  return out;
}

std::vector<float> trimmed_mean(const std::vector<const std::vector<float>*>& parts, int trim) {
  const std::size_t n = parts.size(), t = static_cast<std::size_t>(trim);
  std::vector<float> out(parts.front()->size()), column(n);
  const float kept = static_cast<float>(n - 2 * t);
  for (std::size_t i = 0; i < out.size(); ++i) {
    for (std::size_t p = 0; p < n; ++p) column[p] = (*parts[p])[i];
    std::sort(column.begin(), column.end());
    float sum = 0;
    for (std::size_t p = t; p < n - t; ++p) sum += column[p];
    out[i] = sum / kept;
  }
  return out;
}

std::vector<float> shared_average(const std::vector<const std::vector<float>*>& parts, const RobustConfig& robust) {
  if (robust.shared == "trimmed" && parts.size() >= 2 * static_cast<std::size_t>(robust.trim) + 2)
    return trimmed_mean(parts, robust.trim);
  return fp32_mean(parts);
}

double UpdateHistory::median() const {
  if (past_.empty()) return 0;
  std::vector<double> sorted(past_.begin(), past_.end());
  std::sort(sorted.begin(), sorted.end());
  const std::size_t m = sorted.size() / 2;
  return sorted.size() % 2 ? sorted[m] : (sorted[m - 1] + sorted[m]) / 2;
}

std::string UpdateHistory::check(double relative) const {
  if (robust_.expert_factor <= 0 || past_.size() < static_cast<std::size_t>(robust_.min_history)) return {};
  const double limit = robust_.expert_factor * median();
  if (relative <= limit) return {};
  return fmt::format("its experts change by {:.3g} of their norm per unit of the learning rate, more than "
                     "sync.robust.expert_factor {} x the median {:.3g} of its last {} accepted updates",
                     relative, robust_.expert_factor, median(), past_.size());
}

void UpdateHistory::record(double relative) {
  past_.push_back(relative);
  while (past_.size() > static_cast<std::size_t>(robust_.window)) past_.pop_front();
}

}  // namespace spes::sync_detail
