// What a peer sends in a round, on arbitrary bytes: a stream of TensorChunk messages checked and
// decoded by StreamReceiver (src/sync/payload.h) for one slice of a small model, in the encoding
// the input's first byte picks. A hostile peer may get its stream refused (spes::Error), never a
// crash, an out-of-bounds access or a non-finite value accepted.
// Input: [encoding byte] then chunks as [u32 little-endian length][serialized TensorChunk].
#include <cmath>
#include <cstring>

#include "payload.h"
#include "seeds.h"
#include "spes/util/error.h"

using namespace spes;
using namespace spes::sync_detail;

namespace {

struct Model {
  std::vector<float> a = std::vector<float>(64 * 32), b = std::vector<float>(32);
  ParamSet params;
  Model() {
    for (std::size_t i = 0; i < a.size(); ++i) a[i] = std::sin(static_cast<float>(i)) * 0.1f;
    for (std::size_t i = 0; i < b.size(); ++i) b[i] = 1.0f + 0.01f * static_cast<float>(i);
    params = ParamSet({{"layers.0.self_attn.q_proj.weight", {64, 32}, a.data(), 64 * 32},
                       {"layers.0.input_layernorm.weight", {32}, b.data(), 32}});
  }
};

const WireEncoding kEncodings[] = {WireEncoding::Fp32, WireEncoding::Bf16, WireEncoding::Int8Delta, WireEncoding::Sparse};
constexpr std::size_t kEncodingCount = sizeof kEncodings / sizeof kEncodings[0];
const SparseFormat kSparse{256, 13, 2};  // small chunks, so a 2 KiB tensor has several

StreamHeader header() {
  StreamHeader h;
  h.run_id = "fuzz";
  h.round = 3;
  h.sender = 1;
  h.part = spes::v1::SHARED_RAW;
  h.slice = 0;
  return h;
}

}  // namespace

void write_seeds(const std::filesystem::path& dir) {
  Model m;
  const auto ranges = m.params.shared_slice(0, 1);
  const auto current = gather(m.params, ranges, [&](std::size_t i) { return m.params[i].data; });
  std::vector<float> values(current), baseline(current);
  for (auto& v : values) v *= 1.01f;
  // Each encoding plain and with its pieces as zstd frames (sync.compression) where they shrink.
  for (std::size_t seed = 0; seed < 2 * kEncodingCount; ++seed) {
    const std::size_t e = seed % kEncodingCount;
    std::vector<float> decoded(values.size());
    auto stream = build_stream(header(), m.params, ranges, kEncodings[e], values.data(),
                               is_delta_encoding(kEncodings[e]) ? baseline.data() : nullptr, nullptr, 4096,
                               decoded.data(), kSparse, 1, seed < kEncodingCount ? 0 : 1);
    std::string bytes(1, static_cast<char>(e));
    for (const auto& chunk : stream->chunks) {
      const std::string s = chunk.SerializeAsString();
      const auto n = static_cast<std::uint32_t>(s.size());
      bytes.append(reinterpret_cast<const char*>(&n), 4);
      bytes += s;
    }
    std::ofstream(dir / ("stream" + std::to_string(seed)), std::ios::binary) << bytes;
  }
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static Model m;
  static const auto ranges = m.params.shared_slice(0, 1);
  static const auto current = gather(m.params, ranges, [&](std::size_t i) { return m.params[i].data; });
  if (size < 1) return 0;
  const WireEncoding encoding = kEncodings[data[0] % kEncodingCount];
  std::vector<float> baseline = is_delta_encoding(encoding) ? current : std::vector<float>{};
  try {
    StreamReceiver receiver(header(), m.params, ranges, encoding, baseline, current, 1.0, kSparse);
    std::size_t at = 1;
    while (at + 4 <= size) {
      std::uint32_t n = 0;
      std::memcpy(&n, data + at, 4);
      at += 4;
      if (n > size - at) break;
      spes::v1::TensorChunk chunk;
      if (chunk.ParseFromArray(data + at, static_cast<int>(n))) receiver.add(chunk);
      at += n;
    }
    receiver.finish();
    for (float v : receiver.values())
      if (!std::isfinite(v)) std::abort();  // validation lets no non-finite value through
  } catch (const spes::Error&) {
  }
  return 0;
}
