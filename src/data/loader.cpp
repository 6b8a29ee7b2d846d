#include "spes/data/loader.h"

#include "spes/util/error.h"

namespace spes {

namespace {
// splitmix64: a fixed, portable mixer (std::shuffle's algorithm differs between libraries).
std::uint64_t mix(std::uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

void copy_window(const TokenShard& shard, std::int64_t start, std::int64_t seq_len, std::int64_t* in,
                 std::int64_t* tgt) {
  const std::uint32_t* t = shard.tokens().data() + start;
  for (std::int64_t i = 0; i < seq_len; ++i) {
    in[i] = t[i];
    tgt[i] = t[i + 1];
  }
}

TokenBatch empty_batch(std::int64_t batch, std::int64_t seq_len) {
  TokenBatch b;
  b.batch = batch;
  b.seq_len = seq_len;
  b.inputs.resize(static_cast<std::size_t>(batch * seq_len));
  b.targets.resize(static_cast<std::size_t>(batch * seq_len));
  return b;
}
}  // namespace

std::uint64_t node_data_seed(std::uint64_t seed, int node_id) {
  return seed + 1000ull * static_cast<std::uint64_t>(node_id);
}

WindowSampler::WindowSampler(const TokenShard& shard, std::int64_t seq_len, std::uint64_t seed, int node_id)
    : shard_(shard), seq_len_(seq_len), seed_(node_data_seed(seed, node_id)) {
  SPES_CHECK(seq_len > 0, "seq_len must be positive");
  // Room for any offset in [0, seq_len) plus the final target token.
  const auto n = static_cast<std::int64_t>(shard.size());
  windows_ = n > seq_len ? (n - seq_len) / seq_len : 0;
  if (windows_ < 1)
    raise(ErrorKind::Data, "token shard '{}' holds {} tokens, too few for one training window of {} "
          "tokens plus offset", shard.path().string(), n, 2 * seq_len);
  start_epoch();
}

void WindowSampler::start_epoch() {
  std::uint64_t state = mix(seed_ ^ mix(state_.epoch + 1));
  offset_ = static_cast<std::int64_t>(state % static_cast<std::uint64_t>(seq_len_));
  order_.resize(static_cast<std::size_t>(windows_));
  for (std::int64_t i = 0; i < windows_; ++i) order_[i] = static_cast<std::uint32_t>(i);
  for (std::int64_t i = windows_ - 1; i > 0; --i) {  // Fisher-Yates
    state = mix(state);
    auto j = static_cast<std::int64_t>(state % static_cast<std::uint64_t>(i + 1));
    std::swap(order_[i], order_[j]);
  }
}

TokenBatch WindowSampler::next_batch(std::int64_t batch) {
  TokenBatch b = empty_batch(batch, seq_len_);
  for (std::int64_t row = 0; row < batch; ++row) {
    if (state_.cursor >= static_cast<std::uint64_t>(windows_)) {
      ++state_.epoch;
      state_.cursor = 0;
      start_epoch();
    }
    std::int64_t start = offset_ + static_cast<std::int64_t>(order_[state_.cursor]) * seq_len_;
    copy_window(shard_, start, seq_len_, b.inputs.data() + row * seq_len_, b.targets.data() + row * seq_len_);
    ++state_.cursor;
  }
  return b;
}

void WindowSampler::restore(const LoaderState& state) {
  if (state.cursor > static_cast<std::uint64_t>(windows_))
    raise(ErrorKind::Checkpoint, "loader position {} is past the {} windows of '{}': the checkpoint "
          "was made with other data", state.cursor, windows_, shard_.path().string());
  state_ = state;
  start_epoch();
}

std::int64_t validation_windows(const TokenShard& shard, std::int64_t seq_len) {
  const auto n = static_cast<std::int64_t>(shard.size());
  return n > seq_len ? (n - 1) / seq_len : 0;
}

TokenBatch validation_batch(const TokenShard& shard, std::int64_t seq_len, std::int64_t first,
                            std::int64_t count) {
  const std::int64_t windows = validation_windows(shard, seq_len);
  if (windows < 1)
    raise(ErrorKind::Data, "validation shard '{}' holds {} tokens, too few for one window of {}",
          shard.path().string(), shard.size(), seq_len + 1);
  TokenBatch b = empty_batch(count, seq_len);
  for (std::int64_t row = 0; row < count; ++row) {
    std::int64_t w = (first + row) % windows;
    copy_window(shard, w * seq_len, seq_len, b.inputs.data() + row * seq_len, b.targets.data() + row * seq_len);
  }
  return b;
}

}  // namespace spes
