#include "spes/sync/params.h"

#include <algorithm>

#include <fmt/format.h>

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

std::vector<ParamRange> ParamSet::shared_slice(int k, int n) const { return shared_slice(k, n, shared_); }

std::vector<ParamRange> ParamSet::shared_slice(int k, int n, const std::vector<std::size_t>& tensors) const {
  SPES_CHECK(n > 0 && k >= 0 && k < n, "slice index");
  std::int64_t total = 0;
  for (std::size_t i : tensors) {
    SPES_CHECK(i < params_.size() && !params_[i].is_expert(), "shared_slice: not a shared tensor");
    total += params_[i].numel;
  }
  const std::int64_t begin = total * k / n, end = total * (k + 1) / n;
  std::vector<ParamRange> out;
  std::int64_t pos = 0;  // flat position of the current tensor's first element
  for (std::size_t i : tensors) {
    const std::int64_t lo = std::max(begin, pos), hi = std::min(end, pos + params_[i].numel);
    if (lo < hi) out.push_back({i, lo - pos, hi - lo});
    pos += params_[i].numel;
  }
  return out;
}

std::vector<std::vector<std::size_t>> ParamSet::fragments(int count) const {
  SPES_CHECK(count > 0, "fragment count");
  std::vector<std::vector<std::size_t>> out(static_cast<std::size_t>(count));
  SPES_CHECK(static_cast<std::size_t>(count) <= shared_.size(),
             fmt::format("{} fragments but only {} shared tensors", count, shared_.size()));
  // Shared tensor i (in order) goes to the fragment holding the middle of its flat range, so
  // fragments get nearly equal element counts and stay contiguous; never skipping a fragment,
  // and leaving enough tensors for the ones after it, so that none is empty.
  std::int64_t pos = 0, f = 0;
  for (std::size_t t = 0; t < shared_.size(); ++t) {
    const std::size_t i = shared_[t];
    const std::int64_t middle = 2 * pos + params_[i].numel;  // twice the midpoint, to stay integral
    const std::int64_t by_size = middle * count / (2 * shared_numel_);
    const auto left = static_cast<std::int64_t>(shared_.size() - t);  // this one included
    if (t > 0) f = std::max(std::min(by_size, f + 1), f);
    f = std::min(std::max(f, count - left), static_cast<std::int64_t>(count) - 1);
    out[static_cast<std::size_t>(f)].push_back(i);
    pos += params_[i].numel;
  }
  for (std::size_t i = 0; i < params_.size(); ++i)
    if (params_[i].is_expert())
      out[static_cast<std::size_t>(params_[i].layer) * static_cast<std::size_t>(count) /
          static_cast<std::size_t>(std::max(n_layers_, 1))].push_back(i);
  for (auto& part : out) std::sort(part.begin(), part.end());
  return out;
}

}  // namespace spes
