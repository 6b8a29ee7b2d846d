// Turning flat ranges of parameters into chunk streams and back, with every check a received
// tensor must pass before it may touch the model. Internal to the sync module.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "round_store.h"
#include "spes/config/config.h"
#include "spes/sync/codec.h"
#include "spes/sync/params.h"

namespace spes::sync_detail {

// Total elements of a list of ranges.
std::int64_t range_numel(const std::vector<ParamRange>& ranges);
// Copies the ranges' values, in order, into one flat buffer; `source(p)` gives parameter p's data.
std::vector<float> gather(const ParamSet& params, const std::vector<ParamRange>& ranges,
                          const std::function<const float*(std::size_t)>& source);
// Writes a flat buffer back over the ranges; `target(p)` gives where parameter p's values go.
void scatter(const std::vector<ParamRange>& ranges, const float* flat, const std::function<float*(std::size_t)>& target);
// The same into the parameters themselves (the model).
void scatter(const ParamSet& params, const std::vector<ParamRange>& ranges, const float* flat);

struct StreamHeader {
  std::string run_id;
  std::uint64_t round = 0;
  std::uint32_t sender = 0;
  spes::v1::Part part = spes::v1::PART_UNSPECIFIED;
  std::uint32_t slice = 0;
  std::vector<std::uint32_t> contributors;
};

// Values per spes.v1.Encoding (byte counts by encoding are arrays of this size).
inline constexpr std::size_t kWireEncodings = 5;

// Encodes `values` (flat over `ranges`) into chunks of at most chunk_bytes of payload.
// baseline: flat last-synced values (delta encodings only); residual: flat error-feedback state,
// or null for none; decoded: receives what receivers will reconstruct; sparse: the layout when
// `encoding` is sparse; threads: how many may share the encoding (the same stream at any count);
// zstd_level: each piece's bytes go as a zstd frame at this level where that makes them smaller
// (0 = never; sync.compression).
std::shared_ptr<Stream> build_stream(const StreamHeader& header, const ParamSet& params, const std::vector<ParamRange>& ranges,
                       WireEncoding encoding, const float* values, const float* baseline, float* residual,
                       std::int64_t chunk_bytes, float* decoded, const SparseFormat& sparse = {}, int threads = 1,
                       int zstd_level = 0);

// Validates and decodes one stream. add() and finish() throw Error(Peer) with the reason.
class StreamReceiver {
 public:
  StreamReceiver(StreamHeader expected, const ParamSet& params, std::vector<ParamRange> ranges,
                 WireEncoding encoding, std::vector<float> baseline, std::vector<float> current,
                 double max_rel_change, const SparseFormat& sparse = {});
  void add(const spes::v1::TensorChunk& chunk);
  void finish();
  std::vector<float>& values() { return values_; }
  const std::vector<std::uint32_t>& contributors() const { return contributors_; }
  // Chunks accepted so far: where a broken-off stream resumes (FetchRequest.first_chunk).
  std::uint32_t chunks_received() const { return next_index_; }
  // |received - current| / |current| over the whole stream (the update it brings), after finish().
  double relative_change() const;


 private:
  StreamHeader expected_;
  const ParamSet& params_;
  std::vector<ParamRange> ranges_;
  WireEncoding encoding_;
  SparseFormat sparse_;
  std::vector<float> baseline_, current_, values_;
  double max_rel_change_;
  std::vector<std::uint32_t> contributors_;
  std::size_t range_ = 0;         // next expected range
  std::int64_t range_done_ = 0;   // elements of it received
  std::int64_t flat_done_ = 0;    // elements received overall
  std::uint32_t next_index_ = 0, total_ = 0;
  double diff2_ = 0, cur2_ = 0;   // per tensor, for the norm-change bound
  double total_diff2_ = 0, total_cur2_ = 0;
};

}  // namespace spes::sync_detail
