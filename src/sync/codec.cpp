#include "spes/sync/codec.h"

#include <zlib.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "spes/util/error.h"
#include "spes/util/parallel.h"

namespace spes {
namespace {

// Work handed to one thread at a time: ~256k values either way, enough that starting threads
// costs little next to it.
constexpr std::int64_t kSparseChunksPerTask = 64;
constexpr std::int64_t kValuesPerTask = 1 << 18;

std::uint16_t to_bf16_bits(float value) {
  std::uint32_t bits;
  std::memcpy(&bits, &value, 4);
  if ((bits & 0x7f800000u) == 0x7f800000u && (bits & 0x007fffffu) != 0)
    return static_cast<std::uint16_t>((bits >> 16) | 0x0040u);  // keep NaN a (quiet) NaN
  const std::uint32_t rounding = 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<std::uint16_t>((bits + rounding) >> 16);
}

float from_bf16_bits(std::uint16_t half) {
  const std::uint32_t bits = static_cast<std::uint32_t>(half) << 16;
  float value;
  std::memcpy(&value, &bits, 4);
  return value;
}

std::int64_t block_count(std::int64_t count, std::int64_t block) { return (count + block - 1) / block; }

// Little-endian bit packing into / out of a byte range (LSB first).
class BitWriter {
 public:
  explicit BitWriter(unsigned char* out) : out_(out) {}
  void put(std::uint32_t value, int bits) {
    for (int b = 0; b < bits; ++b, ++pos_)
      if ((value >> b) & 1u) out_[pos_ >> 3] |= static_cast<unsigned char>(1u << (pos_ & 7));
  }
 private:
  unsigned char* out_;
  std::size_t pos_ = 0;
};

class BitReader {
 public:
  explicit BitReader(const unsigned char* in) : in_(in) {}
  std::uint32_t get(int bits) {
    std::uint32_t value = 0;
    for (int b = 0; b < bits; ++b, ++pos_) value |= static_cast<std::uint32_t>((in_[pos_ >> 3] >> (pos_ & 7)) & 1u) << b;
    return value;
  }
 private:
  const unsigned char* in_;
  std::size_t pos_ = 0;
};

// Half of the code range: code c stands for (c - half) x scale.
float half_range(int bits) { return static_cast<float>((1u << bits) - 1) / 2.0f; }

// The code of x at `scale` (values past the outer levels take the outer code).
float code_of(float x, float scale, float half, float top) {
  return std::clamp(std::nearbyint(x / scale + half), 0.0f, top);
}

// A chunk sent whole: of the scales amax / half x 0.25 … 4, the one whose codes have the least
// squared error. With 2 bits the amax scale puts the inner levels at amax / 3, far above most of a
// chunk's values; a smaller step clips the few largest (error feedback sends the rest later) and
// halves the error of all the others (docs/quality.md, "Sparse payloads": +1.3% instead of +4.1%
// over fp32 at 300 steps with the shared parameters sent whole at 2 bits).
// The error is estimated on every 4th value of a long chunk (the choice only needs the best of
// nine, and the encoder is 2.5x faster for it).
float least_squares_scale(const float* v, std::int64_t n, float amax_scale, float half, float top) {
  const std::int64_t stride = n >= 1024 ? 4 : 1;
  float best_scale = amax_scale;
  float best = -1;
  for (float f : {0.25f, 0.35f, 0.5f, 0.7f, 1.0f, 1.4f, 2.0f, 2.8f, 4.0f}) {
    const float s = amax_scale * f, inv = 1.0f / s;
    float err = 0;
    for (std::int64_t i = 0; i < n; i += stride) {
      const float c = std::clamp(std::floor(v[i] * inv + half + 0.5f), 0.0f, top);
      const float e = v[i] - (c - half) * s;
      err += e * e;
    }
    if (best < 0 || err < best) best = err, best_scale = s;
  }
  return best_scale;
}

}  // namespace

std::int64_t SparseFormat::k_of(std::int64_t n) const {
  if (n >= chunk) return k;
  return std::clamp<std::int64_t>((k * n + chunk - 1) / chunk, 1, n);
}

int SparseFormat::index_bits() const {
  int b = 1;
  while ((std::int64_t{1} << b) < chunk) ++b;
  return b;
}

std::size_t SparseFormat::chunk_bytes(std::int64_t n) const {
  const std::int64_t k = k_of(n), bits_total = k * ((k < n ? index_bits() : 0) + bits);
  return 4 + static_cast<std::size_t>((bits_total + 7) / 8);
}

std::size_t SparseFormat::size(std::int64_t count) const {
  std::size_t bytes = 0;
  for (std::int64_t lo = 0; lo < count; lo += chunk) bytes += chunk_bytes(std::min(chunk, count - lo));
  return bytes;
}

void encode_sparse(const SparseFormat& f, const float* values, const float* baseline, float* residual,
                   std::int64_t count, std::string& out, float* decoded, int threads) {
  SPES_CHECK(baseline != nullptr && f.chunk > 0 && f.k > 0, "sparse needs a baseline and a format");
  out.assign(f.size(count), '\0');
  auto* const start = reinterpret_cast<unsigned char*>(out.data());
  const float half = half_range(f.bits);
  const auto top = static_cast<std::uint32_t>((1u << f.bits) - 1);
  const std::int64_t chunks = (count + f.chunk - 1) / f.chunk;
  // Chunks are independent and every one but the last is full, so chunk c starts at
  // c x chunk_bytes(chunk) in `out`: ranges of chunks can be encoded on separate threads.
  parallel_ranges(chunks, kSparseChunksPerTask, threads, [&](std::int64_t first, std::int64_t end) {
    std::vector<float> v(static_cast<std::size_t>(f.chunk));
    std::vector<std::int64_t> order(static_cast<std::size_t>(f.chunk));
    auto* dst = start + static_cast<std::size_t>(first) * f.chunk_bytes(f.chunk);
    for (std::int64_t lo = first * f.chunk; lo < std::min(count, end * f.chunk); lo += f.chunk) {
      const std::int64_t n = std::min(f.chunk, count - lo), k = f.k_of(n);
      for (std::int64_t i = 0; i < n; ++i) {
        v[i] = values[lo + i] - baseline[lo + i] + (residual ? residual[lo + i] : 0.0f);
        order[i] = i;
      }
      // The k largest magnitudes (ties: the lower position), then in position order.
      auto larger = [&](std::int64_t a, std::int64_t b) {
        const float x = std::fabs(v[a]), y = std::fabs(v[b]);
        return x > y || (x == y && a < b);
      };
      const bool whole = k == n;  // every value: no positions on the wire
      if (!whole) {
        std::nth_element(order.begin(), order.begin() + (k - 1), order.begin() + n, larger);
        std::sort(order.begin(), order.begin() + k);
      }
      float amax = 0.0f;
      for (std::int64_t j = 0; j < k; ++j) amax = std::max(amax, std::fabs(v[order[j]]));
      float scale = amax > 0 && std::isfinite(amax) ? amax / half : 0.0f;
      if (whole && scale > 0) scale = least_squares_scale(v.data(), n, scale, half, static_cast<float>(top));
      std::memcpy(dst, &scale, 4);
      // Positions, then codes right after their bits.
      BitWriter packed(dst + 4);
      if (!whole)
        for (std::int64_t j = 0; j < k; ++j) packed.put(static_cast<std::uint32_t>(order[j]), f.index_bits());
      // Everything not sent stays in the residual; decoded is the baseline plus what was sent.
      for (std::int64_t i = 0; i < n; ++i) {
        decoded[lo + i] = baseline[lo + i];
        if (residual) residual[lo + i] = v[i];
      }
      for (std::int64_t j = 0; j < k; ++j) {
        const std::int64_t i = order[j];
        const float c = scale > 0 ? code_of(v[i], scale, half, static_cast<float>(top)) : 0.0f;
        const auto code = static_cast<std::uint32_t>(c);
        packed.put(code, f.bits);
        const float sent = scale > 0 ? (static_cast<float>(code) - half) * scale : 0.0f;
        decoded[lo + i] = baseline[lo + i] + sent;
        if (residual) residual[lo + i] = v[i] - sent;
      }
      dst += f.chunk_bytes(n);
    }
  });
}

void decode_sparse(const SparseFormat& f, std::string_view bytes, const float* baseline, std::int64_t count,
                   float* out) {
  if (f.chunk <= 0 || f.k <= 0 || f.k > f.chunk || !sparse_bits_supported(f.bits))
    raise(ErrorKind::Peer, "sparse piece has chunk {}, k {}, bits {}", f.chunk, f.k, f.bits);
  const std::size_t expected = f.size(count);
  if (bytes.size() != expected)
    raise(ErrorKind::Peer, "sparse payload of {} values has {} bytes, expected {}", count, bytes.size(), expected);
  const auto* src = reinterpret_cast<const unsigned char*>(bytes.data());
  const float half = half_range(f.bits);
  std::vector<std::int64_t> positions(static_cast<std::size_t>(f.k));
  for (std::int64_t lo = 0; lo < count; lo += f.chunk) {
    const std::int64_t n = std::min(f.chunk, count - lo), k = f.k_of(n);
    float scale;
    std::memcpy(&scale, src, 4);
    if (!std::isfinite(scale) || scale < 0)
      raise(ErrorKind::Peer, "sparse chunk at value {} has scale {}", lo, scale);
    BitReader bits(src + 4);
    const bool whole = k == n;  // a chunk sent whole carries no positions
    for (std::int64_t j = 0; j < k; ++j) {
      if (whole) {
        positions[j] = j;
        continue;
      }
      positions[j] = bits.get(f.index_bits());
      if (positions[j] >= n || (j > 0 && positions[j] <= positions[j - 1]))
        raise(ErrorKind::Peer, "sparse chunk at value {}: position {} of {} is {} (positions must rise, below {})", lo,
              j, k, positions[j], n);
    }
    for (std::int64_t i = 0; i < n; ++i) out[lo + i] = baseline[lo + i];
    for (std::int64_t j = 0; j < k; ++j)
      out[lo + positions[j]] = baseline[lo + positions[j]] + (static_cast<float>(bits.get(f.bits)) - half) * scale;
    src += f.chunk_bytes(n);
  }
}

float round_to_bf16(float value) { return from_bf16_bits(to_bf16_bits(value)); }

std::uint32_t crc32_of(const void* data, std::size_t size, int threads) {
  // Blocks of 16 MiB (zlib takes uInt lengths), checksummed on up to `threads` threads and joined
  // with crc32_combine: the same value as one pass.
  constexpr std::size_t kBlock = std::size_t{16} << 20;
  const auto* p = static_cast<const Bytef*>(data);
  const auto blocks = static_cast<std::int64_t>((size + kBlock - 1) / kBlock);
  std::vector<uLong> crcs(static_cast<std::size_t>(blocks));
  parallel_ranges(blocks, 1, threads, [&](std::int64_t first, std::int64_t end) {
    for (std::int64_t b = first; b < end; ++b) {
      const std::size_t at = static_cast<std::size_t>(b) * kBlock;
      crcs[b] = crc32(crc32(0L, Z_NULL, 0), p + at, static_cast<uInt>(std::min(kBlock, size - at)));
    }
  });
  uLong crc = crc32(0L, Z_NULL, 0);
  for (std::int64_t b = 0; b < blocks; ++b) {
    const std::size_t at = static_cast<std::size_t>(b) * kBlock;
    crc = crc32_combine(crc, crcs[b], static_cast<z_off_t>(std::min(kBlock, size - at)));
  }
  return static_cast<std::uint32_t>(crc);
}

std::size_t encoded_size(WireEncoding encoding, std::int64_t count, std::int64_t block) {
  switch (encoding) {
    case WireEncoding::Fp32: return static_cast<std::size_t>(count) * 4;
    case WireEncoding::Bf16: return static_cast<std::size_t>(count) * 2;
    case WireEncoding::Int8Delta:
      return static_cast<std::size_t>(count) + 4 * static_cast<std::size_t>(block_count(count, block));
    case WireEncoding::Sparse: break;  // SparseFormat::size
  }
  SPES_CHECK(false, "sparse payloads are sized by SparseFormat");
  return 0;
}

void encode_values(WireEncoding encoding, const float* values, const float* baseline, float* residual,
                   std::int64_t count, std::int64_t block, std::string& out, float* decoded, int threads) {
  SPES_CHECK(encoding != WireEncoding::Sparse, "sparse payloads go through encode_sparse");
  out.resize(encoded_size(encoding, count, block));
  auto input = [&](std::int64_t i) {
    float v = encoding == WireEncoding::Int8Delta ? values[i] - baseline[i] : values[i];
    return residual ? v + residual[i] : v;
  };
  switch (encoding) {
    case WireEncoding::Fp32:
      std::memcpy(out.data(), values, static_cast<std::size_t>(count) * 4);
      std::memcpy(decoded, values, static_cast<std::size_t>(count) * 4);
      if (residual) std::fill(residual, residual + count, 0.0f);
      return;
    case WireEncoding::Bf16: {
      auto* dst = reinterpret_cast<unsigned char*>(out.data());
      parallel_ranges(count, kValuesPerTask, threads, [&](std::int64_t first, std::int64_t end) {
        for (std::int64_t i = first; i < end; ++i) {
          const float v = input(i);
          const std::uint16_t h = to_bf16_bits(v);
          std::memcpy(dst + 2 * i, &h, 2);
          decoded[i] = from_bf16_bits(h);
          if (residual) residual[i] = v - decoded[i];
        }
      });
      return;
    }
    case WireEncoding::Int8Delta: {
      SPES_CHECK(baseline != nullptr && block > 0, "int8_delta needs a baseline and a block size");
      const std::int64_t blocks = block_count(count, block);
      auto* scales = reinterpret_cast<unsigned char*>(out.data());
      auto* q = reinterpret_cast<std::int8_t*>(out.data() + 4 * blocks);
      const std::int64_t grain = std::max<std::int64_t>(1, kValuesPerTask / block);
      parallel_ranges(blocks, grain, threads, [&](std::int64_t first, std::int64_t end) {
        std::vector<float> v(static_cast<std::size_t>(block));
        for (std::int64_t b = first; b < end; ++b) {
          const std::int64_t lo = b * block, n = std::min(block, count - lo);
          float amax = 0.0f;
          for (std::int64_t i = 0; i < n; ++i) {
            v[i] = input(lo + i);
            amax = std::max(amax, std::fabs(v[i]));
          }
          const float scale = amax / 127.0f;
          std::memcpy(scales + 4 * b, &scale, 4);
          for (std::int64_t i = 0; i < n; ++i) {
            const float r = scale > 0 ? std::nearbyint(v[i] / scale) : 0.0f;
            const auto qi = static_cast<std::int8_t>(std::clamp(r, -127.0f, 127.0f));
            q[lo + i] = qi;
            const float delta = static_cast<float>(qi) * scale;
            decoded[lo + i] = baseline[lo + i] + delta;
            if (residual) residual[lo + i] = v[i] - delta;
          }
        }
      });
      return;
    }
    case WireEncoding::Sparse: return;  // checked above
  }
}

void decode_values(WireEncoding encoding, std::string_view bytes, const float* baseline,
                   std::int64_t count, std::int64_t block, float* out) {
  SPES_CHECK(encoding != WireEncoding::Sparse, "sparse payloads go through decode_sparse");
  if (encoding == WireEncoding::Int8Delta && block <= 0)
    raise(ErrorKind::Peer, "int8_delta piece has block size {}", block);
  const std::size_t expected = encoded_size(encoding, count, block);
  if (bytes.size() != expected)
    raise(ErrorKind::Peer, "{} payload of {} values has {} bytes, expected {}", wire_encoding_name(encoding),
          count, bytes.size(), expected);
  switch (encoding) {
    case WireEncoding::Fp32:
      std::memcpy(out, bytes.data(), expected);
      return;
    case WireEncoding::Bf16:
      for (std::int64_t i = 0; i < count; ++i) {
        std::uint16_t h;
        std::memcpy(&h, bytes.data() + 2 * i, 2);
        out[i] = from_bf16_bits(h);
      }
      return;
    case WireEncoding::Int8Delta: {
      const std::int64_t blocks = block_count(count, block);
      const auto* q = reinterpret_cast<const std::int8_t*>(bytes.data() + 4 * blocks);
      for (std::int64_t b = 0; b < blocks; ++b) {
        float scale;
        std::memcpy(&scale, bytes.data() + 4 * b, 4);
        const std::int64_t lo = b * block, n = std::min(block, count - lo);
        for (std::int64_t i = 0; i < n; ++i) out[lo + i] = baseline[lo + i] + static_cast<float>(q[lo + i]) * scale;
      }
      return;
    }
    case WireEncoding::Sparse: return;  // checked above
  }
}

}  // namespace spes
