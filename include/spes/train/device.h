// Where training runs and in what precision: train.device, train.precision and
// train.frozen_dtype resolved against the machine (a GPU present or not), the bf16 autocast
// scope of the forward pass, and the GPU allocator's memory figures.
//
// One binary serves CPU-only machines and GPU machines: CUDA is looked for at run time.
#pragma once

#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>

#include <cstdint>
#include <string>

#include "spes/config/config.h"

namespace spes {

struct DevicePlan {
  c10::Device device{c10::kCPU};
  bool bf16_autocast = false;                      // CUDA autocast to bf16 in forward and loss
  c10::ScalarType frozen_dtype = c10::kFloat;      // storage of experts this node does not train
  std::string describe() const;                    // "cuda:0 (NVIDIA H200), bf16 autocast, frozen experts bf16"
};

// Error(Config) naming the key when the config asks for what the machine cannot do: a GPU
// where none is visible (or an index past the last one), bf16 on the CPU, more CUDA ranks
// (node.ranks) than GPUs. With several ranks, rank r of a node takes cuda:r.
DevicePlan resolve_device_plan(const Config& config, int local_rank = 0);

// Number of CUDA devices visible to this process (0 on a machine without a GPU or driver).
int cuda_device_count();

// Turns on CUDA bf16 autocast for its lifetime when `enabled` (as torch.autocast("cuda",
// torch.bfloat16) does); restores the previous state and frees the cast cache on exit.
class AutocastScope {
 public:
  explicit AutocastScope(bool enabled);
  ~AutocastScope();
  AutocastScope(const AutocastScope&) = delete;
  AutocastScope& operator=(const AutocastScope&) = delete;

 private:
  bool enabled_;
  bool previous_ = false;
  c10::ScalarType previous_dtype_ = c10::kBFloat16;
};

// The CUDA caching allocator's figures for `device` (zeros on the CPU).
struct DeviceMemory {
  std::int64_t allocated = 0;       // bytes in live tensors now
  std::int64_t peak_allocated = 0;  // most bytes in live tensors since the last reset
};
DeviceMemory device_memory(const c10::Device& device);
void reset_device_peak_memory(const c10::Device& device);
// Waits for the device's queued work (a no-op on the CPU): timings must include it.
void synchronize_device(const c10::Device& device);

}  // namespace spes
