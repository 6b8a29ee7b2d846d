#include "spes/sync/merge.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "spes/util/error.h"

namespace spes {

double merge_alpha(const MergeConfig& config, std::int64_t step) {
  const double progress = std::min(static_cast<double>(step) / static_cast<double>(config.horizon), 1.0);
  return config.alpha * (1.0 - progress);
}

bool merge_due(const MergeConfig& config, std::int64_t step) {
  return step > 0 && step % config.every == 0 && merge_alpha(config, step) > 0;
}

namespace {
double dot(const float* a, const float* b, std::int64_t n) {
  double s = 0;
  for (std::int64_t i = 0; i < n; ++i) s += static_cast<double>(a[i]) * static_cast<double>(b[i]);
  return s;
}
}  // namespace

std::vector<std::vector<int>> most_similar_experts(const std::vector<const float*>& gate, std::int64_t numel,
                                                   int top_k) {
  const int E = static_cast<int>(gate.size());
  std::vector<double> norm(static_cast<std::size_t>(E));
  for (int i = 0; i < E; ++i) norm[i] = std::sqrt(dot(gate[i], gate[i], numel));
  std::vector<double> sim(static_cast<std::size_t>(E * E), 0.0);
  for (int i = 0; i < E; ++i)
    for (int j = i + 1; j < E; ++j) {
      const double denom = norm[i] * norm[j];
      const double s = denom > 0 ? dot(gate[i], gate[j], numel) / denom : 0.0;
      sim[i * E + j] = sim[j * E + i] = s;
    }
  const int k = std::min(top_k, E - 1);
  std::vector<std::vector<int>> out(static_cast<std::size_t>(E));
  for (int i = 0; i < E; ++i) {
    std::vector<int> others;
    for (int j = 0; j < E; ++j)
      if (j != i) others.push_back(j);
    std::stable_sort(others.begin(), others.end(),
                     [&](int a, int b) { return sim[i * E + a] > sim[i * E + b]; });
    others.resize(static_cast<std::size_t>(k));
    out[i] = std::move(others);
  }
  return out;
}

std::int64_t merge_step_in(const MergeConfig& config, std::int64_t after, std::int64_t upto) {
  for (std::int64_t s = upto; s > after && s > 0; --s)
    if (merge_due(config, s)) return s;
  return 0;
}

void merge_experts(const ParamSet& params, double alpha, int top_k, const std::vector<int>& layers) {
  const int E = params.n_experts();
  if (alpha <= 0 || E < 2) return;
  std::vector<int> all;
  if (layers.empty())
    for (int l = 0; l < params.n_layers(); ++l) all.push_back(l);
  for (int l : layers.empty() ? all : layers) {
    // tensors[e] = expert e's tensors in this layer (gate, up, down as registered)
    std::vector<std::vector<std::size_t>> tensors(static_cast<std::size_t>(E));
    for (int e = 0; e < E; ++e) {
      tensors[e] = params.expert_tensors(l, e);
      SPES_CHECK(!tensors[e].empty() && tensors[e].size() == tensors[0].size(), "expert layout");
    }
    std::vector<const float*> gate(static_cast<std::size_t>(E));
    for (int e = 0; e < E; ++e) gate[e] = params[tensors[e][0]].data;
    const auto neighbours = most_similar_experts(gate, params[tensors[0][0]].numel, top_k);

    for (std::size_t t = 0; t < tensors[0].size(); ++t) {
      const std::int64_t n = params[tensors[0][t]].numel;
      // Pre-merge copies of this tensor for every expert: the update is simultaneous.
      std::vector<std::vector<float>> before(static_cast<std::size_t>(E));
      for (int e = 0; e < E; ++e) {
        const float* src = params[tensors[e][t]].data;
        before[e].assign(src, src + n);
      }
      for (int i = 0; i < E; ++i) {
        float* dst = params[tensors[i][t]].data;
        const auto& nb = neighbours[i];
        const double inv_k = 1.0 / static_cast<double>(nb.size());
        for (std::int64_t x = 0; x < n; ++x) {
          double mean = 0;
          for (int j : nb) mean += static_cast<double>(before[j][x]);
          mean *= inv_k;
          dst[x] = static_cast<float>((1.0 - alpha) * static_cast<double>(before[i][x]) + alpha * mean);
        }
      }
    }
  }
}

}  // namespace spes
