// Shared helpers for the libtorch tests.
#pragma once

#include <torch/torch.h>

#include <filesystem>
#include <string>

#include "spes/config/config.h"
#include "spes/train/trainer.h"
#include "test_paths.h"

namespace spes::test {

// The tiny config pointed at the fixture's data and a scratch output folder.
inline Config tiny_config(std::vector<std::string> overrides = {}) {
  overrides.insert(overrides.begin(), {"data.dir=" + tiny_data_dir(),
                                       "run.out_dir=" + (std::filesystem::temp_directory_path() / "spes-test-run").string()});
  return load_config(config_path("tiny"), overrides);
}

// No files, no peak measurement, no progress lines.
inline TrainerOptions quiet() {
  TrainerOptions o;
  o.write_outputs = false;
  o.measure_peak = false;
  o.progress = false;
  return o;
}

inline double max_abs_diff(const torch::Tensor& a, const torch::Tensor& b) {
  return (a - b).abs().max().item<double>();
}

}  // namespace spes::test
