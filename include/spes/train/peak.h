// The machine's own fp32 matrix-product peak, measured (the MFU denominator).
#pragma once

namespace spes {

// FLOP/s of the best of a few square fp32 matrix products (n = 512, 1024, 2048), each
// repeated for about `seconds` / 3, with the current libtorch thread count.
double measure_matmul_peak_flops(double seconds = 1.5);

}  // namespace spes
