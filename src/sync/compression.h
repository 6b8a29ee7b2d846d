// Lossless compression of a piece's payload (sync.compression): zstd frames, each piece on its
// own. The encodings leave structure behind — whole rows of the embedding and head move alike, and
// 2-bit codes are not equally likely — that a general-purpose compressor finds. Internal to the
// sync module.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace spes::sync_detail {

// Replaces `data` with a zstd frame of it at `level` (1..19) and returns true when that is at least
// 1/32 smaller; otherwise leaves it as it is and returns false (it goes uncompressed).
bool compress_payload(std::string& data, int level);

// The bytes a zstd frame holds, which must be exactly `expected` (what the piece's encoding takes
// for its count): a frame that does not say its size, says another one, or does not decode is
// refused with Error(Peer) naming `tensor`. Never allocates more than `expected` bytes.
std::string decompress_payload(std::string_view frame, std::size_t expected, const std::string& tensor);

}  // namespace spes::sync_detail
