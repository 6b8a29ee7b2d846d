#include "spes/train/peak.h"

#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <vector>

#include "spes/train/device.h"

namespace spes {

double measure_matmul_peak_flops(double seconds, const c10::Device& device, bool bf16) {
  torch::NoGradGuard no_grad;
  const auto options = torch::TensorOptions().device(device).dtype(bf16 ? torch::kBFloat16 : torch::kFloat32);
  const std::vector<std::int64_t> sizes = device.is_cuda() ? std::vector<std::int64_t>{4096, 8192}
                                                           : std::vector<std::int64_t>{512, 1024, 2048};
  double best = 0.0;
  for (std::int64_t n : sizes) {
    auto a = torch::randn({n, n}, options), b = torch::randn({n, n}, options), c = torch::empty({n, n}, options);
    torch::mm_out(c, a, b);  // warm-up: first calls pay for thread start, page faults, kernel choice
    synchronize_device(device);
    const double budget = seconds / static_cast<double>(sizes.size());
    int reps = 0;
    auto t0 = std::chrono::steady_clock::now();
    double elapsed = 0.0;
    while (elapsed < budget || reps < 2) {
      for (int i = 0; i < (device.is_cuda() ? 10 : 1); ++i, ++reps) torch::mm_out(c, a, b);
      synchronize_device(device);
      elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    }
    best = std::max(best, 2.0 * static_cast<double>(n * n * n) * reps / elapsed);
  }
  return best;
}

}  // namespace spes
