// Wire codec, stream validation and the merge warm-up (torch-free).
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <functional>
#include <map>
#include <random>

#include "../../src/sync/compression.h"
#include "../../src/sync/payload.h"
#include "spes/sync/codec.h"
#include "spes/sync/merge.h"
#include "spes/util/error.h"
#include "spes/util/parallel.h"
#include "sync_fixture.h"

namespace spes {
namespace {

std::vector<float> randn(std::size_t n, unsigned seed, float scale = 1.0f) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = d(gen);
  return v;
}

TEST(Codec, Fp32IsExact) {
  auto v = randn(1000, 1);
  std::string bytes;
  std::vector<float> decoded(v.size()), back(v.size());
  encode_values(WireEncoding::Fp32, v.data(), nullptr, nullptr, 1000, 1, bytes, decoded.data());
  EXPECT_EQ(bytes.size(), 4000u);
  decode_values(WireEncoding::Fp32, bytes, nullptr, 1000, 1, back.data());
  EXPECT_EQ(back, v);
  EXPECT_EQ(decoded, v);
}

TEST(Codec, Bf16WithinHalfUlpAndMatchesSenderView) {
  auto v = randn(4096, 2, 3.0f);
  v[0] = 1.0f;
  v[1] = -0.0f;
  std::string bytes;
  std::vector<float> decoded(v.size()), back(v.size());
  encode_values(WireEncoding::Bf16, v.data(), nullptr, nullptr, 4096, 1, bytes, decoded.data());
  EXPECT_EQ(bytes.size(), 8192u);
  decode_values(WireEncoding::Bf16, bytes, nullptr, 4096, 1, back.data());
  EXPECT_EQ(back, decoded);
  EXPECT_EQ(back[0], 1.0f);
  for (std::size_t i = 0; i < v.size(); ++i)
    EXPECT_LE(std::fabs(back[i] - v[i]), std::fabs(v[i]) * (1.0f / 256.0f)) << i;  // 8 mantissa bits
  EXPECT_EQ(round_to_bf16(1.0f + 1.0f / 512.0f), 1.0f);  // tie rounds to even
  EXPECT_TRUE(std::isnan(round_to_bf16(NAN)));
}

TEST(Codec, Int8DeltaWithinHalfStepPerBlock) {
  const std::int64_t n = 1000, block = 64;
  auto base = randn(n, 3);
  auto delta = randn(n, 4, 0.01f);
  std::vector<float> v(n);
  for (std::int64_t i = 0; i < n; ++i) v[i] = base[i] + delta[i];
  std::string bytes;
  std::vector<float> decoded(n), back(n);
  encode_values(WireEncoding::Int8Delta, v.data(), base.data(), nullptr, n, block, bytes, decoded.data());
  EXPECT_EQ(bytes.size(), static_cast<std::size_t>(n + 4 * 16));  // 16 blocks of 64 (last partial)
  decode_values(WireEncoding::Int8Delta, bytes, base.data(), n, block, back.data());
  EXPECT_EQ(back, decoded);
  for (std::int64_t b = 0; b * block < n; ++b) {
    float amax = 0;
    for (std::int64_t i = b * block; i < std::min(n, (b + 1) * block); ++i) amax = std::max(amax, std::fabs(delta[i]));
    const float half_step = amax / 127.0f / 2.0f * 1.001f + 1e-6f;
    for (std::int64_t i = b * block; i < std::min(n, (b + 1) * block); ++i)
      EXPECT_LE(std::fabs(back[i] - v[i]), half_step) << i;
  }
  EXPECT_THROW(decode_values(WireEncoding::Int8Delta, bytes.substr(1), base.data(), n, block, back.data()), Error);
}

// `rounds` rounds of a node that trains (updates ~ N(bias, 1e-3) from weights randn(n, seed)),
// encodes its weights against what it synced last (`encode(values, synced, residual, decoded)`)
// and loads what everybody decoded. Returns the loaded weights, the residual and the exact
// trajectory.
struct Trajectory {
  std::vector<float> w, residual;
  std::vector<double> exact;
};
Trajectory train_and_sync(std::int64_t n, int rounds, float bias, unsigned seed,
                          const std::function<void(const float*, const float*, float*, float*)>& encode) {
  Trajectory t{randn(n, seed), std::vector<float>(n, 0.0f), {}};
  t.exact.assign(t.w.begin(), t.w.end());
  std::vector<float> synced = t.w, decoded(n);
  std::mt19937 gen(seed + 1);
  std::normal_distribution<float> noise(0.0f, 1e-3f);
  for (int round = 0; round < rounds; ++round) {
    for (std::int64_t i = 0; i < n; ++i) {
      const float u = noise(gen) + bias;
      t.w[i] += u;
      t.exact[i] += u;
    }
    encode(t.w.data(), synced.data(), t.residual.data(), decoded.data());
    synced = t.w = decoded;
  }
  return t;
}

// 100 rounds with a dense encoding. With error feedback the loaded weights stay within one
// quantization step of the exact trajectory (the error telescopes into the residual); without it
// the error keeps growing.
double accumulated_error(WireEncoding enc, bool feedback) {
  const std::int64_t n = 512, block = 128;
  const Trajectory t = train_and_sync(n, 100, 1e-3f, 5, [&](const float* w, const float* synced, float* residual, float* decoded) {
    std::string bytes;
    encode_values(enc, w, synced, feedback ? residual : nullptr, n, block, bytes, decoded);
  });
  double worst = 0;
  for (std::int64_t i = 0; i < n; ++i) worst = std::max(worst, std::fabs(t.exact[i] - t.w[i]));
  return worst;
}

TEST(Codec, ErrorFeedbackKeepsAccumulatedErrorBounded) {
  // int8: one step is max|delta|/127 per block, deltas ~4e-3 here.
  const double int8_fb = accumulated_error(WireEncoding::Int8Delta, true);
  const double int8_nofb = accumulated_error(WireEncoding::Int8Delta, false);
  EXPECT_LT(int8_fb, 1e-4);
  // bf16: half an ulp of values below 4 is at most 2^-7; updates are below half an ulp of 1.
  const double bf16_fb = accumulated_error(WireEncoding::Bf16, true);
  const double bf16_nofb = accumulated_error(WireEncoding::Bf16, false);
  EXPECT_LT(bf16_fb, 0.02);
  EXPECT_GT(bf16_nofb, 0.05);  // without feedback most of the 100 * 1e-3 drift is lost
  EXPECT_GT(bf16_nofb, 2 * bf16_fb);
  EXPECT_GT(int8_nofb, int8_fb);
}

// ---- sparse: top-k per chunk, 2/4/8-bit values, error feedback ----

TEST(Codec, SparsePicksTheLargestPerChunkWithExactPositions) {
  const SparseFormat f{256, 8, 2};
  const std::int64_t n = 256 * 3 + 100;  // three full chunks and a short one (k = ceil(8*100/256) = 4)
  EXPECT_EQ(f.k_of(100), 4);
  EXPECT_EQ(f.index_bits(), 8);
  EXPECT_EQ(f.chunk_bytes(256), 4u + (8 * (8 + 2) + 7) / 8);
  auto base = randn(n, 7);
  auto delta = randn(n, 8, 0.01f);
  std::vector<float> v(n), residual(n, 0.0f), decoded(n), back(n);
  for (std::int64_t i = 0; i < n; ++i) v[i] = base[i] + delta[i];
  std::vector<float> dv(n);  // the delta as the codec sees it (v - base in float)
  for (std::int64_t i = 0; i < n; ++i) dv[i] = v[i] - base[i];
  std::string bytes;
  encode_sparse(f, v.data(), base.data(), residual.data(), n, bytes, decoded.data());
  EXPECT_EQ(bytes.size(), f.size(n));
  decode_sparse(f, bytes, base.data(), n, back.data());
  EXPECT_EQ(back, decoded);  // the sender's view is the receiver's, bit for bit
  for (std::int64_t lo = 0; lo < n; lo += f.chunk) {
    const std::int64_t len = std::min(f.chunk, n - lo), k = f.k_of(len);
    // The positions sent are exactly the k largest |delta| of the chunk.
    std::vector<std::int64_t> order(len);
    for (std::int64_t i = 0; i < len; ++i) order[i] = i;
    std::sort(order.begin(), order.end(), [&](auto a, auto b) { return std::fabs(dv[lo + a]) > std::fabs(dv[lo + b]); });
    std::vector<bool> largest(len, false);
    for (std::int64_t j = 0; j < k; ++j) largest[order[j]] = true;
    const float amax = std::fabs(dv[lo + order[0]]), scale = amax / 1.5f;  // 2 bits: levels ±0.5, ±1.5
    for (std::int64_t i = 0; i < len; ++i) {
      const std::int64_t at = lo + i;
      const bool sent = back[at] != base[at];
      EXPECT_EQ(sent, largest[i]) << "value " << at;
      if (!largest[i]) {
        EXPECT_EQ(residual[at], dv[at]) << at;  // unsent: whole in the residual
      } else {
        EXPECT_LE(std::fabs((back[at] - base[at]) - dv[at]), scale / 2 * 1.001f + 1e-6f) << at;  // half a step
        EXPECT_NEAR(residual[at], dv[at] - (back[at] - base[at]), 1e-6f) << at;
      }
    }
  }
}

TEST(Codec, SparseBitsSetTheStep) {
  const std::int64_t n = 4096;
  auto base = randn(n, 9);
  auto delta = randn(n, 10, 0.01f);
  std::vector<float> v(n);
  for (std::int64_t i = 0; i < n; ++i) v[i] = base[i] + delta[i];
  double previous = 1e9;
  for (int bits : {2, 4, 8}) {
    const SparseFormat f{4096, 410, bits};
    std::string bytes;
    std::vector<float> residual(n, 0.0f), decoded(n);
    encode_sparse(f, v.data(), base.data(), residual.data(), n, bytes, decoded.data());
    double err = 0;  // error on the sent values only
    for (std::int64_t i = 0; i < n; ++i)
      if (decoded[i] != base[i]) err = std::max(err, static_cast<double>(std::fabs(residual[i])));
    EXPECT_LT(err, previous) << bits << " bits";
    previous = err;
    EXPECT_EQ(bytes.size(), 4u + static_cast<std::size_t>((410 * (12 + bits) + 7) / 8));
  }
}

// A chunk sent whole (k = chunk: sync.sparse.shared_density 1) carries no positions, and its scale
// is the candidate with the least squared error — at 2 bits far below the amax scale's, whose
// inner levels (amax / 3) sit above most of a chunk's values.
TEST(Codec, WholeChunksCarryNoPositionsAndALeastSquaresScale) {
  const SparseFormat f{256, 256, 2};
  const std::int64_t n = 256 * 2 + 10;  // the short chunk sends all of its 10 values too
  EXPECT_EQ(f.chunk_bytes(256), 4u + 256 * 2 / 8);
  EXPECT_EQ(f.size(n), 2 * (4u + 64) + 4 + 3);
  auto base = randn(n, 21);
  auto delta = randn(n, 22, 0.01f);
  std::vector<float> v(n), residual(n, 0.0f), decoded(n), back(n);
  for (std::int64_t i = 0; i < n; ++i) v[i] = base[i] + delta[i];
  std::string bytes;
  encode_sparse(f, v.data(), base.data(), residual.data(), n, bytes, decoded.data());
  ASSERT_EQ(bytes.size(), f.size(n));
  decode_sparse(f, bytes, base.data(), n, back.data());
  EXPECT_EQ(back, decoded);
  for (std::int64_t lo = 0; lo < n; lo += f.chunk) {
    const std::int64_t len = std::min(f.chunk, n - lo);
    double amax = 0, err = 0, amax_err = 0;
    for (std::int64_t i = lo; i < lo + len; ++i) amax = std::max(amax, std::fabs(double(v[i]) - base[i]));
    const double step = amax / 1.5;  // the amax scale: levels ±0.5, ±1.5 steps
    for (std::int64_t i = lo; i < lo + len; ++i) {
      const double d = double(v[i]) - base[i];
      EXPECT_NE(back[i], base[i]) << i;  // every value sent (2 bits have no zero level)
      EXPECT_NEAR(residual[i], d - (double(back[i]) - base[i]), 1e-6) << i;
      err += std::pow(d - (double(back[i]) - base[i]), 2);
      const double code = std::clamp(std::nearbyint(d / step + 1.5), 0.0, 3.0);
      amax_err += std::pow(d - (code - 1.5) * step, 2);
    }
    if (len == f.chunk) EXPECT_LT(err, 0.6 * amax_err) << "chunk at " << lo;
    else EXPECT_LE(err, amax_err * (1 + 1e-6)) << "chunk at " << lo;
  }
  // A stray byte is refused like any other wrong length.
  try {
    decode_sparse(f, bytes + "x", base.data(), n, back.data());
    ADD_FAILURE() << "accepted a payload one byte too long";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("bytes, expected"), std::string::npos) << e.what();
  }
}

// Over many rounds, what was sent plus what waits in the buffer is every delta: nothing lost.
TEST(Codec, SparseErrorFeedbackCarriesEveryUnsentValue) {
  for (const SparseFormat f : {SparseFormat{128, 3, 2}, SparseFormat{128, 128, 2}}) {  // top-k; whole chunks
    const std::int64_t n = 1000;
    const Trajectory t = train_and_sync(n, 200, 5e-4f, 11, [&](const float* w, const float* synced, float* residual, float* decoded) {
      std::string bytes;
      encode_sparse(f, w, synced, residual, n, bytes, decoded);
    });
    for (std::int64_t i = 0; i < n; ++i) EXPECT_NEAR(static_cast<double>(t.w[i]) + t.residual[i], t.exact[i], 1e-4) << i;
  }
}

TEST(Parallel, RangesCoverEveryItemOnceAndRethrowTheFirstFailure) {
  for (int threads : {1, 3, 8})
    for (std::int64_t count : {0, 1, 7, 1000}) {
      std::vector<std::atomic<int>> seen(static_cast<std::size_t>(count));
      parallel_ranges(count, 64, threads, [&](std::int64_t lo, std::int64_t hi) {
        EXPECT_LE(hi - lo, 64);
        for (std::int64_t i = lo; i < hi; ++i) ++seen[i];
      });
      for (std::int64_t i = 0; i < count; ++i) EXPECT_EQ(seen[i].load(), 1) << threads << " threads, item " << i;
    }
  EXPECT_THROW(parallel_ranges(1000, 10, 4,
                               [](std::int64_t lo, std::int64_t) {
                                 if (lo == 500) raise(ErrorKind::Peer, "range at 500");
                               }),
               Error);
}

// crc32 in blocks on several threads, joined with crc32_combine, against a plain table-driven
// CRC-32 (the zlib polynomial) over a buffer that spans several blocks and ends mid-block.
TEST(Codec, Crc32IsTheSameAtAnyThreadCount) {
  std::uint32_t table[256];
  for (std::uint32_t i = 0; i < 256; ++i) {
    std::uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = c & 1 ? 0xEDB88320u ^ (c >> 1) : c >> 1;
    table[i] = c;
  }
  auto reference = [&](const unsigned char* p, std::size_t n) {
    std::uint32_t c = 0xFFFFFFFFu;
    for (std::size_t i = 0; i < n; ++i) c = table[(c ^ p[i]) & 0xFF] ^ (c >> 8);
    return c ^ 0xFFFFFFFFu;
  };
  EXPECT_EQ(crc32_of("123456789", 9), 0xCBF43926u);  // the standard check value
  std::vector<unsigned char> bytes((std::size_t{40} << 20) + 123);
  std::mt19937 gen(9);
  for (auto& b : bytes) b = static_cast<unsigned char>(gen());
  const std::uint32_t want = reference(bytes.data(), bytes.size());
  for (int threads : {1, 3, 8}) EXPECT_EQ(crc32_of(bytes.data(), bytes.size(), threads), want) << threads << " threads";
  EXPECT_EQ(crc32_of(bytes.data(), 0, 4), 0u);
}

// Threads share an encoding by chunks and blocks: the bytes, what receivers see and what stays in
// the error-feedback buffer must not depend on how many there were.
TEST(Codec, EncodingsAreTheSameAtAnyThreadCount) {
  const std::int64_t n = 3 * (1 << 18) + 777;  // several tasks and a short last chunk and block
  const auto base = randn(static_cast<std::size_t>(n), 3), values = randn(static_cast<std::size_t>(n), 4);
  const auto start_residual = randn(static_cast<std::size_t>(n), 5, 0.1f);
  struct Result {
    std::string bytes;
    std::vector<float> decoded, residual;
  };
  auto encode = [&](const std::function<void(float*, std::string&, float*)>& run) {
    Result r{{}, std::vector<float>(static_cast<std::size_t>(n)), start_residual};
    run(r.residual.data(), r.bytes, r.decoded.data());
    return r;
  };
  auto same = [](const Result& a, const Result& b, const char* what) {
    EXPECT_EQ(a.bytes, b.bytes) << what;
    EXPECT_EQ(0, std::memcmp(a.decoded.data(), b.decoded.data(), a.decoded.size() * 4)) << what;
    EXPECT_EQ(0, std::memcmp(a.residual.data(), b.residual.data(), a.residual.size() * 4)) << what;
  };
  for (const WireEncoding e : {WireEncoding::Bf16, WireEncoding::Int8Delta}) {
    auto with = [&](int threads) {
      return encode([&](float* residual, std::string& bytes, float* decoded) {
        encode_values(e, values.data(), base.data(), residual, n, 1000, bytes, decoded, threads);
      });
    };
    const Result one = with(1);
    ASSERT_EQ(one.bytes.size(), encoded_size(e, n, 1000));
    for (int threads : {2, 5}) same(one, with(threads), wire_encoding_name(e));
  }
  for (const SparseFormat f : {SparseFormat{4096, 82, 2}, SparseFormat{4096, 4096, 2}, SparseFormat{512, 40, 4}}) {
    auto with = [&](int threads) {
      return encode([&](float* residual, std::string& bytes, float* decoded) {
        encode_sparse(f, values.data(), base.data(), residual, n, bytes, decoded, threads);
      });
    };
    const Result one = with(1);
    std::vector<float> back(static_cast<std::size_t>(n));
    decode_sparse(f, one.bytes, base.data(), n, back.data());
    EXPECT_EQ(0, std::memcmp(back.data(), one.decoded.data(), back.size() * 4));
    for (int threads : {2, 5}) same(one, with(threads), "sparse");
  }
}

TEST(Codec, MalformedSparsePayloadsAreRefused) {
  const SparseFormat f{256, 4, 4};
  const std::int64_t n = 512;
  auto base = randn(n, 13);
  auto v = randn(n, 14);
  std::string good;
  std::vector<float> decoded(n), out(n);
  encode_sparse(f, v.data(), base.data(), nullptr, n, good, decoded.data());
  auto refused = [&](std::string bytes, const SparseFormat& g, const char* why) {
    try {
      decode_sparse(g, bytes, base.data(), n, out.data());
      ADD_FAILURE() << "accepted: " << why;
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::Peer) << why;
    }
  };
  refused(good.substr(1), f, "a byte short");
  refused(good + "x", f, "a byte long");
  refused(good, SparseFormat{256, 300, 4}, "k above the chunk");
  refused(good, SparseFormat{256, 4, 3}, "3 bits");
  auto with_scale = [&](float s) {
    std::string b = good;
    std::memcpy(b.data(), &s, 4);
    return b;
  };
  refused(with_scale(NAN), f, "NaN scale");
  refused(with_scale(INFINITY), f, "infinite scale");
  refused(with_scale(-1.0f), f, "negative scale");
  // Positions: 8 bits each after the scale; make the second equal the first, then smaller.
  std::string repeated = good;
  repeated[5] = repeated[4];
  refused(repeated, f, "a repeated position");
  std::string falling = good;
  falling[4] = static_cast<char>(200);
  falling[5] = static_cast<char>(100);
  refused(falling, f, "positions out of order");
  // A short last chunk of 100 values: a position of 150 is past its end.
  const std::int64_t m = 356;
  std::string tail;
  std::vector<float> d2(m);
  encode_sparse(f, v.data(), base.data(), nullptr, m, tail, d2.data());
  const std::size_t last = f.chunk_bytes(256) + 4;
  tail[last + f.k_of(100) - 1] = static_cast<char>(150);
  try {
    decode_sparse(f, tail, base.data(), m, out.data());
    ADD_FAILURE() << "accepted a position past the short chunk";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("below 100"), std::string::npos) << e.what();
  }
  decode_sparse(f, good, base.data(), n, out.data());  // the untouched payload still decodes
  EXPECT_EQ(out, decoded);
}

// ---- stream validation: every check a received tensor must pass ----
using sync_detail::build_stream;
using sync_detail::StreamHeader;
using sync_detail::StreamReceiver;

struct StreamCase {
  test::FakeModel model{1, 2, 8, 16, 10, 7};
  std::vector<ParamRange> ranges = model.params.expert_ranges(1);
  StreamHeader header;
  std::vector<float> values, decoded;
  StreamCase() {
    header.run_id = "r";
    header.round = 3;
    header.sender = 1;
    header.part = spes::v1::EXPERTS;
    values = sync_detail::gather(model.params, ranges, [&](std::size_t i) -> const float* { return model.params[i].data; });
    for (auto& v : values) v *= 1.01f;
    decoded.resize(values.size());
  }
  sync_detail::StreamPtr stream(std::int64_t chunk_bytes = 4096) {
    return build_stream(header, model.params, ranges, WireEncoding::Fp32, values.data(), nullptr, nullptr, chunk_bytes,
                        decoded.data());
  }
  StreamReceiver receiver(double max_rel = 1.0) {
    auto current = sync_detail::gather(model.params, ranges, [&](std::size_t i) -> const float* { return model.params[i].data; });
    return StreamReceiver(header, model.params, ranges, WireEncoding::Fp32, {}, current, max_rel);
  }
  // Feeds the chunks (after `mutate`) and returns the error message, or "" when accepted.
  std::string feed(std::vector<spes::v1::TensorChunk> chunks, double max_rel = 1.0) {
    auto rx = receiver(max_rel);
    try {
      for (const auto& c : chunks) rx.add(c);
      rx.finish();
    } catch (const Error& e) {
      return e.what();
    }
    EXPECT_EQ(rx.values(), values);
    return "";
  }
};

TEST(StreamValidation, AcceptsAWellFormedChunkedStream) {
  StreamCase c;
  auto s = c.stream(256);  // 64 floats per chunk: every 128-value tensor in two pieces
  EXPECT_GT(s->chunks.size(), 3u);
  EXPECT_EQ(c.feed(s->chunks), "");
}

TEST(StreamValidation, RejectsEveryKindOfBadPayload) {
  StreamCase c;
  const auto good = c.stream(256)->chunks;
  auto expect_reject = [&](const std::string& what, auto mutate, const std::string& needle, double max_rel = 1.0) {
    auto chunks = good;
    mutate(chunks);
    const std::string err = c.feed(chunks, max_rel);
    EXPECT_NE(err.find(needle), std::string::npos) << what << ": got '" << err << "'";
  };
  expect_reject("flipped byte", [](auto& ch) { (*ch[1].mutable_piece()->mutable_data())[5] ^= 1; }, "checksum");
  expect_reject("unknown name", [](auto& ch) { ch[0].mutable_piece()->set_name("layers.0.evil"); }, "expected");
  expect_reject("wrong shape", [](auto& ch) { ch[0].mutable_piece()->set_shape(0, 99); }, "shape");
  expect_reject("wrong dtype", [](auto& ch) { ch[0].mutable_piece()->set_dtype(spes::v1::DTYPE_UNSPECIFIED); }, "dtype");
  expect_reject("unknown encoding", [](auto& ch) { ch[0].mutable_piece()->set_encoding(spes::v1::Encoding(42)); }, "encoding");
  expect_reject("truncated", [](auto& ch) { ch.pop_back(); }, "stream ended");
  expect_reject("wrong round", [](auto& ch) { ch[0].set_round(4); }, "round");
  expect_reject("wrong run", [](auto& ch) { ch[0].set_run_id("other"); }, "run");
  expect_reject("reordered", [](auto& ch) { std::swap(ch[0], ch[1]); }, "expected");
  expect_reject("NaN", [](auto& ch) {
    auto* p = ch[0].mutable_piece();
    float nan = NAN;
    std::memcpy(p->mutable_data()->data(), &nan, 4);
    p->set_crc32(crc32_of(p->data().data(), p->data().size()));
  }, "non-finite");
  expect_reject("huge values", [](auto& ch) {
    auto* p = ch[0].mutable_piece();
    float big = 1e6f;
    std::memcpy(p->mutable_data()->data(), &big, 4);
    p->set_crc32(crc32_of(p->data().data(), p->data().size()));
  }, "max_rel_change");
  // The 1% change of every value passes the default bound but not a 0.1% bound.
  expect_reject("norm bound", [](auto&) {}, "max_rel_change", 0.001);
}

TEST(StreamValidation, Int8DeltaAgainstAnotherBaselineIsRejected) {
  StreamCase c;
  auto baseline = sync_detail::gather(c.model.params, c.ranges, [&](std::size_t i) -> const float* { return c.model.params[i].data; });
  auto s = build_stream(c.header, c.model.params, c.ranges, WireEncoding::Int8Delta, c.values.data(), baseline.data(),
                        nullptr, 4096, c.decoded.data());
  auto current = baseline;
  auto other = baseline;
  other[3] += 0.5f;  // the receiver missed a round: its synced copy differs
  StreamReceiver ok(c.header, c.model.params, c.ranges, WireEncoding::Int8Delta, baseline, current, 1.0);
  for (const auto& ch : s->chunks) ok.add(ch);
  ok.finish();
  EXPECT_EQ(ok.values(), c.decoded);
  StreamReceiver bad(c.header, c.model.params, c.ranges, WireEncoding::Int8Delta, other, current, 1.0);
  EXPECT_THROW(bad.add(s->chunks[0]), Error);
}

// A small model's whole shared part as node 1's SHARED_RAW stream of round 3; its current values
// are the baseline the tests' deltas are against.
struct SharedPartCase {
  test::FakeModel m{1, 2, 16, 16, 40, 7};  // embed/lm_head 640, q 256, router 32, norm 16 values
  std::vector<ParamRange> ranges = m.params.shared_slice(0, 1);
  StreamHeader h = [] {
    StreamHeader header;
    header.run_id = "r";
    header.round = 3;
    header.sender = 1;
    header.part = spes::v1::SHARED_RAW;
    return header;
  }();
  std::vector<float> baseline =
      sync_detail::gather(m.params, ranges, [this](std::size_t i) -> const float* { return m.params[i].data; });
};

// sync.sparse.dense_below: in a sparse part, a tensor of fewer values (norms, the router) goes whole
// as int8 deltas; every other tensor sparse. Both sides derive it from the tensor's size.
TEST(StreamValidation, SparsePartSendsSmallTensorsAsInt8Deltas) {
  const SharedPartCase shared;
  const auto& [m, ranges, h, baseline] = shared;
  std::vector<float> values = baseline, decoded(values.size());
  std::mt19937 gen(3);
  std::normal_distribution<float> delta(0.0f, 0.01f);
  for (auto& v : values) v += delta(gen);
  const SparseFormat f{64, 2, 2, 100};
  auto s = build_stream(h, m.params, ranges, WireEncoding::Sparse, values.data(), baseline.data(), nullptr, 4096,
                        decoded.data(), f);
  std::map<std::string, spes::v1::Encoding> encodings;
  for (const auto& c : s->chunks) encodings[c.piece().name()] = c.piece().encoding();
  EXPECT_EQ(encodings.at("layers.0.input_layernorm.weight"), spes::v1::INT8_DELTA);
  EXPECT_EQ(encodings.at("layers.0.mlp.gate.weight"), spes::v1::INT8_DELTA);
  EXPECT_EQ(encodings.at("layers.0.self_attn.q_proj.weight"), spes::v1::SPARSE_DELTA);
  EXPECT_EQ(encodings.at("embed_tokens.weight"), spes::v1::SPARSE_DELTA);
  // Every value of a small tensor arrives (within half an int8 step of its row); of a large one,
  // 2 per chunk of 64.
  std::int64_t pos = 0;
  for (const auto& r : ranges) {
    const ParamRef& p = m.params[r.param];
    if (p.numel < 100) {
      for (std::int64_t row = pos; row < pos + r.count; row += p.row()) {
        float amax = 0;
        for (std::int64_t i = row; i < row + p.row(); ++i) amax = std::max(amax, std::fabs(values[i] - baseline[i]));
        for (std::int64_t i = row; i < row + p.row(); ++i) EXPECT_LE(std::fabs(decoded[i] - values[i]), amax / 254 + 1e-6f) << p.name;
      }
    } else {
      std::int64_t changed = 0;
      for (std::int64_t i = pos; i < pos + r.count; ++i) changed += decoded[i] != baseline[i];
      EXPECT_EQ(changed, r.count / 64 * 2) << p.name;
    }
    pos += r.count;
  }
  StreamReceiver rx(h, m.params, ranges, WireEncoding::Sparse, baseline, baseline, 1.0, f);
  for (const auto& c : s->chunks) rx.add(c);
  rx.finish();
  EXPECT_EQ(rx.values(), decoded);
  // A receiver that expects every tensor sparse refuses the int8 piece, naming the mismatch.
  SparseFormat all_sparse = f;
  all_sparse.dense_below = 0;
  StreamReceiver other(h, m.params, ranges, WireEncoding::Sparse, baseline, baseline, 1.0, all_sparse);
  try {
    for (const auto& c : s->chunks) other.add(c);
    ADD_FAILURE() << "an int8 piece was accepted where sparse was expected";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'layers.0.input_layernorm.weight' uses encoding"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("expected sparse (configs differ?)"), std::string::npos) << e.what();
  }
}

// sync.compression: a piece whose bytes shrink goes as one zstd frame, and the receiver gets the
// very values the uncompressed stream gives, for every encoding; bytes that do not shrink go as
// they are.
TEST(StreamCompression, PiecesThatShrinkGoAsZstdAndDecodeToTheSameValues) {
  const SharedPartCase shared;
  const auto& [m, ranges, h, baseline] = shared;
  // Every row of 16 moves alike, as the rows of an embedding do: structure a compressor finds.
  std::vector<float> values = baseline;
  for (std::size_t i = 0; i < values.size(); ++i) values[i] += 0.01f * static_cast<float>(static_cast<int>(i / 16 % 3) - 1);
  const SparseFormat whole{64, 64, 2, 0};  // every value at 2 bits (sync.sparse.shared_density 1)
  const SparseFormat top{64, 8, 4, 0};
  struct Case {
    const char* name;
    WireEncoding encoding;
    SparseFormat sparse;
  };
  for (const Case& k : {Case{"fp32", WireEncoding::Fp32, {}}, Case{"int8_delta", WireEncoding::Int8Delta, {}},
                        Case{"sparse whole", WireEncoding::Sparse, whole}, Case{"sparse top-k", WireEncoding::Sparse, top}}) {
    SCOPED_TRACE(k.name);
    std::vector<float> plain_decoded(values.size()), packed_decoded(values.size());
    auto plain = build_stream(h, m.params, ranges, k.encoding, values.data(), baseline.data(), nullptr, 512,
                              plain_decoded.data(), k.sparse, 1, 0);
    auto packed = build_stream(h, m.params, ranges, k.encoding, values.data(), baseline.data(), nullptr, 512,
                               packed_decoded.data(), k.sparse, 2, 1);
    EXPECT_EQ(packed_decoded, plain_decoded);
    ASSERT_EQ(packed->chunks.size(), plain->chunks.size());
    int zstd = 0;
    for (std::size_t i = 0; i < plain->chunks.size(); ++i) {
      const auto& a = plain->chunks[i].piece();
      const auto& b = packed->chunks[i].piece();
      EXPECT_EQ(a.compression(), spes::v1::COMPRESSION_NONE);
      if (b.compression() == spes::v1::ZSTD) {
        ++zstd;
        EXPECT_LT(b.data().size(), a.data().size() - a.data().size() / 32);
      } else {
        EXPECT_EQ(b.data(), a.data());
      }
    }
    EXPECT_GT(zstd, 0);
    EXPECT_LT(packed->bytes, plain->bytes);
    auto receive = [&](const sync_detail::Stream& s) {
      StreamReceiver rx(h, m.params, ranges, k.encoding, baseline, baseline, 10.0, k.sparse);
      for (const auto& c : s.chunks) rx.add(c);
      rx.finish();
      return rx.values();
    };
    const auto got = receive(*packed);
    EXPECT_EQ(got, receive(*plain));
    EXPECT_EQ(got, plain_decoded);
  }
  // Random bytes do not shrink: left as they are.
  std::mt19937 gen(5);
  std::string noise(4096, '\0');
  for (auto& ch : noise) ch = static_cast<char>(gen());
  std::string copy = noise;
  EXPECT_FALSE(sync_detail::compress_payload(copy, 3));
  EXPECT_EQ(copy, noise);
  // A frame holds exactly the bytes it says; any other expectation is refused by name.
  std::string zeros(4096, '\0');
  ASSERT_TRUE(sync_detail::compress_payload(zeros, 1));
  EXPECT_EQ(sync_detail::decompress_payload(zeros, 4096, "t"), std::string(4096, '\0'));
  try {
    sync_detail::decompress_payload(zeros, 4000, "layers.0.q");
    ADD_FAILURE() << "a frame of 4096 bytes was taken for 4000";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'layers.0.q' holds a zstd frame of 4096 bytes, expected 4000"), std::string::npos)
        << e.what();
  }
  EXPECT_THROW(sync_detail::decompress_payload(noise, 4096, "t"), Error);
  std::string cut = zeros.substr(0, zeros.size() - 3);  // the frame's end missing
  EXPECT_THROW(sync_detail::decompress_payload(cut, 4096, "t"), Error);
}

// ---- merge warm-up ----
// sync.fragments: every tensor in exactly one fragment, each fragment with shared tensors, the
// shared ones contiguous and of similar size, experts by layer; one fragment is the whole model.
TEST(ParamSet, FragmentsCoverEveryTensorOnce) {
  test::FakeModel m(4, 4, 16, 32, 40, 1);
  const ParamSet& P = m.params;
  ASSERT_EQ(P.fragments(1).size(), 1u);
  EXPECT_EQ(P.fragments(1)[0].size(), P.size());
  for (int count : {2, 3, 4}) {
    const auto frags = P.fragments(count);
    ASSERT_EQ(frags.size(), static_cast<std::size_t>(count));
    std::vector<int> seen(P.size(), 0);
    std::int64_t last_shared = -1;
    for (int f = 0; f < count; ++f) {
      std::int64_t shared = 0;
      for (std::size_t i : frags[f]) {
        ++seen[i];
        if (P[i].is_expert()) {
          EXPECT_EQ(P[i].layer * count / P.n_layers(), f) << P[i].name;
        } else {
          EXPECT_GT(static_cast<std::int64_t>(i), last_shared) << "shared tensors out of order";
          last_shared = static_cast<std::int64_t>(i);
          shared += P[i].numel;
        }
      }
      EXPECT_GT(shared, 0) << count << " fragments: fragment " << f << " has no shared tensor";
      // Whole tensors cannot be cut evenly; no fragment gets more than twice its share plus
      // the largest tensor.
      EXPECT_LE(shared, 2 * P.shared_numel() / count + 40 * 16) << count << " fragments";
      // The slices of a fragment's shared tensors are contiguous and cover them exactly.
      std::vector<std::size_t> shared_tensors;
      for (std::size_t i : frags[f])
        if (!P[i].is_expert()) shared_tensors.push_back(i);
      std::int64_t sliced = 0;
      for (int k = 0; k < 3; ++k)
        for (const auto& r : P.shared_slice(k, 3, shared_tensors)) sliced += r.count;
      EXPECT_EQ(sliced, shared);
    }
    for (std::size_t i = 0; i < P.size(); ++i) EXPECT_EQ(seen[i], 1) << P[i].name;
  }
  // More fragments than shared tensors is an error, not an empty fragment.
  test::FakeModel one_layer(1, 2, 8, 8, 10, 1);  // 5 shared tensors
  EXPECT_THROW(one_layer.params.fragments(6), Error);
}

// A fragment's round merges its layers for the merge step since that fragment's last round.
TEST(Merge, StepInWindow) {
  MergeConfig m;
  m.alpha = 0.05;
  m.every = 20;
  m.horizon = 100;
  EXPECT_EQ(merge_step_in(m, 0, 20), 20);
  EXPECT_EQ(merge_step_in(m, 5, 25), 20);
  EXPECT_EQ(merge_step_in(m, 20, 39), 0);
  EXPECT_EQ(merge_step_in(m, 95, 115), 0);  // alpha is 0 from the horizon on
}

TEST(Merge, AlphaScheduleAndDueSteps) {
  MergeConfig m;
  m.alpha = 0.05;
  m.horizon = 20000;
  m.every = 500;
  EXPECT_DOUBLE_EQ(merge_alpha(m, 0), 0.05);
  EXPECT_DOUBLE_EQ(merge_alpha(m, 10000), 0.025);
  EXPECT_DOUBLE_EQ(merge_alpha(m, 30000), 0.0);
  EXPECT_TRUE(merge_due(m, 500));
  EXPECT_FALSE(merge_due(m, 600));
  EXPECT_FALSE(merge_due(m, 20000));  // alpha reached 0
}

// Direct computation of SPES.md's formula on the fake model, in long double, from a copy.
TEST(Merge, MatchesDirectComputationAndAlphaZeroIsIdentity) {
  test::FakeModel model(2, 6, 8, 12, 10, 11, 0.5f);
  const auto before = model.values();
  const int K = 4;
  const double alpha = 0.3;
  merge_experts(model.params, alpha, K);
  const auto& P = model.params;
  for (int l = 0; l < 2; ++l) {
    std::vector<std::vector<std::size_t>> t(6);
    for (int e = 0; e < 6; ++e) t[e] = P.expert_tensors(l, e);
    auto cosine = [&](int i, int j) {
      long double d = 0, a = 0, b = 0;
      const auto &u = before[t[i][0]], &v = before[t[j][0]];
      for (std::size_t x = 0; x < u.size(); ++x) d += (long double)u[x] * v[x], a += (long double)u[x] * u[x], b += (long double)v[x] * v[x];
      return d / std::sqrt(a * b);
    };
    for (int i = 0; i < 6; ++i) {
      std::vector<std::pair<long double, int>> sims;
      for (int j = 0; j < 6; ++j)
        if (j != i) sims.push_back({-cosine(i, j), j});
      std::sort(sims.begin(), sims.end());
      for (std::size_t k = 0; k < t[i].size(); ++k) {
        const auto& mine = before[t[i][k]];
        for (std::size_t x = 0; x < mine.size(); ++x) {
          long double mean = 0;
          for (int n = 0; n < K; ++n) mean += before[t[sims[n].second][k]][x];
          mean /= K;
          const long double want = (1 - alpha) * mine[x] + alpha * mean;
          ASSERT_NEAR(P[t[i][k]].data[x], (double)want, 1e-6) << l << " " << i << " " << k << " " << x;
        }
      }
    }
  }
  // Shared tensors are untouched.
  EXPECT_EQ(model.storage[0], before[0]);

  test::FakeModel again(2, 6, 8, 12, 10, 11, 0.5f);
  merge_experts(again.params, 0.0, K);
  EXPECT_EQ(again.values(), before);
}

TEST(Merge, NeighboursAreTheMostSimilarWithIndexTieBreak) {
  // Expert 0 and 2 point the same way, 1 is orthogonal, 3 is a copy of 1.
  std::vector<float> e0{1, 0}, e1{0, 1}, e2{2, 0}, e3{0, 1};
  auto nb = most_similar_experts({e0.data(), e1.data(), e2.data(), e3.data()}, 2, 2);
  EXPECT_EQ(nb[0], (std::vector<int>{2, 1}));  // 2 (cos 1), then 1 and 3 tie at 0: lower index
  EXPECT_EQ(nb[1], (std::vector<int>{3, 0}));
  EXPECT_EQ(most_similar_experts({e0.data(), e1.data()}, 2, 4)[0], (std::vector<int>{1}));  // K capped at E-1
}

}  // namespace
}  // namespace spes
