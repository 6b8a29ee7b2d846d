#include "spes/train/host_copy.h"

#include <torch/torch.h>

#include "spes/util/error.h"

namespace spes {
namespace {

c10::Device common_device(const std::vector<at::Tensor>& tensors) {
  c10::Device device(c10::kCPU);
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    if (i == 0) device = tensors[i].device();
    else SPES_CHECK(tensors[i].device() == device, "copy_to_host: tensors on more than one device");
  }
  return device;
}

std::int64_t total_numel(const std::vector<at::Tensor>& tensors) {
  std::int64_t n = 0;
  for (const auto& t : tensors) n += t.numel();
  return n;
}

}  // namespace

HostCopy copy_to_host(const std::vector<at::Tensor>& tensors, HostCopy reuse) {
  torch::NoGradGuard no_grad;
  const c10::Device device = common_device(tensors);
  const std::int64_t total = total_numel(tensors);
  HostCopy out;
  if (reuse.flat.defined() && reuse.flat.numel() == total) {
    out = std::move(reuse);
  } else {
    out.flat = torch::empty({total}, torch::TensorOptions().dtype(torch::kFloat32).pinned_memory(device.is_cuda()));
    out.views.clear();
  }
  // On a GPU: gather on the device (device-side copies), then one transfer to the host.
  at::Tensor gathered = device.is_cuda()
                            ? torch::empty({total}, torch::TensorOptions().dtype(torch::kFloat32).device(device))
                            : out.flat;
  std::int64_t offset = 0;
  for (const auto& t : tensors) {
    gathered.narrow(0, offset, t.numel()).copy_(t.reshape({-1}));
    offset += t.numel();
  }
  if (device.is_cuda()) out.flat.copy_(gathered);
  if (out.views.size() != tensors.size()) {
    out.views.clear();
    offset = 0;
    for (const auto& t : tensors) {
      out.views.push_back(out.flat.narrow(0, offset, t.numel()).view(t.sizes()));
      offset += t.numel();
    }
  }
  return out;
}

void copy_from_host(const HostCopy& host, const std::vector<at::Tensor>& targets) {
  torch::NoGradGuard no_grad;
  const c10::Device device = common_device(targets);
  SPES_CHECK(host.flat.defined() && host.flat.numel() == total_numel(targets), "copy_from_host: sizes differ");
  const at::Tensor source = device.is_cuda() ? host.flat.to(device, /*non_blocking=*/true) : host.flat;
  std::int64_t offset = 0;
  for (const auto& t : targets) {
    t.copy_(source.narrow(0, offset, t.numel()).view(t.sizes()));
    offset += t.numel();
  }
}

}  // namespace spes
