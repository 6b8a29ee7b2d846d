// The machine's own matrix-product peak, measured (the MFU denominator).
#pragma once

#include <c10/core/Device.h>

namespace spes {

// FLOP/s of the best of a few square matrix products, each repeated for about `seconds` / 3:
// fp32 with n = 512, 1024, 2048 on the CPU (with the current libtorch thread count); on a GPU
// n = 4096, 8192, in bf16 when `bf16` (what autocast runs the model's products in), else fp32.
double measure_matmul_peak_flops(double seconds = 1.5, const c10::Device& device = c10::Device(c10::kCPU),
                                 bool bf16 = false);

}  // namespace spes
