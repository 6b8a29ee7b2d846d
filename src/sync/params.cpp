#include "spes/sync/params.h"

#include <algorithm>

#include "spes/util/error.h"

namespace spes {

ParamSet::ParamSet(std::vector<ParamRef> params) : params_(std::move(params)) {
  for (std::size_t i = 0; i < params_.size(); ++i) {
    const ParamRef& p = params_[i];
    std::int64_t n = 1;
    for (auto d : p.shape) n *= d;
    SPES_CHECK(n == p.numel && p.data != nullptr, p.name);
    if (p.is_expert()) {
      n_experts_ = std::max(n_experts_, p.expert + 1);
      n_layers_ = std::max(n_layers_, p.layer + 1);
    } else {
      shared_.push_back(i);
      shared_numel_ += p.numel;
    }
  }
}

long ParamSet::find(const std::string& name) const {
  for (std::size_t i = 0; i < params_.size(); ++i)
    if (params_[i].name == name) return static_cast<long>(i);
  return -1;
}

std::int64_t ParamSet::expert_numel(int expert) const {
  std::int64_t n = 0;
  for (const auto& p : params_)
    if (p.expert == expert) n += p.numel;
  return n;
}

std::vector<ParamRange> ParamSet::expert_ranges(int expert) const {
  std::vector<ParamRange> out;
  for (std::size_t i = 0; i < params_.size(); ++i)
    if (params_[i].expert == expert) out.push_back({i, 0, params_[i].numel});
  return out;
}

std::vector<std::size_t> ParamSet::expert_tensors(int layer, int expert) const {
  std::vector<std::size_t> out;
  for (std::size_t i = 0; i < params_.size(); ++i)
    if (params_[i].expert == expert && params_[i].layer == layer) out.push_back(i);
  return out;
}

std::vector<ParamRange> ParamSet::shared_slice(int k, int n) const {
  SPES_CHECK(n > 0 && k >= 0 && k < n, "slice index");
  const std::int64_t begin = shared_numel_ * k / n, end = shared_numel_ * (k + 1) / n;
  std::vector<ParamRange> out;
  std::int64_t pos = 0;  // flat position of the current tensor's first element
  for (std::size_t i : shared_) {
    const std::int64_t lo = std::max(begin, pos), hi = std::min(end, pos + params_[i].numel);
    if (lo < hi) out.push_back({i, lo - pos, hi - lo});
    pos += params_[i].numel;
  }
  return out;
}

}  // namespace spes
