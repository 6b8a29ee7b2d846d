// The safetensors reader (checkpoints, exports, imports) on arbitrary bytes: a clear
// spes::Error or a valid result, never a crash or an out-of-bounds read.
#include "seeds.h"
#include "spes/util/error.h"
#include "spes/util/safetensors.h"

void write_seeds(const std::filesystem::path& dir) {
  std::vector<float> a(12, 1.5f), b(3, -2.0f);
  spes::write_safetensors((dir / "two").string(), {{"a.weight", {3, 4}, a.data()}, {"b", {3}, b.data()}});
  spes::write_safetensors((dir / "empty").string(), {});
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const auto path = as_scratch_file("safetensors", data, size);
  try {
    auto tensors = spes::read_safetensors(path.string());
    for (const auto& [name, t] : tensors) {
      std::int64_t n = 1;
      for (auto d : t.shape) n *= d;
      if (static_cast<std::size_t>(n) != t.values.size()) std::abort();  // shape and values must agree
    }
  } catch (const spes::Error&) {
  }
  return 0;
}
