#include "payload.h"

#include <cmath>
#include <cstring>

#include "compression.h"
#include "spes/sync/codec.h"
#include "spes/util/error.h"
#include "spes/util/parallel.h"

namespace spes::sync_detail {
namespace {

spes::v1::Encoding to_wire(WireEncoding e) {
  switch (e) {
    case WireEncoding::Fp32: return spes::v1::FP32;
    case WireEncoding::Bf16: return spes::v1::BF16;
    case WireEncoding::Int8Delta: return spes::v1::INT8_DELTA;
    case WireEncoding::Sparse: return spes::v1::SPARSE_DELTA;
  }
  return spes::v1::ENCODING_UNSPECIFIED;
}

// Elements per piece so that its payload fits in chunk_bytes; int8 pieces hold whole blocks,
// sparse ones whole chunks.
std::int64_t piece_capacity(WireEncoding e, std::int64_t chunk_bytes, std::int64_t block, const SparseFormat& sparse) {
  switch (e) {
    case WireEncoding::Fp32: return chunk_bytes / 4;
    case WireEncoding::Bf16: return chunk_bytes / 2;
    case WireEncoding::Int8Delta: {
      const std::int64_t blocks = std::max<std::int64_t>(1, chunk_bytes / (block + 4));
      return blocks * block;
    }
    case WireEncoding::Sparse: {
      const auto per_chunk = static_cast<std::int64_t>(sparse.chunk_bytes(sparse.chunk));
      return std::max<std::int64_t>(1, chunk_bytes / per_chunk) * sparse.chunk;
    }
  }
  return chunk_bytes;
}

// A chunk carrying the stream's header fields, without a piece yet.
spes::v1::TensorChunk new_chunk(const StreamHeader& header) {
  spes::v1::TensorChunk chunk;
  chunk.set_run_id(header.run_id);
  chunk.set_round(header.round);
  chunk.set_sender(header.sender);
  chunk.set_part(header.part);
  chunk.set_slice(header.slice);
  for (auto c : header.contributors) chunk.add_contributors(c);
  return chunk;
}

}  // namespace

std::int64_t range_numel(const std::vector<ParamRange>& ranges) {
  std::int64_t n = 0;
  for (const auto& r : ranges) n += r.count;
  return n;
}

std::vector<float> gather(const ParamSet& params, const std::vector<ParamRange>& ranges,
                          const std::function<const float*(std::size_t)>& source) {
  std::vector<float> flat(static_cast<std::size_t>(range_numel(ranges)));
  std::int64_t pos = 0;
  for (const auto& r : ranges) {
    std::memcpy(flat.data() + pos, source(r.param) + r.offset, static_cast<std::size_t>(r.count) * 4);
    pos += r.count;
  }
  return flat;
}

void scatter(const std::vector<ParamRange>& ranges, const float* flat, const std::function<float*(std::size_t)>& target) {
  std::int64_t pos = 0;
  for (const auto& r : ranges) {
    std::memcpy(target(r.param) + r.offset, flat + pos, static_cast<std::size_t>(r.count) * 4);
    pos += r.count;
  }
}

void scatter(const ParamSet& params, const std::vector<ParamRange>& ranges, const float* flat) {
  scatter(ranges, flat, [&params](std::size_t i) { return params[i].data; });
}

std::shared_ptr<Stream> build_stream(const StreamHeader& header, const ParamSet& params, const std::vector<ParamRange>& ranges,
                       WireEncoding part_encoding, const float* values, const float* baseline, float* residual,
                       std::int64_t chunk_bytes, float* decoded, const SparseFormat& sparse, int threads,
                       int zstd_level) {
  auto stream = std::make_shared<Stream>();
  std::int64_t pos = 0;
  for (const auto& r : ranges) {
    const ParamRef& p = params[r.param];
    const std::int64_t block = p.row();
    const WireEncoding encoding = sparse.tensor_encoding(part_encoding, p.numel);
    const std::int64_t cap = piece_capacity(encoding, chunk_bytes, block, sparse);
    for (std::int64_t done = 0; done < r.count;) {
      const std::int64_t n = std::min(cap, r.count - done);
      spes::v1::TensorChunk chunk = new_chunk(header);
      chunk.set_index(static_cast<std::uint32_t>(stream->chunks.size()));
      auto* piece = chunk.mutable_piece();
      piece->set_name(p.name);
      piece->set_dtype(spes::v1::F32);
      for (auto d : p.shape) piece->add_shape(d);
      piece->set_encoding(to_wire(encoding));
      piece->set_offset(static_cast<std::uint64_t>(r.offset + done));
      piece->set_count(static_cast<std::uint64_t>(n));
      const float* base = baseline ? baseline + pos : nullptr;
      std::string data;
      float* res = residual ? residual + pos : nullptr;
      if (encoding == WireEncoding::Sparse) {
        encode_sparse(sparse, values + pos, base, res, n, data, decoded + pos, threads);
        piece->set_block(static_cast<std::uint32_t>(sparse.chunk));
        piece->set_sparse_k(static_cast<std::uint32_t>(sparse.k));
        piece->set_sparse_bits(static_cast<std::uint32_t>(sparse.bits));
      } else {
        encode_values(encoding, values + pos, base, res, n, block, data, decoded + pos, threads);
        if (encoding == WireEncoding::Int8Delta) piece->set_block(static_cast<std::uint32_t>(block));
      }
      if (is_delta_encoding(encoding)) piece->set_baseline_crc32(crc32_of(base, static_cast<std::size_t>(n) * 4, threads));
      piece->set_data(std::move(data));
      stream->chunks.push_back(std::move(chunk));
      done += n;
      pos += n;
    }
  }
  // Each piece compressed (where that pays) and checksummed as it travels, pieces side by side.
  parallel_ranges(static_cast<std::int64_t>(stream->chunks.size()), 1, threads, [&](std::int64_t lo, std::int64_t hi) {
    for (std::int64_t i = lo; i < hi; ++i) {
      auto* piece = stream->chunks[static_cast<std::size_t>(i)].mutable_piece();
      if (zstd_level > 0 && compress_payload(*piece->mutable_data(), zstd_level)) piece->set_compression(spes::v1::ZSTD);
      piece->set_crc32(crc32_of(piece->data().data(), piece->data().size()));
    }
  });
  if (stream->chunks.empty()) stream->chunks.push_back(new_chunk(header));  // an empty part still says so
  for (auto& c : stream->chunks) c.set_total(static_cast<std::uint32_t>(stream->chunks.size()));
  for (const auto& c : stream->chunks) stream->bytes += c.ByteSizeLong();
  return stream;
}

StreamReceiver::StreamReceiver(StreamHeader expected, const ParamSet& params, std::vector<ParamRange> ranges,
                               WireEncoding encoding, std::vector<float> baseline, std::vector<float> current,
                               double max_rel_change, const SparseFormat& sparse)
    : expected_(std::move(expected)),
      params_(params),
      ranges_(std::move(ranges)),
      encoding_(encoding),
      sparse_(sparse),
      baseline_(std::move(baseline)),
      current_(std::move(current)),
      values_(static_cast<std::size_t>(range_numel(ranges_))),
      max_rel_change_(max_rel_change) {}

void StreamReceiver::add(const spes::v1::TensorChunk& chunk) {
  if (chunk.run_id() != expected_.run_id) raise(ErrorKind::Peer, "chunk of run '{}', expected '{}'", chunk.run_id(), expected_.run_id);
  if (chunk.round() != expected_.round) raise(ErrorKind::Peer, "chunk of round {}, expected {}", chunk.round(), expected_.round);
  if (chunk.sender() != expected_.sender || chunk.part() != expected_.part || chunk.slice() != expected_.slice)
    raise(ErrorKind::Peer, "chunk from node {} part {} slice {} does not answer the request", chunk.sender(),
          static_cast<int>(chunk.part()), chunk.slice());
  if (chunk.index() != next_index_) raise(ErrorKind::Peer, "chunk {} arrived where {} was expected", chunk.index(), next_index_);
  if (next_index_ == 0) {
    total_ = chunk.total();
    contributors_.assign(chunk.contributors().begin(), chunk.contributors().end());
  } else if (chunk.total() != total_) {
    raise(ErrorKind::Peer, "chunk count changed from {} to {} mid-stream", total_, chunk.total());
  }
  ++next_index_;
  if (next_index_ > total_) raise(ErrorKind::Peer, "more chunks than the announced {}", total_);
  if (!chunk.has_piece()) {
    if (!ranges_.empty()) raise(ErrorKind::Peer, "chunk {} carries no tensor", chunk.index());
    return;
  }
  const auto& piece = chunk.piece();
  if (range_ >= ranges_.size()) raise(ErrorKind::Peer, "unexpected extra tensor '{}'", piece.name());
  const ParamRange& r = ranges_[range_];
  const ParamRef& p = params_[r.param];
  if (piece.name() != p.name) raise(ErrorKind::Peer, "tensor '{}' where '{}' was expected", piece.name(), p.name);
  if (!std::equal(piece.shape().begin(), piece.shape().end(), p.shape.begin(), p.shape.end()))
    raise(ErrorKind::Peer, "tensor '{}' has the wrong shape", p.name);
  if (piece.dtype() != spes::v1::F32) raise(ErrorKind::Peer, "tensor '{}' has an unknown dtype", p.name);
  // The configured encoding (int8_delta for a small tensor of a sparse part), or fp32 (what a
  // sender without a synced baseline yet sends).
  const WireEncoding want = sparse_.tensor_encoding(encoding_, p.numel);
  WireEncoding enc;
  if (piece.encoding() == to_wire(want)) enc = want;
  else if (piece.encoding() == spes::v1::FP32) enc = WireEncoding::Fp32;
  else
    raise(ErrorKind::Peer, "tensor '{}' uses encoding {}, expected {} (configs differ?)", p.name,
          static_cast<int>(piece.encoding()), wire_encoding_name(want));
  const auto offset = static_cast<std::int64_t>(piece.offset()), count = static_cast<std::int64_t>(piece.count());
  if (offset != r.offset + range_done_ || count <= 0 || count > r.count - range_done_)
    raise(ErrorKind::Peer, "tensor '{}' piece [{}, +{}) is not the expected next piece", p.name, piece.offset(), piece.count());
  const std::int64_t block = enc == WireEncoding::Int8Delta ? static_cast<std::int64_t>(piece.block()) : 1;
  if (enc == WireEncoding::Int8Delta && block != p.row())
    raise(ErrorKind::Peer, "tensor '{}' has int8 block {}, expected {}", p.name, block, p.row());
  if (enc == WireEncoding::Sparse &&
      (piece.block() != sparse_.chunk || piece.sparse_k() != sparse_.k || piece.sparse_bits() != static_cast<std::uint32_t>(sparse_.bits)))
    raise(ErrorKind::Peer, "tensor '{}' is sparse with chunk {}, k {}, {} bits; expected {}, {}, {} (configs differ?)", p.name,
          piece.block(), piece.sparse_k(), piece.sparse_bits(), sparse_.chunk, sparse_.k, sparse_.bits);
  if (crc32_of(piece.data().data(), piece.data().size()) != piece.crc32())
    raise(ErrorKind::Peer, "tensor '{}' fails its checksum", p.name);
  std::string unpacked;  // the encoding's bytes of a compressed piece
  std::string_view bytes = piece.data();
  if (piece.compression() == spes::v1::ZSTD) {
    const std::size_t expected = enc == WireEncoding::Sparse ? sparse_.size(count) : encoded_size(enc, count, block);
    unpacked = decompress_payload(piece.data(), expected, p.name);
    bytes = unpacked;
  } else if (piece.compression() != spes::v1::COMPRESSION_NONE) {
    raise(ErrorKind::Peer, "tensor '{}' uses an unknown compression {}", p.name, static_cast<int>(piece.compression()));
  }
  const float* base = baseline_.empty() ? nullptr : baseline_.data() + flat_done_;
  if (is_delta_encoding(enc) && crc32_of(base, static_cast<std::size_t>(count) * 4) != piece.baseline_crc32())
    raise(ErrorKind::Peer, "tensor '{}' is a delta against other weights than ours (a round was missed)", p.name);
  float* out = values_.data() + flat_done_;
  if (enc == WireEncoding::Sparse) decode_sparse(sparse_, bytes, base, count, out);
  else decode_values(enc, bytes, base, count, block, out);
  const float* cur = current_.data() + flat_done_;
  for (std::int64_t i = 0; i < count; ++i) {
    if (!std::isfinite(out[i])) raise(ErrorKind::Peer, "tensor '{}' holds a non-finite value", p.name);
    const double d = static_cast<double>(out[i]) - static_cast<double>(cur[i]);
    diff2_ += d * d;
    cur2_ += static_cast<double>(cur[i]) * static_cast<double>(cur[i]);
  }
  range_done_ += count;
  flat_done_ += count;
  if (range_done_ == r.count) {  // tensor (range) complete: the norm-change bound
    const double limit = max_rel_change_ * std::max(std::sqrt(cur2_), 1e-6);
    if (std::sqrt(diff2_) > limit)
      raise(ErrorKind::Peer, "tensor '{}' changes by {:.3g}, more than sync.max_rel_change × its norm ({:.3g})", p.name,
            std::sqrt(diff2_), limit);
    total_diff2_ += diff2_;
    total_cur2_ += cur2_;
    diff2_ = cur2_ = 0;
    ++range_;
    range_done_ = 0;
  }
}

double StreamReceiver::relative_change() const {
  return std::sqrt(total_diff2_) / std::max(std::sqrt(total_cur2_), 1e-12);
}

void StreamReceiver::finish() {
  if (next_index_ != total_ || total_ == 0)
    raise(ErrorKind::Peer, "stream ended after {} of {} chunks", next_index_, total_);
  if (range_ != ranges_.size())
    raise(ErrorKind::Peer, "stream ended with {} of {} tensors", range_, ranges_.size());
}

}  // namespace spes::sync_detail
