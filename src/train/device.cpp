#include "spes/train/device.h"

#include <ATen/autocast_mode.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <ATen/cuda/CUDAContextLight.h>
#include <torch/cuda.h>

#include <fmt/format.h>

#include "spes/util/error.h"

namespace spes {

int cuda_device_count() { return torch::cuda::is_available() ? static_cast<int>(torch::cuda::device_count()) : 0; }

namespace {

c10::Device pick_device(const Config& c, int local_rank) {
  const std::string& want = c.train.device;
  const int gpus = cuda_device_count();
  if (want == "cpu") return c10::Device(c10::kCPU);
  if (want == "auto" && gpus == 0) return c10::Device(c10::kCPU);
  const int ranks = c.node.ranks;
  if (ranks > 1 && want.rfind("cuda:", 0) == 0)
    raise(ErrorKind::Config, "{}: '{}' names one GPU, but node.ranks is {}: use cuda (rank r takes cuda:r) or auto",
          c.where("train.device"), want, ranks);
  const int index = want.rfind("cuda:", 0) == 0 ? std::stoi(want.substr(5)) : local_rank;
  if (gpus == 0)
    raise(ErrorKind::Config, "{}: '{}' asks for a CUDA GPU, but this machine has none visible (no GPU, no NVIDIA "
          "driver, or CUDA_VISIBLE_DEVICES hides them): use auto or cpu", c.where("train.device"), want);
  if (ranks > 1 && ranks > gpus)
    raise(ErrorKind::Config, "{}: {} ranks on CUDA need {} GPUs (one per rank), this machine has {}",
          c.where("node.ranks"), ranks, ranks, gpus);
  if (index >= gpus)
    raise(ErrorKind::Config, "{}: '{}' asks for GPU {}, but this machine has {} (cuda:0 .. cuda:{})",
          c.where("train.device"), want, index, gpus, gpus - 1);
  return c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(index));
}

}  // namespace

DevicePlan resolve_device_plan(const Config& c, int local_rank) {
  DevicePlan plan;
  plan.device = pick_device(c, local_rank);
  const bool cuda = plan.device.is_cuda();
  const std::string& precision = c.train.precision;
  if (precision == "bf16" && !cuda)
    raise(ErrorKind::Config, "{}: bf16 needs a CUDA device, and train.device resolved to the CPU: use fp32 (or "
          "auto) on the CPU", c.where("train.precision"));
  plan.bf16_autocast = precision == "bf16" || (precision == "auto" && cuda);
  plan.frozen_dtype = c.train.frozen_dtype == "bf16" ? c10::kBFloat16 : c10::kFloat;
  return plan;
}

std::string DevicePlan::describe() const {
  std::string where = device.str();
  if (device.is_cuda()) {
    const auto* props = at::cuda::getDeviceProperties(device.index());
    where += fmt::format(" ({}, {:.0f} GiB)", props->name, static_cast<double>(props->totalGlobalMem) / (1 << 30));
  }
  return fmt::format("{}, {}, frozen experts {}", where, bf16_autocast ? "bf16 autocast (fp32 master weights)" : "fp32",
                     frozen_dtype == c10::kBFloat16 ? "bf16" : "fp32");
}

AutocastScope::AutocastScope(bool enabled) : enabled_(enabled) {
  if (!enabled_) return;
  previous_ = at::autocast::is_autocast_enabled(c10::DeviceType::CUDA);
  previous_dtype_ = at::autocast::get_autocast_dtype(c10::DeviceType::CUDA);
  at::autocast::set_autocast_enabled(c10::DeviceType::CUDA, true);
  at::autocast::set_autocast_dtype(c10::DeviceType::CUDA, c10::kBFloat16);
  at::autocast::increment_nesting();
}

AutocastScope::~AutocastScope() {
  if (!enabled_) return;
  if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
  at::autocast::set_autocast_enabled(c10::DeviceType::CUDA, previous_);
  at::autocast::set_autocast_dtype(c10::DeviceType::CUDA, previous_dtype_);
}

DeviceMemory device_memory(const c10::Device& device) {
  DeviceMemory m;
  if (!device.is_cuda()) return m;
  const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(device.index());
  const auto& bytes = stats.allocated_bytes[static_cast<std::size_t>(c10::CachingAllocator::StatType::AGGREGATE)];
  m.allocated = bytes.current;
  m.peak_allocated = bytes.peak;
  return m;
}

void reset_device_peak_memory(const c10::Device& device) {
  if (device.is_cuda()) c10::cuda::CUDACachingAllocator::resetPeakStats(device.index());
}

void synchronize_device(const c10::Device& device) {
  if (device.is_cuda()) torch::cuda::synchronize(device.index());
}

}  // namespace spes
