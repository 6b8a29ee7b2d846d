// Shared by the fuzz targets: `SPES_FUZZ_SEEDS=DIR ./fuzz_x` writes the target's seed inputs
// (valid files made by spes's own writers) into DIR and exits, so scripts/fuzz.sh starts every
// fuzzer from inputs that reach deep into the parser. Each target defines write_seeds().
#pragma once

#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

void write_seeds(const std::filesystem::path& dir);

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  if (const char* dir = std::getenv("SPES_FUZZ_SEEDS")) {
    std::filesystem::create_directories(dir);
    write_seeds(dir);
    std::exit(0);
  }
  return 0;
}

// For parsers that read paths: the input written to this process's scratch file `name`.
inline std::filesystem::path as_scratch_file(const char* name, const std::uint8_t* data, std::size_t size) {
  static const auto dir = std::filesystem::temp_directory_path();
  const auto path = dir / (std::string("spes-fuzz-") + name + "-" + std::to_string(::getpid()));
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
  return path;
}
