#include "spes/train/peak.h"

#include <torch/torch.h>

#include <algorithm>
#include <chrono>

namespace spes {

double measure_matmul_peak_flops(double seconds) {
  torch::NoGradGuard no_grad;
  double best = 0.0;
  for (std::int64_t n : {512, 1024, 2048}) {
    auto a = torch::randn({n, n}), b = torch::randn({n, n}), c = torch::empty({n, n});
    torch::mm_out(c, a, b);  // warm-up: first calls pay for thread start and page faults
    const double budget = seconds / 3.0;
    int reps = 0;
    auto t0 = std::chrono::steady_clock::now();
    double elapsed = 0.0;
    while (elapsed < budget || reps < 2) {
      torch::mm_out(c, a, b);
      ++reps;
      elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    }
    best = std::max(best, 2.0 * static_cast<double>(n * n * n) * reps / elapsed);
  }
  return best;
}

}  // namespace spes
