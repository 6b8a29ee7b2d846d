// Wire encodings of fp32 tensor values (see docs/protocol.md):
//   fp32        exact;
//   bf16        the upper half of each float, rounded to nearest even (half the bytes);
//   int8_delta  the difference against the last synced weights, quantized to int8 with one fp32
//               scale per block of values (about a quarter of the bytes);
//   sparse      that difference, but per chunk only the k largest in magnitude: their positions
//               bit-packed within the chunk, their values quantized to 2, 4 or 8 bits with one
//               fp32 scale per chunk (SparseLoCo's payload; about 1/100 of the bytes at 2%, 2 bits).
// Lossy encodings use error feedback: the sender keeps what quantization lost (the residual) and
// adds it to what it sends next time, so the error does not accumulate over rounds.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "spes/config/config.h"

namespace spes {

// The bit widths the sparse encoding quantizes values to (sync.sparse.bits and average_bits; the
// config check and the wire check both ask this).
constexpr bool sparse_bits_supported(int bits) { return bits == 2 || bits == 4 || bits == 8; }

// Bytes that `count` values take on the wire.
std::size_t encoded_size(WireEncoding encoding, std::int64_t count, std::int64_t block);

// Encodes values[0..count). What is encoded is v = values − baseline (int8_delta) or values
// (otherwise), plus residual[i] when `residual` is not null; afterwards residual = v − decode(v).
// `decoded` receives exactly what decode() will reconstruct on the receiver (in value space).
// `baseline` is required for int8_delta and ignored otherwise. `threads`: how many may share the
// work (the bytes are the same at any count).
void encode_values(WireEncoding encoding, const float* values, const float* baseline, float* residual,
                   std::int64_t count, std::int64_t block, std::string& out, float* decoded, int threads = 1);

// Reconstructs count values from wire bytes. Throws Error(Peer) when the byte count does not
// match the encoding.
void decode_values(WireEncoding encoding, std::string_view bytes, const float* baseline,
                   std::int64_t count, std::int64_t block, float* out);

// The sparse layout of a run (sync.sparse). A piece of `count` values is cut into chunks of
// `chunk` values from its start (the last may be shorter); chunk j of n values carries k_of(n)
// values: [fp32 scale][k_of(n) positions, index_bits() bits each, ascending][k_of(n) codes, `bits`
// bits each], padded to a whole byte. Code c stands for (c - (2^bits - 1) / 2) x scale.
// A tensor of fewer than dense_below values goes whole as int8_delta instead (sync.sparse.dense_below).
struct SparseFormat {
  std::int64_t chunk = 4096;
  std::int64_t k = 82;
  int bits = 2;
  std::int64_t dense_below = 0;

  static SparseFormat of(const SparseConfig& config) {
    return {config.chunk, config.k(), config.bits, config.dense_below};
  }
  // The encoding of a tensor of `numel` values in a part whose encoding is `part`.
  WireEncoding tensor_encoding(WireEncoding part, std::int64_t numel) const {
    return part == WireEncoding::Sparse && numel < dense_below ? WireEncoding::Int8Delta : part;
  }
  std::int64_t k_of(std::int64_t n) const;   // values sent of a chunk of n
  int index_bits() const;                    // bits per position (enough for chunk - 1)
  std::size_t chunk_bytes(std::int64_t n) const;
  std::size_t size(std::int64_t count) const;  // bytes of a piece of count values
};

// Encodes v = values − baseline (+ residual) sparsely; afterwards residual = v − what was sent
// (every unsent value whole), decoded = baseline + what was sent. `threads` as for encode_values.
void encode_sparse(const SparseFormat& format, const float* values, const float* baseline, float* residual,
                   std::int64_t count, std::string& out, float* decoded, int threads = 1);
// out = baseline + the sent values (zero elsewhere). Throws Error(Peer) on a wrong byte count, a
// scale that is negative or not finite, positions out of order, repeated or past the chunk.
void decode_sparse(const SparseFormat& format, std::string_view bytes, const float* baseline, std::int64_t count,
                   float* out);

// zlib crc32 of a byte range; `threads` may share a long one (the same value at any count).
std::uint32_t crc32_of(const void* data, std::size_t size, int threads = 1);

// Round-to-nearest-even fp32 → bf16 → fp32 (NaN stays NaN).
float round_to_bf16(float value);

}  // namespace spes
