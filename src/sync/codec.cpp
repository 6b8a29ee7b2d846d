#include "spes/sync/codec.h"

#include <zlib.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "spes/util/error.h"

namespace spes {
namespace {

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

}  // namespace

float round_to_bf16(float value) { return from_bf16_bits(to_bf16_bits(value)); }

std::uint32_t crc32_of(const void* data, std::size_t size) {
  uLong crc = crc32(0L, Z_NULL, 0);
  const auto* p = static_cast<const Bytef*>(data);
  while (size > 0) {  // zlib takes uInt lengths
    const auto n = static_cast<uInt>(std::min<std::size_t>(size, 1u << 30));
    crc = crc32(crc, p, n);
    p += n;
    size -= n;
  }
  return static_cast<std::uint32_t>(crc);
}

std::size_t encoded_size(WireEncoding encoding, std::int64_t count, std::int64_t block) {
  switch (encoding) {
    case WireEncoding::Fp32: return static_cast<std::size_t>(count) * 4;
    case WireEncoding::Bf16: return static_cast<std::size_t>(count) * 2;
    case WireEncoding::Int8Delta:
      return static_cast<std::size_t>(count) + 4 * static_cast<std::size_t>(block_count(count, block));
  }
  return 0;
}

void encode_values(WireEncoding encoding, const float* values, const float* baseline, float* residual,
                   std::int64_t count, std::int64_t block, std::string& out, float* decoded) {
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
      for (std::int64_t i = 0; i < count; ++i) {
        const float v = input(i);
        const std::uint16_t h = to_bf16_bits(v);
        std::memcpy(dst + 2 * i, &h, 2);
        decoded[i] = from_bf16_bits(h);
        if (residual) residual[i] = v - decoded[i];
      }
      return;
    }
    case WireEncoding::Int8Delta: {
      SPES_CHECK(baseline != nullptr && block > 0, "int8_delta needs a baseline and a block size");
      const std::int64_t blocks = block_count(count, block);
      auto* scales = reinterpret_cast<unsigned char*>(out.data());
      auto* q = reinterpret_cast<std::int8_t*>(out.data() + 4 * blocks);
      std::vector<float> v(static_cast<std::size_t>(block));
      for (std::int64_t b = 0; b < blocks; ++b) {
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
      return;
    }
  }
}

void decode_values(WireEncoding encoding, std::string_view bytes, const float* baseline,
                   std::int64_t count, std::int64_t block, float* out) {
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
  }
}

}  // namespace spes
