// Paths the build hands to the tests.
#pragma once

#include <unistd.h>

#include <filesystem>
#include <string>

namespace spes::test {
inline std::string source_dir() { return SPES_SOURCE_DIR; }
inline std::string config_path(const std::string& name) { return source_dir() + "/configs/" + name + ".yaml"; }
// The tiny config's prepared data (made by the prepare_tiny_data CTest fixture).
inline std::string tiny_data_dir() { return std::string(SPES_TEST_DATA_DIR) + "/tiny"; }

// An empty folder under the temp directory for one test (named by `tag` and the process id),
// removed when it goes out of scope.
struct ScratchDir {
  std::filesystem::path path;
  explicit ScratchDir(const std::string& tag)
      : path(std::filesystem::temp_directory_path() / ("spes-" + tag + "-" + std::to_string(::getpid()))) {
    std::filesystem::remove_all(path);
  }
  ~ScratchDir() { std::filesystem::remove_all(path); }
};
}  // namespace spes::test
