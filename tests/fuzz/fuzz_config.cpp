// The config loader on arbitrary YAML: it may refuse (spes::Error naming the key), never crash,
// hang or throw anything else.
#include "seeds.h"
#include "spes/config/config.h"
#include "spes/util/error.h"

void write_seeds(const std::filesystem::path& dir) {
  int i = 0;
  for (const auto& entry : std::filesystem::directory_iterator(SPES_SOURCE_DIR "/configs"))
    if (entry.path().extension() == ".yaml" && entry.path().filename() != "cluster-local.yaml")
      std::filesystem::copy_file(entry.path(), dir / ("config" + std::to_string(i++)));
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  try {
    spes::parse_config(std::string(reinterpret_cast<const char*>(data), size), "fuzz.yaml");
  } catch (const spes::Error&) {
  }
  return 0;
}
