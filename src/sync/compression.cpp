#include "compression.h"

#include <zstd.h>

#include "spes/util/error.h"

namespace spes::sync_detail {

bool compress_payload(std::string& data, int level) {
  if (data.empty()) return false;
  std::string frame(ZSTD_compressBound(data.size()), '\0');
  const std::size_t n = ZSTD_compress(frame.data(), frame.size(), data.data(), data.size(), level);
  if (ZSTD_isError(n) || n > data.size() - data.size() / 32) return false;
  frame.resize(n);
  data.swap(frame);
  return true;
}

std::string decompress_payload(std::string_view frame, std::size_t expected, const std::string& tensor) {
  const unsigned long long declared = ZSTD_getFrameContentSize(frame.data(), frame.size());
  if (declared == ZSTD_CONTENTSIZE_ERROR)
    raise(ErrorKind::Peer, "tensor '{}' is marked zstd but its data is not a zstd frame", tensor);
  if (declared == ZSTD_CONTENTSIZE_UNKNOWN || declared != expected)
    raise(ErrorKind::Peer, "tensor '{}' holds a zstd frame of {} bytes, expected {}", tensor,
          declared == ZSTD_CONTENTSIZE_UNKNOWN ? std::string("unknown") : std::to_string(declared), expected);
  std::string out(expected, '\0');
  const std::size_t n = ZSTD_decompress(out.data(), out.size(), frame.data(), frame.size());
  if (ZSTD_isError(n) || n != expected)
    raise(ErrorKind::Peer, "tensor '{}': its zstd frame does not decode ({})", tensor,
          ZSTD_isError(n) ? ZSTD_getErrorName(n) : "short");
  return out;
}

}  // namespace spes::sync_detail
