// Token shard files: a 32-byte header then uint32 little-endian token ids.
//
//   offset  size  field
//   0       8     magic "SPESTOK\0"
//   8       4     format version (1)
//   12      4     vocab size (every token id is below it)
//   16      8     token count
//   24      4     end-of-sequence id
//   28      4     reserved (0)
//   32      4*n   tokens
//
// TokenShard memory-maps a file and validates all of it on open. Read-only, thread-safe.
#pragma once

#include <cstdint>
#include <filesystem>
#include <span>
#include <vector>

#include "spes/util/fs.h"

namespace spes {

inline constexpr std::uint32_t kShardVersion = 1;
inline constexpr std::size_t kShardHeaderBytes = 32;

// Writes atomically (temp file + rename). Error(Data) if a token is >= vocab_size.
void write_token_shard(const std::filesystem::path& path, const std::vector<std::uint32_t>& tokens,
                       std::uint32_t vocab_size, std::uint32_t eos_id);

class TokenShard {
 public:
  // Error(Data) naming the file for: missing, truncated, foreign (bad magic), unknown version,
  // size not matching the count, or a token id >= vocab size.
  explicit TokenShard(const std::filesystem::path& path);

  std::uint32_t vocab_size() const { return vocab_size_; }
  std::uint32_t eos_id() const { return eos_id_; }
  std::size_t size() const { return tokens_.size(); }
  std::span<const std::uint32_t> tokens() const { return tokens_; }
  const std::filesystem::path& path() const { return file_.path(); }

 private:
  MappedFile file_;
  std::span<const std::uint32_t> tokens_;
  std::uint32_t vocab_size_ = 0;
  std::uint32_t eos_id_ = 0;
};

}  // namespace spes
