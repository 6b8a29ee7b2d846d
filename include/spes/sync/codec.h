// Wire encodings of fp32 tensor values (see docs/protocol.md):
//   fp32        exact;
//   bf16        the upper half of each float, rounded to nearest even (half the bytes);
//   int8_delta  the difference against the last synced weights, quantized to int8 with one fp32
//               scale per block of values (about a quarter of the bytes).
// Lossy encodings use error feedback: the sender keeps what quantization lost (the residual) and
// adds it to what it sends next time, so the error does not accumulate over rounds.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "spes/config/config.h"

namespace spes {

// Bytes that `count` values take on the wire.
std::size_t encoded_size(WireEncoding encoding, std::int64_t count, std::int64_t block);

// Encodes values[0..count). What is encoded is v = values − baseline (int8_delta) or values
// (otherwise), plus residual[i] when `residual` is not null; afterwards residual = v − decode(v).
// `decoded` receives exactly what decode() will reconstruct on the receiver (in value space).
// `baseline` is required for int8_delta and ignored otherwise.
void encode_values(WireEncoding encoding, const float* values, const float* baseline, float* residual,
                   std::int64_t count, std::int64_t block, std::string& out, float* decoded);

// Reconstructs count values from wire bytes. Throws Error(Peer) when the byte count does not
// match the encoding.
void decode_values(WireEncoding encoding, std::string_view bytes, const float* baseline,
                   std::int64_t count, std::int64_t block, float* out);

// zlib crc32 of a byte range.
std::uint32_t crc32_of(const void* data, std::size_t size);

// Round-to-nearest-even fp32 → bf16 → fp32 (NaN stays NaN).
float round_to_bf16(float value);

}  // namespace spes
