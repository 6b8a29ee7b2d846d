// Minimal safetensors files (https://github.com/huggingface/safetensors): an 8-byte little-endian
// header length, a JSON header {name: {dtype, shape, data_offsets}}, then raw little-endian data.
// Writes F32 (with the __metadata__ {"format": "pt"} that transformers expects); reads F32,
// BF16 and F16, widened exactly to fp32. Torch-free.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace spes {

struct TensorView {
  std::string name;
  std::vector<std::int64_t> shape;
  const float* data = nullptr;
};

struct LoadedTensor {
  std::vector<std::int64_t> shape;
  std::vector<float> values;
};

// Writes atomically (temporary file, fsync, rename). Throws Error(Io).
void write_safetensors(const std::string& path, const std::vector<TensorView>& tensors);
// Throws Error(Checkpoint) naming the file for anything malformed (or another dtype).
std::map<std::string, LoadedTensor> read_safetensors(const std::string& path);

}  // namespace spes
