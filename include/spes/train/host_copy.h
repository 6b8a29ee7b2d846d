// Moving a model's worth of tensors between a device and host memory with one transfer each
// way (a sync round, a checkpoint): tensors are gathered into one flat fp32 buffer on their
// device, copied to (pinned, on a GPU) host memory at once, and scattered back the same way.
#pragma once

#include <ATen/core/Tensor.h>

#include <vector>

namespace spes {

struct HostCopy {
  at::Tensor flat;                 // fp32 on the CPU; page-locked when the sources are on a GPU
  std::vector<at::Tensor> views;   // one per source tensor, into `flat`, in the sources' shapes
};

// An fp32 host copy of `tensors` (all on one device, any floating dtype). `reuse`: a previous
// HostCopy of tensors of the same sizes, whose buffer is refilled instead of allocated.
HostCopy copy_to_host(const std::vector<at::Tensor>& tensors, HostCopy reuse = {});

// Writes `host` back into `targets` (same order and sizes as it was made from), converting to
// each target's dtype: one host-to-device transfer, then copies on the device.
void copy_from_host(const HostCopy& host, const std::vector<at::Tensor>& targets);

}  // namespace spes
