#include "spes/model/init.h"

#include <torch/torch.h>

#include <cmath>

namespace spes {

void trunc_normal_(at::Tensor& t, double std, double cut, at::Generator& gen) {
  torch::NoGradGuard no_grad;
  auto norm_cdf = [](double x) { return 0.5 * (1.0 + std::erf(x / std::sqrt(2.0))); };
  const double lo = norm_cdf(-cut), hi = norm_cdf(cut);
  t.uniform_(2 * lo - 1, 2 * hi - 1, gen);
  t.erfinv_();
  t.mul_(std * std::sqrt(2.0));
  t.clamp_(-cut * std, cut * std);
}

}  // namespace spes
