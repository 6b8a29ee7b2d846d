#include "spes/data/shard.h"

#include <cstring>
#include <string>

#include "spes/util/error.h"

namespace spes {
namespace fs = std::filesystem;

namespace {
constexpr char kMagic[8] = {'S', 'P', 'E', 'S', 'T', 'O', 'K', '\0'};

template <typename T>
void put(std::string& out, T value) {
  out.append(reinterpret_cast<const char*>(&value), sizeof value);  // little-endian hosts only
}
template <typename T>
T get(const std::uint8_t* p) {
  T value;
  std::memcpy(&value, p, sizeof value);
  return value;
}
}  // namespace

void write_token_shard(const fs::path& path, const std::vector<std::uint32_t>& tokens,
                       std::uint32_t vocab_size, std::uint32_t eos_id) {
  for (std::size_t i = 0; i < tokens.size(); ++i)
    if (tokens[i] >= vocab_size)
      raise(ErrorKind::Data, "refusing to write '{}': token {} at position {} is >= vocab size {}",
            path.string(), tokens[i], i, vocab_size);
  std::string out;
  out.reserve(kShardHeaderBytes + tokens.size() * 4);
  out.append(kMagic, sizeof kMagic);
  put<std::uint32_t>(out, kShardVersion);
  put<std::uint32_t>(out, vocab_size);
  put<std::uint64_t>(out, tokens.size());
  put<std::uint32_t>(out, eos_id);
  put<std::uint32_t>(out, 0);
  out.append(reinterpret_cast<const char*>(tokens.data()), tokens.size() * 4);
  write_file_atomic(path, out);
}

TokenShard::TokenShard(const fs::path& path) {
  if (!fs::exists(path))
    raise(ErrorKind::Data, "token shard '{}' does not exist (run `spes data prepare`)", path.string());
  try {
    file_ = MappedFile(path);
  } catch (const Error& e) {
    raise(ErrorKind::Data, "cannot read token shard: {}", e.what());
  }
  const std::uint8_t* p = file_.data();
  const std::size_t bytes = file_.size();
  if (bytes < kShardHeaderBytes)
    raise(ErrorKind::Data, "token shard '{}' is truncated: {} bytes, smaller than its {}-byte header",
          path.string(), bytes, kShardHeaderBytes);
  if (std::memcmp(p, kMagic, sizeof kMagic) != 0)
    raise(ErrorKind::Data, "'{}' is not a spes token shard (bad magic bytes)", path.string());
  auto version = get<std::uint32_t>(p + 8);
  if (version != kShardVersion)
    raise(ErrorKind::Data, "token shard '{}' has format version {}, this spes reads version {}",
          path.string(), version, kShardVersion);
  vocab_size_ = get<std::uint32_t>(p + 12);
  auto count = get<std::uint64_t>(p + 16);
  eos_id_ = get<std::uint32_t>(p + 24);
  const std::uint64_t expected = kShardHeaderBytes + count * 4;
  if (count > (bytes / 4) || expected != bytes)
    raise(ErrorKind::Data, "token shard '{}' is truncated or padded: header says {} tokens ({} bytes), "
          "file has {} bytes", path.string(), count, expected, bytes);
  if (vocab_size_ == 0 || eos_id_ >= vocab_size_)
    raise(ErrorKind::Data, "token shard '{}' has an invalid header (vocab size {}, eos id {})",
          path.string(), vocab_size_, eos_id_);
  tokens_ = {reinterpret_cast<const std::uint32_t*>(p + kShardHeaderBytes), static_cast<std::size_t>(count)};
  for (std::size_t i = 0; i < tokens_.size(); ++i)
    if (tokens_[i] >= vocab_size_)
      raise(ErrorKind::Data, "token shard '{}' is corrupt: token id {} at position {} is >= vocab size {}",
            path.string(), tokens_[i], i, vocab_size_);
}

}  // namespace spes
