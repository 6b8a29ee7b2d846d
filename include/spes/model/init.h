// Weight initialization that libtorch 1.13 lacks: a truncated normal.
#pragma once

#include <ATen/core/Generator.h>
#include <ATen/core/Tensor.h>

namespace spes {

// Fills `t` in place with N(0, std^2) truncated to [-cut*std, cut*std] (inverse-CDF method,
// as torch.nn.init.trunc_normal_), drawing from `gen` only.
void trunc_normal_(at::Tensor& t, double std, double cut, at::Generator& gen);

}  // namespace spes
