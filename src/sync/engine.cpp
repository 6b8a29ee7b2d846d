#include "spes/sync/engine.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstring>
#include <functional>
#include <future>
#include <limits>

#include "payload.h"
#include "round_deadline.h"
#include "spes/sync/merge.h"
#include "spes/train/schedule.h"
#include "spes/util/error.h"
#include "spes/util/failpoint.h"
#include "spes/util/log.h"
#include "spes/util/parallel.h"
#include "spes/util/signals.h"
#include "robust.h"
#include "transport.h"

namespace spes {
using namespace sync_detail;
namespace {

using Clock = std::chrono::steady_clock;

struct Fetched {
  bool ok = false;
  std::string reason;
  std::vector<float> values;
  std::vector<std::uint32_t> contributors;
};

}  // namespace

// What one kind of round moves (the whole model, or one fragment of it): shared slice k,
// averaged by peer k, and the experts each peer owns.
struct RoundParts {
  std::vector<std::vector<ParamRange>> slices;        // shared slice k
  std::vector<std::vector<ParamRange>> peer_experts;  // experts owned by peer j
  std::vector<int> layers;                            // the expert layers it carries (merge warm-up)
  std::vector<std::size_t> tensors;                   // every tensor it reads and writes
};

// Lossy encodings' state for one RoundParts. int8 deltas: the round whose result the baseline
// (`synced`) holds for shared slice k / peer j's experts; 0 = none, or not the same as
// everyone's (a missed round): such parts travel in fp32. Residuals: error feedback, flat over
// the ranges they belong to.
struct Feedback {
  std::vector<UpdateHistory> expert_updates;  // per peer: its accepted expert updates (sync.robust)
  std::vector<std::uint64_t> base_slice, base_experts;
  std::vector<float> residual_experts, residual_average;
  std::vector<std::vector<float>> residual_raw;  // per slice
};

struct SyncEngine::Impl {
  Config config;
  ParamSet params;
  TransportSettings transport;
  SyncMembership membership;
  RoundStore store;
  std::unique_ptr<SyncServer> server;
  int self = 0, n = 1;                                  // self: position in peers; -1 = observer
  bool observer = false;                                // catching up: fetches a round, serves nothing
  std::vector<std::unique_ptr<spes::v1::SyncService::Stub>> stubs;  // per peer; null for self
  int fragments = 1;                                    // sync.fragments
  // [0]: the whole model; [1 + f]: fragment f (only when sync.fragments > 1).
  std::vector<RoundParts> parts;
  std::vector<Feedback> feedback;                       // per entry of parts
  std::size_t last_parts = 0;                           // what the last round moved
  bool keeps_baseline = false;                          // int8_delta somewhere
  std::vector<std::vector<float>> synced;               // per parameter: last synced values
  std::vector<bool> suspect;                            // skipped last round: short retries only
  std::vector<std::uint64_t> skips;
  std::atomic<std::uint64_t> bytes_in{0};
  std::unique_ptr<std::atomic<std::uint64_t>[]> peer_bytes_in;  // per peer, this round
  std::array<std::atomic<std::uint64_t>, kWireEncodings> bytes_in_by_encoding{};  // by spes.v1.Encoding value, all rounds
  std::atomic<std::uint64_t> resumed{0};                // streams resumed mid-way, this round
  mutable double encode_seconds = 0;                    // encode() this round (run_round's thread only)
  int encode_threads = 1;                               // sync.encode_threads, 0 resolved to the cores
  RoundDeadline deadlines;                              // when timeout_s is 0: from measured rounds
  // The run's last round with a sparse encoding: sent in fp32 with the residuals folded in, so
  // the final weights hold every update (sparse residuals are whole updates not sent yet).
  bool dense_round = false;
  double lr_scale = 1;  // the round's mean learning rate over the peak's (sync.robust: updates per unit of it)

  Impl(const Config& c, ParamSet p, SyncMembership m)
      : config(c),
        params(std::move(p)),
        membership(std::move(m)),
        store(membership.first_round),
        deadlines(c.sync.deadline_factor, c.sync.min_round_timeout_s, c.sync.round_timeout_s) {
    transport = transport_settings(config);
    transport.plan = membership.plan;
    encode_threads = threads_or_cores(config.sync.encode_threads);
    for (int id : membership.observers) transport.requesters.push_back(static_cast<std::uint32_t>(id));
    n = static_cast<int>(config.sync.peers.size());
    self = -1;
    for (int j = 0; j < n; ++j)
      if (config.sync.peers[j].id == config.run.node_id) self = j;
    observer = self < 0;
    transport.node_id = self;
    fragments = static_cast<int>(std::max<std::int64_t>(config.sync.fragments, 1));
    std::vector<std::size_t> every_tensor(params.size());
    for (std::size_t i = 0; i < params.size(); ++i) every_tensor[i] = i;
    parts.push_back(make_parts(every_tensor));
    if (fragments > 1) {
      if (static_cast<std::size_t>(fragments) > params.size() - static_cast<std::size_t>(count_experts()))
        raise(ErrorKind::Config, "{}: sync.fragments {} is more than the model's {} shared tensors",
              config.where("sync.fragments"), fragments, params.size() - static_cast<std::size_t>(count_experts()));
      for (auto& tensors : params.fragments(fragments)) parts.push_back(make_parts(tensors));
    }
    keeps_baseline = is_delta_encoding(config.sync.shared_encoding) || is_delta_encoding(config.sync.expert_encoding);
    if (keeps_baseline) snapshot_baseline();
    feedback.resize(parts.size());
    for (auto& fb : feedback) fb.expert_updates.assign(static_cast<std::size_t>(n), UpdateHistory(config.sync.robust));
    suspect.assign(static_cast<std::size_t>(n), false);
    peer_bytes_in = std::make_unique<std::atomic<std::uint64_t>[]>(static_cast<std::size_t>(n));
    skips.assign(static_cast<std::size_t>(n), 0);
    auto credentials = channel_credentials(transport);
    for (int j = 0; j < n; ++j) {
      if (j == self) {
        stubs.emplace_back();
        continue;
      }
      auto channel = grpc::CreateCustomChannel(config.sync.peers[j].address, credentials,
                                               channel_arguments(transport, node_holder_name(config.sync.peers[j].id)));
      stubs.push_back(spes::v1::SyncService::NewStub(channel));
    }
    if (observer) {
      spdlog::info("sync: node {} catching up from {} node(s), run '{}'", config.run.node_id, n, transport.run_id);
      return;
    }
    for (std::size_t p = 0; p < parts.size(); ++p) {
      Feedback& fb = feedback[p];
      const RoundParts& P = parts[p];
      fb.base_slice.assign(static_cast<std::size_t>(n), 0);
      fb.base_experts.assign(static_cast<std::size_t>(n), 0);
      if (config.sync.expert_encoding != WireEncoding::Fp32)
        fb.residual_experts.assign(static_cast<std::size_t>(range_numel(P.peer_experts[self])), 0.0f);
      if (config.sync.shared_encoding != WireEncoding::Fp32) {
        fb.residual_average.assign(static_cast<std::size_t>(range_numel(P.slices[self])), 0.0f);
        for (int k = 0; k < n; ++k) fb.residual_raw.emplace_back(static_cast<std::size_t>(range_numel(P.slices[k])), 0.0f);
      }
    }
    server = std::make_unique<SyncServer>(transport, store);
    const auto& me = config.sync.peers[self];
    server->start(config.sync.listen.empty() ? me.address : config.sync.listen);
    spdlog::info("sync: node {} of {} serving on port {} ({}), run '{}', every {} steps{}, shared {}, experts {}{}",
                 config.run.node_id, n, server->port(), security_name(transport), transport.run_id,
                 config.sync.every,
                 fragments > 1 ? fmt::format(" in {} fragments (a round every {} steps)", fragments, config.sync.period()) : "",
                 wire_encoding_name(config.sync.shared_encoding), wire_encoding_name(config.sync.expert_encoding),
                 config.sync.zstd_level() > 0 ? fmt::format(", zstd {}", config.sync.zstd_level()) : "");
    if (transport.insecure)
      spdlog::warn("sync: sync.insecure is set: weights and the run token travel unencrypted");
  }

  int label(int j) const { return config.sync.peers[j].id; }

  int count_experts() const {
    int c = 0;
    for (const auto& p : params.params()) c += p.is_expert() ? 1 : 0;
    return c;
  }

  // The slices and owners' experts among `tensors` (ParamSet indices, ascending).
  RoundParts make_parts(const std::vector<std::size_t>& tensors) const {
    RoundParts P;
    P.tensors = tensors;
    std::vector<std::size_t> shared;
    for (std::size_t i : tensors) {
      if (!params[i].is_expert()) {
        shared.push_back(i);
      } else if (std::find(P.layers.begin(), P.layers.end(), params[i].layer) == P.layers.end()) {
        P.layers.push_back(params[i].layer);
      }
    }
    std::sort(P.layers.begin(), P.layers.end());
    for (int k = 0; k < n; ++k) P.slices.push_back(params.shared_slice(k, n, shared));
    for (const auto& peer : config.sync.peers) {
      std::vector<ParamRange> ranges;
      for (std::size_t i : tensors)
        if (params[i].is_expert() &&
            std::find(peer.experts.begin(), peer.experts.end(), params[i].expert) != peer.experts.end())
          ranges.push_back({i, 0, params[i].numel});
      P.peer_experts.push_back(std::move(ranges));
    }
    return P;
  }

  std::size_t parts_index(int fragment) const {
    if (fragment == kWholeModel || fragments == 1) return 0;
    SPES_CHECK(fragment >= 0 && fragment < fragments, fmt::format("fragment {} of {}", fragment, fragments));
    return static_cast<std::size_t>(fragment) + 1;
  }

  void snapshot_baseline() {
    synced.resize(params.size());
    for (std::size_t i = 0; i < params.size(); ++i) synced[i].assign(params[i].data, params[i].data + params[i].numel);
  }

  std::vector<float> model_values(const std::vector<ParamRange>& ranges) const {
    return gather(params, ranges, [this](std::size_t i) -> const float* { return params[i].data; });
  }
  std::vector<float> baseline_values(const std::vector<ParamRange>& ranges, WireEncoding e) const {
    if (!is_delta_encoding(e)) return {};
    return gather(params, ranges, [this](std::size_t i) -> const float* { return synced[i].data(); });
  }

  // Each part's share of a chunk: experts sync.sparse.density, shared contributions
  // shared_density, averaged slices up to every position their contributors sent (average_density),
  // at average_bits.
  SparseFormat sparse_format(spes::v1::Part part) const {
    SparseFormat f = SparseFormat::of(config.sync.sparse);
    if (part == spes::v1::SHARED_RAW) f.k = config.sync.sparse.shared_k();
    if (part == spes::v1::SHARED_AVERAGED) {
      f.k = config.sync.sparse.average_k(n);
      f.bits = config.sync.sparse.bits_of_averages();
    }
    return f;
  }

  StreamHeader header(std::uint64_t round, spes::v1::Part part, std::uint32_t slice, int sender) const {
    StreamHeader h;
    h.run_id = transport.run_id;
    h.round = round;
    h.sender = static_cast<std::uint32_t>(sender);
    h.part = part;
    h.slice = slice;
    return h;
  }

  // Encodes values (flat over ranges) into a stream; `decoded` gets what receivers will see.
  // `base_round`: the round whose result the baseline of these ranges holds. Without one (0),
  // int8 deltas go out as fp32; with one, the stream can also build its fp32 twin for callers
  // whose copy is from another round.
  StreamPtr encode(const StreamHeader& h, const std::vector<ParamRange>& ranges, WireEncoding e,
                   const std::vector<float>& values, std::vector<float>* residual, std::vector<float>& decoded,
                   std::uint64_t base_round) const {
    // Without a base round (and, for sparse, in the run's last round) a delta encoding goes out as
    // fp32, which spends the residual: int8's (at most half a step) is dropped; sparse's holds
    // whole updates not sent yet, so they go out with the values instead of being lost.
    const bool sparse = e == WireEncoding::Sparse;
    const std::vector<float>* sent = &values;
    std::vector<float> with_residual;
    if (is_delta_encoding(e) && (base_round == 0 || (sparse && dense_round))) {
      if (sparse && residual && residual->size() == values.size()) {
        with_residual = values;
        for (std::size_t i = 0; i < values.size(); ++i) with_residual[i] += (*residual)[i];
        sent = &with_residual;
      }
      e = WireEncoding::Fp32;
    }
    const auto baseline = baseline_values(ranges, e);
    decoded.assign(values.size(), 0.0f);
    const auto t0 = Clock::now();
    auto stream = build_stream(h, params, ranges, e, sent->data(), baseline.empty() ? nullptr : baseline.data(),
                               residual && !residual->empty() ? residual->data() : nullptr, config.sync.chunk_bytes,
                               decoded.data(), sparse_format(h.part), encode_threads, config.sync.zstd_level());
    encode_seconds += std::chrono::duration<double>(Clock::now() - t0).count();
    if (is_delta_encoding(e)) {
      stream->base_round = base_round;
      stream->make_full = [this, h, ranges, values = decoded]() -> StreamPtr {
        std::vector<float> same(values.size());
        return build_stream(h, params, ranges, WireEncoding::Fp32, values.data(), nullptr, nullptr,
                            config.sync.chunk_bytes, same.data(), {}, encode_threads, config.sync.zstd_level());
      };
    }
    return stream;
  }

  // What a node under SPES_POISON publishes (the values unchanged otherwise).
  std::vector<float> poisoned(std::vector<float> values, std::string_view part, std::uint64_t round) const {
    if (const double f = poison_factor(part, config.run.node_id, round); f != 1.0)
      for (auto& v : values) v = static_cast<float>(v * f);
    return values;
  }

  // Our baseline round for a part we fetch: slice k's, or peer j's experts.
  std::uint64_t base_of(const Feedback& fb, spes::v1::Part part, int peer, std::uint32_t slice) const {
    if (!keeps_baseline) return 0;
    return part == spes::v1::EXPERTS ? fb.base_experts[peer] : fb.base_slice[slice];
  }

  Fetched fetch(Feedback& fb, int peer, std::uint64_t round, spes::v1::Part part, std::uint32_t slice,
                const std::vector<ParamRange>& ranges, WireEncoding e, Clock::time_point deadline) {
    Fetched out;
    // Transient refusals (a node still starting up, or a round behind) are retried for up to
    // sync.peer_wait_s; for a peer skipped last round (likely dead) for at most a second, so a
    // dead peer costs little while one that is merely late still gets back in.
    const double wait_s = suspect[peer] ? std::min(1.0, config.sync.peer_wait_s) : config.sync.peer_wait_s;
    auto retry_window_end = [&] {
      return observer ? deadline
                      : std::min(deadline, Clock::now() + std::chrono::milliseconds(static_cast<std::int64_t>(wait_s * 1000)));
    };
    auto give_up = retry_window_end();
    // An observer's copy is stale by design, so the norm-change bound does not apply to it (the
    // other checks do). Its round is a plan's first, which is sent in fp32: no baseline needed.
    const double max_rel_change = observer ? std::numeric_limits<double>::infinity() : config.sync.max_rel_change;
    double backoff = config.sync.retry_backoff_s;
    // One receiver across retries: a stream that broke off resumes at the chunk it reached.
    StreamReceiver receiver(header(round, part, slice, peer), params, ranges, e, baseline_values(ranges, e),
                            model_values(ranges), max_rel_change, sparse_format(part));
    while (true) {
      grpc::ClientContext context;
      context.set_deadline(std::chrono::system_clock::now() +
                           std::chrono::duration_cast<std::chrono::system_clock::duration>(deadline - Clock::now()));
      context.AddMetadata(kTokenHeader, transport.token);
      spes::v1::FetchRequest request;
      request.set_run_id(transport.run_id);
      request.set_round(round);
      request.set_part(part);
      request.set_slice(slice);
      request.set_requester(static_cast<std::uint32_t>(config.run.node_id));
      request.set_plan(transport.plan);
      request.set_baseline_round(base_of(fb, part, peer, slice));
      const auto attempt_start = Clock::now();
      const std::uint32_t resume_at = receiver.chunks_received();
      request.set_first_chunk(resume_at);
      if (resume_at > 0) {
        resumed++;
        spdlog::info("sync: round {}: resuming the stream from node {} at chunk {}", round,
                     config.sync.peers[peer].id, resume_at);
      }
      auto reader = stubs[peer]->Fetch(&context, request);
      spes::v1::TensorChunk chunk;
      std::string invalid;
      auto count_in = [&] {
        bytes_in += chunk.ByteSizeLong();
        peer_bytes_in[peer] += chunk.ByteSizeLong();
        if (const auto enc = static_cast<std::size_t>(chunk.piece().encoding()); enc < bytes_in_by_encoding.size())
          bytes_in_by_encoding[enc] += chunk.ByteSizeLong();
      };
      while (reader->Read(&chunk)) {
        count_in();
        try {
          receiver.add(chunk);
          if (receiver.chunks_received() == 1) failpoint("pull");
        } catch (const Error& err) {
          invalid = err.what();
          break;
        }
      }
      if (!invalid.empty()) {
        // The rest is read and dropped, so that the sender sees its stream served and does not
        // wait for this node at its end (SyncEngine::finish); one longer than the payload could be
        // is cut off.
        const std::size_t limit = 2 * sizeof(float) * receiver.values().size() + (std::size_t{1} << 20);
        std::size_t drained = 0;
        while (drained <= limit && reader->Read(&chunk)) {
          count_in();
          drained += chunk.ByteSizeLong();
        }
        if (drained > limit) context.TryCancel();
      }
      grpc::Status status = reader->Finish();
      if (!invalid.empty()) {
        out.reason = "rejected payload: " + invalid;
        return out;
      }
      if (status.ok()) {
        try {
          receiver.finish();
        } catch (const Error& err) {
          out.reason = std::string("rejected payload: ") + err.what();
          return out;
        }
        if (part == spes::v1::EXPERTS && !observer) {
          // The owner's update against its own history — except in a sparse run's last round,
          // which also carries every update error feedback held back.
          const double change = receiver.relative_change() / lr_scale;
          UpdateHistory& history = fb.expert_updates[peer];
          if (!dense_round) {
            spdlog::debug("sync: round {}: node {}'s experts change by {:.4g} of their norm at a learning rate {:.3g} x "
                          "the peak: {:.4g} per unit (median {:.4g} of {})", round, peer, change * lr_scale, lr_scale,
                          change, history.median(), history.size());
            if (const auto why = history.check(change); !why.empty()) {
              out.reason = "rejected payload: " + why;
              return out;
            }
            history.record(change);
          }
        }
        out.ok = true;
        out.values = std::move(receiver.values());
        out.contributors = receiver.contributors();
        return out;
      }
      // Transient: a peer not listening (yet) or restarting its service for a new plan (calls
      // caught in a server's shutdown come back CANCELLED), or one that has not reached this
      // round yet (OUT_OF_RANGE: it is more than a round behind, e.g. it missed the last one).
      const auto code = status.error_code();
      const bool transient = code == grpc::StatusCode::UNAVAILABLE || code == grpc::StatusCode::CANCELLED ||
                             code == grpc::StatusCode::OUT_OF_RANGE;
      if (receiver.chunks_received() > resume_at || Clock::now() - attempt_start > std::chrono::seconds(1)) {
        // The call was live (it moved data, or the peer held it open) until the link broke — a
        // keepalive timeout in an outage: a fresh retry window (still within the round's
        // deadline) and a fresh back-off, since the peer itself was alive.
        give_up = retry_window_end();
        backoff = config.sync.retry_backoff_s;
      }
      const auto retry_at = Clock::now() + std::chrono::milliseconds(static_cast<std::int64_t>(backoff * 1000));
      if (!transient || retry_at >= give_up || stop_requested()) {
        out.reason = fmt::format("{} ({})", printable(status.error_message()), static_cast<int>(status.error_code()));
        return out;
      }
      std::this_thread::sleep_until(retry_at);
      backoff = std::min(backoff * 2, 2.0);
    }
  }

  struct Gathered {
    std::vector<Fetched> averaged, experts;  // per peer; not ok where not fetched
  };
  // Step 3 of a round: the averaged slice of every peer `wanted` picks from that aggregator and
  // its experts (if it owns any), all fetched in parallel.
  Gathered gather_round(const RoundParts& P, Feedback& fb, std::uint64_t round, Clock::time_point deadline,
                        const std::function<bool(int)>& wanted) {
    const WireEncoding se = config.sync.shared_encoding, ee = config.sync.expert_encoding;
    std::vector<std::future<Fetched>> avg_calls(static_cast<std::size_t>(n)), expert_calls(static_cast<std::size_t>(n));
    for (int j = 0; j < n; ++j) {
      if (!wanted(j)) continue;
      avg_calls[j] = std::async(std::launch::async, [&, j] {
        return fetch(fb, j, round, spes::v1::SHARED_AVERAGED, static_cast<std::uint32_t>(j), P.slices[j], se, deadline);
      });
      if (!P.peer_experts[j].empty())
        expert_calls[j] = std::async(std::launch::async, [&, j] {
          return fetch(fb, j, round, spes::v1::EXPERTS, 0, P.peer_experts[j], ee, deadline);
        });
    }
    Gathered out{std::vector<Fetched>(static_cast<std::size_t>(n)), std::vector<Fetched>(static_cast<std::size_t>(n))};
    for (int j = 0; j < n; ++j) {
      if (avg_calls[j].valid()) out.averaged[j] = avg_calls[j].get();
      if (expert_calls[j].valid()) out.experts[j] = expert_calls[j].get();
    }
    return out;
  }

  // Step 4's end: the merge warm-up, when one is due. A whole-model round merges every layer
  // when due at its own step; a fragment's round merges its layers for the merge step that fell
  // since the fragment's previous round (sync.every steps ago), with that step's alpha.
  void merge_if_due(SyncRoundReport& report, std::int64_t step, std::size_t which) {
    const std::int64_t at = which == 0 ? (merge_due(config.merge, step) ? step : 0)
                                       : merge_step_in(config.merge, step - config.sync.every, step);
    if (at == 0) return;
    report.merged = true;
    report.merge_alpha = merge_alpha(config.merge, at);
    merge_experts(params, report.merge_alpha, config.merge.top_k, which == 0 ? std::vector<int>{} : parts[which].layers);
  }

  // The mean learning rate, over the peak's, of the steps since the last round: an owner's honest
  // update grows and shrinks with it (warm-up, decay), so the robust bound compares updates per
  // unit of it, and a warm-up does not look like a drift.
  double round_lr_scale(std::int64_t step) const {
    const std::int64_t from = std::max<std::int64_t>(0, step - config.sync.every);
    double sum = 0;
    for (std::int64_t s = from; s < step; ++s) sum += learning_rate(1.0, config.schedule, config.train.steps, s);
    return step > from && sum > 0 ? sum / static_cast<double>(step - from) : 1.0;
  }

  // The observer's round: every averaged slice from its aggregator and every expert from its
  // owner, then the merge warm-up if due — the same result the members end the round with.
  SyncRoundReport observe_round(std::uint64_t round, std::int64_t step) {
    const auto t0 = Clock::now();
    const auto deadline = t0 + std::chrono::milliseconds(static_cast<std::int64_t>(config.sync.round_timeout_s * 1000));
    const RoundParts& P = parts[0];
    Gathered got = gather_round(P, feedback[0], round, deadline, [](int) { return true; });
    std::string failed;
    for (int j = 0; j < n; ++j) {
      if (!got.averaged[j].ok) failed += fmt::format(" node {}: averaged slice: {};", label(j), got.averaged[j].reason);
      if (!P.peer_experts[j].empty() && !got.experts[j].ok)
        failed += fmt::format(" node {}: experts: {};", label(j), got.experts[j].reason);
    }
    if (!failed.empty()) raise(ErrorKind::Peer, "could not catch up at round {}:{}", round, failed);
    for (int j = 0; j < n; ++j) {
      scatter(params, P.slices[j], got.averaged[j].values.data());
      if (got.experts[j].ok) scatter(params, P.peer_experts[j], got.experts[j].values.data());
    }
    SyncRoundReport report;
    report.round = round;
    report.step = step;
    merge_if_due(report, step, 0);
    report.bytes_in = bytes_in.load();
    report.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
    return report;
  }

  // sync.sparse.local_*: the share of this node's unsent remainder (its error-feedback buffer)
  // that its weights already hold — for the experts it owns, and for the shared parameters. The
  // buffer keeps the whole remainder for later rounds either way; what a node publishes is its
  // weights less that share.
  double kept_experts() const {
    return config.sync.expert_encoding == WireEncoding::Sparse && config.sync.sparse.local_experts ? 1.0 : 0.0;
  }
  double kept_shared() const {
    return config.sync.shared_encoding == WireEncoding::Sparse ? config.sync.sparse.shared_kept(n) : 0.0;
  }

  // The weights over `ranges` plus `share` x residual (share < 0 takes it out again).
  std::vector<float> with_kept(const std::vector<ParamRange>& ranges, const std::vector<float>& residual,
                               double share) const {
    auto weights = model_values(ranges);
    if (share == 0 || residual.empty()) return weights;
    const auto s = static_cast<float>(share);
    for (std::size_t i = 0; i < weights.size(); ++i) weights[i] += s * residual[i];
    return weights;
  }
  // sync.sparse.decay on a sparse part's buffer.
  void decay(WireEncoding e, std::vector<float>& residual) const {
    const auto beta = static_cast<float>(config.sync.sparse.decay);
    if (e != WireEncoding::Sparse || beta == 1.0f) return;
    for (auto& r : residual) r *= beta;
  }
  // After a round, once the synced copy is the baseline: the weights get their share again.
  void keep_in_weights(const std::vector<ParamRange>& ranges, const std::vector<float>& residual, double share) {
    if (share == 0 || residual.empty()) return;
    const auto weights = with_kept(ranges, residual, share);
    scatter(params, ranges, weights.data());
  }

  // Writes flat values into the baseline over `ranges` (a resumed node's synced copy).
  void set_baseline(const std::vector<ParamRange>& ranges, const std::vector<float>& flat) {
    scatter(ranges, flat.data(), [this](std::size_t i) { return synced[i].data(); });
  }

  void keep_as_baseline(const std::vector<ParamRange>& ranges) {
    for (const auto& r : ranges)
      std::memcpy(synced[r.param].data() + r.offset, params[r.param].data + r.offset, static_cast<std::size_t>(r.count) * 4);
  }

  // After round r: the parts that now hold round r's common result become the baseline, with
  // base round r. A slice averaged locally may differ from what others hold (base 0); experts
  // not fetched keep their older baseline and base round — unless a merge mixed them into
  // every expert, which then differs from the others' (base 0).
  void update_baseline(const RoundParts& P, Feedback& fb, std::uint64_t round, const std::vector<bool>& from_aggregator,
                       const std::vector<bool>& experts_ok, bool merged) {
    bool experts_missing = false;
    for (int j = 0; j < n; ++j) {
      keep_as_baseline(P.slices[j]);
      fb.base_slice[j] = from_aggregator[j] ? round : 0;
      if (j == self || experts_ok[j]) {
        keep_as_baseline(P.peer_experts[j]);
        fb.base_experts[j] = round;
      } else if (!P.peer_experts[j].empty()) {
        experts_missing = true;
      }
    }
    if (merged && experts_missing) std::fill(fb.base_experts.begin(), fb.base_experts.end(), 0);
  }

  // With fragments, a whole-model round (sent without baselines) leaves every fragment's
  // baseline at its result: fragment slices are common where every whole slice came from its
  // aggregator; int8 residuals are spent (the values went out exactly).
  void whole_round_baselines(std::uint64_t round, const std::vector<bool>& from_aggregator,
                             const std::vector<bool>& experts_ok, bool merged) {
    const bool all_aggregated = std::all_of(from_aggregator.begin(), from_aggregator.end(), [](bool b) { return b; });
    for (std::size_t p = 1; p < parts.size(); ++p) {
      update_baseline(parts[p], feedback[p], round, std::vector<bool>(static_cast<std::size_t>(n), all_aggregated),
                      experts_ok, merged);
      Feedback& fb = feedback[p];
      if (is_delta_encoding(config.sync.expert_encoding))
        std::fill(fb.residual_experts.begin(), fb.residual_experts.end(), 0.0f);
      if (is_delta_encoding(config.sync.shared_encoding)) {
        std::fill(fb.residual_average.begin(), fb.residual_average.end(), 0.0f);
        for (auto& r : fb.residual_raw) std::fill(r.begin(), r.end(), 0.0f);
      }
    }
  }

  // With fragments, before a whole-model round (the run's last; it goes out in fp32 with its
  // buffers folded in): the fragments' sparse buffers, updates not sent yet, move into the whole
  // model's value by value, so that this round sends them and no fragment sends them again.
  // What this node held back as a fragment slice's aggregator belongs to the average, whose whole-
  // model slices are cut differently: it comes back as nodes x that, per whole-model slice, for
  // this node to add to what it publishes (the average then gains it once, whatever the weights
  // keep of the remainders). int8 buffers stay: the whole round spends them anyway.
  std::vector<std::vector<float>> move_fragment_buffers_to_whole() {
    using Buffers = std::vector<std::pair<const std::vector<ParamRange>*, std::vector<float>*>>;
    std::vector<std::vector<float>> by_param(params.size());
    auto at = [&](std::size_t t) {
      if (by_param[t].empty()) by_param[t].assign(static_cast<std::size_t>(params[t].numel), 0.0f);
      return by_param[t].data();
    };
    auto move = [&](const Buffers& from, const Buffers& to, float factor) {
      for (auto& values : by_param) std::fill(values.begin(), values.end(), 0.0f);
      for (const auto& [ranges, buffer] : from) {
        scatter(*ranges, buffer->data(), at);
        std::fill(buffer->begin(), buffer->end(), 0.0f);
      }
      for (const auto& [ranges, buffer] : to) {
        const auto moved = gather(params, *ranges, [&](std::size_t t) -> const float* { return at(t); });
        for (std::size_t i = 0; i < moved.size(); ++i) (*buffer)[i] += factor * moved[i];
      }
    };
    Feedback& whole = feedback[0];
    const RoundParts& W = parts[0];
    Buffers experts, raw, average, whole_raw, published;
    std::vector<std::vector<float>> held_back(static_cast<std::size_t>(n));
    for (int k = 0; k < n; ++k) {
      held_back[k].assign(static_cast<std::size_t>(range_numel(W.slices[k])), 0.0f);
      published.emplace_back(&W.slices[k], &held_back[k]);
      whole_raw.emplace_back(&W.slices[k], &whole.residual_raw[k]);
    }
    for (std::size_t p = 1; p < parts.size(); ++p) {
      experts.emplace_back(&parts[p].peer_experts[self], &feedback[p].residual_experts);
      average.emplace_back(&parts[p].slices[self], &feedback[p].residual_average);
      for (int k = 0; k < n; ++k) raw.emplace_back(&parts[p].slices[k], &feedback[p].residual_raw[k]);
    }
    if (config.sync.expert_encoding == WireEncoding::Sparse)
      move(experts, {{&W.peer_experts[self], &whole.residual_experts}}, 1.0f);
    if (config.sync.shared_encoding != WireEncoding::Sparse) return {};
    move(raw, whole_raw, 1.0f);
    move(average, published, static_cast<float>(n));
    return held_back;
  }

  SyncRoundReport run_round(std::uint64_t round, std::int64_t step, double timeout_s, int fragment) {
    if (observer) return observe_round(round, step);
    const std::int64_t period = config.sync.period();
    dense_round = period > 0 && static_cast<std::int64_t>(round) == (config.train.steps + period - 1) / period &&
                  (config.sync.shared_encoding == WireEncoding::Sparse || config.sync.expert_encoding == WireEncoding::Sparse);
    if (dense_round)
      spdlog::info("sync: round {} is the run's last: sparse parts go out in fp32 with what their error feedback held back",
                   round);
    const std::size_t which = parts_index(fragment);
    const RoundParts& P = parts[which];
    Feedback& fb = feedback[which];
    // n x what this node held back of fragment averages (a whole-model round with fragments).
    const auto held_back_average =
        which == 0 && fragments > 1 ? move_fragment_buffers_to_whole() : std::vector<std::vector<float>>{};
    last_parts = which;
    lr_scale = round_lr_scale(step);
    const auto t0 = Clock::now();
    const bool adaptive = timeout_s <= 0;
    if (adaptive) timeout_s = deadlines.next();
    const auto deadline = t0 + std::chrono::milliseconds(static_cast<std::int64_t>(timeout_s * 1000));
    // A peer that never answers must not use up the whole round: the reduce step gets half.
    const auto reduce_deadline = t0 + (deadline - t0) / 2;
    const std::uint64_t in0 = bytes_in.load();
    for (int j = 0; j < n; ++j) peer_bytes_in[j] = 0;
    resumed = 0;
    encode_seconds = 0;
    const WireEncoding se = config.sync.shared_encoding, ee = config.sync.expert_encoding;
    SyncRoundReport report;
    report.round = round;
    report.step = step;
    report.fragment = which == 0 ? kWholeModel : static_cast<int>(which) - 1;
    report.deadline_s = timeout_s;
    std::vector<std::string> failure(static_cast<std::size_t>(n));  // first reason per peer

    // 1. Publish snapshot r: the weights less the share of the remainders they hold (which
    // the buffers add back whole, decayed).
    std::vector<float> own_experts;
    const auto expert_values =
        poisoned(with_kept(P.peer_experts[self], fb.residual_experts, -kept_experts()), "experts", round);
    decay(ee, fb.residual_experts);
    auto experts_stream = encode(header(round, spes::v1::EXPERTS, 0, self), P.peer_experts[self], ee, expert_values,
                                 &fb.residual_experts, own_experts, fb.base_experts[self]);
    std::vector<std::vector<float>> own_raw(static_cast<std::size_t>(n));
    std::vector<StreamPtr> raw_streams;
    for (int k = 0; k < n; ++k) {
      std::vector<float>* residual = fb.residual_raw.empty() ? nullptr : &fb.residual_raw[k];
      auto values = residual ? with_kept(P.slices[k], *residual, -kept_shared()) : model_values(P.slices[k]);
      if (!held_back_average.empty())
        for (std::size_t i = 0; i < values.size(); ++i) values[i] += held_back_average[k][i];
      values = poisoned(std::move(values), "shared", round);
      if (residual) decay(se, *residual);
      raw_streams.push_back(encode(header(round, spes::v1::SHARED_RAW, static_cast<std::uint32_t>(k), self),
                                   P.slices[k], se, values, residual, own_raw[k], fb.base_slice[k]));
    }
    store.publish(round, experts_stream, std::move(raw_streams));

    // 2. Reduce this node's slice.
    std::vector<std::future<Fetched>> raw_calls(static_cast<std::size_t>(n));
    for (int j = 0; j < n; ++j)
      if (j != self)
        raw_calls[j] = std::async(std::launch::async, [&, j] {
          return fetch(fb, j, round, spes::v1::SHARED_RAW, static_cast<std::uint32_t>(self), P.slices[self], se,
                       reduce_deadline);
        });
    std::vector<Fetched> raw(static_cast<std::size_t>(n));
    std::vector<const std::vector<float>*> contributions;
    StreamHeader avg_header = header(round, spes::v1::SHARED_AVERAGED, static_cast<std::uint32_t>(self), self);
    for (int j = 0; j < n; ++j) {
      if (j == self) {
        contributions.push_back(&own_raw[self]);
        avg_header.contributors.push_back(static_cast<std::uint32_t>(j));
        continue;
      }
      raw[j] = raw_calls[j].get();
      if (raw[j].ok) {
        contributions.push_back(&raw[j].values);
        avg_header.contributors.push_back(static_cast<std::uint32_t>(j));
      } else {
        failure[j] = "slice " + std::to_string(self) + ": " + raw[j].reason;
      }
    }
    std::vector<float> own_average;
    decay(se, fb.residual_average);
    store.publish_average(round, encode(avg_header, P.slices[self], se, shared_average(contributions, config.sync.robust),
                                        fb.residual_average.empty() ? nullptr : &fb.residual_average, own_average,
                                        fb.base_slice[self]));
    raw.clear();

    // 3. Gather averaged slices and other owners' experts.
    auto [averaged, experts] =
        gather_round(P, fb, round, deadline, [&](int j) { return j != self && failure[j].empty(); });
    for (int j = 0; j < n; ++j) {
      if (j == self || !failure[j].empty()) continue;
      if (!averaged[j].ok) failure[j] = "averaged slice: " + averaged[j].reason;
      else if (!P.peer_experts[j].empty() && !experts[j].ok) failure[j] = "experts: " + experts[j].reason;
    }
    // A slice whose aggregator failed: average it here from the raw copies of the peers that
    // answered, in node-id order (every surviving node computes the same).
    std::vector<bool> from_aggregator(static_cast<std::size_t>(n));
    for (int k = 0; k < n; ++k) from_aggregator[k] = k == self || averaged[k].ok;
    for (int k = 0; k < n; ++k) {
      if (k == self || averaged[k].ok) continue;
      std::vector<std::future<Fetched>> calls(static_cast<std::size_t>(n));
      for (int j = 0; j < n; ++j)
        if (j != self && j != k && failure[j].empty())
          calls[j] = std::async(std::launch::async, [&, j, k] {
            return fetch(fb, j, round, spes::v1::SHARED_RAW, static_cast<std::uint32_t>(k), P.slices[k], se, deadline);
          });
      std::vector<Fetched> got(static_cast<std::size_t>(n));
      std::vector<const std::vector<float>*> slice_parts;
      for (int j = 0; j < n; ++j) {
        if (j == self) {
          slice_parts.push_back(&own_raw[k]);
        } else if (calls[j].valid()) {
          got[j] = calls[j].get();
          if (got[j].ok) slice_parts.push_back(&got[j].values);
          else if (failure[j].empty()) failure[j] = "slice " + std::to_string(k) + ": " + got[j].reason;
        }
      }
      averaged[k].values = shared_average(slice_parts, config.sync.robust);
      averaged[k].ok = true;
      spdlog::warn("sync: round {}: slice {} averaged locally over {} node(s) (its aggregator was skipped)", round, k,
                   slice_parts.size());
    }

    // 4. Load into the model.
    scatter(params, P.slices[self], own_average.data());
    scatter(params, P.peer_experts[self], own_experts.data());
    for (int j = 0; j < n; ++j) {
      if (j == self) continue;
      scatter(params, P.slices[j], averaged[j].values.data());
      if (experts[j].ok) scatter(params, P.peer_experts[j], experts[j].values.data());
    }
    merge_if_due(report, step, which);
    if (keeps_baseline) {
      std::vector<bool> experts_ok(static_cast<std::size_t>(n));
      for (int j = 0; j < n; ++j) experts_ok[j] = experts[j].ok;
      // With fragments a whole-model round keeps no baseline of its own (it always goes without
      // one): it refreshes every fragment's.
      if (which == 0 && fragments > 1) whole_round_baselines(round, from_aggregator, experts_ok, report.merged);
      else update_baseline(P, fb, round, from_aggregator, experts_ok, report.merged);
    }
    keep_in_weights(P.peer_experts[self], fb.residual_experts, kept_experts());
    for (std::size_t k = 0; k < fb.residual_raw.size(); ++k) keep_in_weights(P.slices[k], fb.residual_raw[k], kept_shared());

    for (int j = 0; j < n; ++j) {
      suspect[j] = !failure[j].empty();
      if (suspect[j]) {
        ++skips[j];
        report.skipped.push_back({label(j), failure[j]});
        spdlog::warn("sync: round {}: skipped node {}: {}", round, label(j), failure[j]);
      }
    }
    report.bytes_in = bytes_in.load() - in0;
    report.bytes_out = server->bytes_sent();
    const auto sent_to = server->bytes_sent_by_requester();
    for (int j = 0; j < n; ++j) {
      if (j == self) continue;
      auto it = sent_to.find(static_cast<std::uint32_t>(label(j)));
      report.by_peer.push_back({label(j), peer_bytes_in[j].load(), it == sent_to.end() ? 0 : it->second});
    }
    report.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
    report.resumed_streams = resumed.load();
    report.encode_s = encode_seconds;
    if (adaptive) {
      bool slow_link = false;  // a skipped peer had sent part of its data
      for (int j = 0; j < n; ++j) slow_link = slow_link || (!failure[j].empty() && peer_bytes_in[j].load() > 0);
      deadlines.record(report.seconds, report.skipped.empty(), slow_link);
    }
    return report;
  }
};

SyncEngine::SyncEngine(const Config& config, ParamSet params, SyncMembership membership)
    : impl_(std::make_unique<Impl>(config, std::move(params), std::move(membership))) {}
SyncEngine::~SyncEngine() = default;
SyncRoundReport SyncEngine::run_round(std::uint64_t round, std::int64_t step, double timeout_s, int fragment) {
  return impl_->run_round(round, step, timeout_s, fragment);
}

int SyncEngine::fragments() const { return impl_->fragments; }

int SyncEngine::fragment_of(std::uint64_t round, bool last) const {
  const Impl& m = *impl_;
  if (m.fragments == 1 || last || round == m.membership.whole_round || round == 0) return kWholeModel;
  return static_cast<int>((round - 1) % static_cast<std::uint64_t>(m.fragments));
}

const std::vector<std::size_t>& SyncEngine::tensors_of(int fragment) const {
  return impl_->parts[impl_->parts_index(fragment)].tensors;
}
void SyncEngine::finish(double timeout_s) {
  Impl& m = *impl_;
  const std::uint64_t round = m.store.latest();
  if (m.observer || round < m.membership.first_round) return;  // nothing published
  // Alone in the plan, a node still serves the nodes catching up from it (its observers).
  if (m.n == 1 && m.membership.observers.empty()) return;
  // Each other node fetches our averaged slice, its raw copy of its own slice and our experts;
  // each observer our averaged slice and our experts. Peers skipped in the last round (dead or
  // hostile) are not waited for.
  const bool own_experts = !m.parts[m.last_parts].peer_experts[m.self].empty();
  const auto self_slice = static_cast<std::uint32_t>(m.self);
  std::vector<ServedKey> expected;
  auto expect_from = [&](int id) {
    expected.emplace_back(static_cast<std::uint32_t>(id), spes::v1::SHARED_AVERAGED, self_slice);
    if (own_experts) expected.emplace_back(static_cast<std::uint32_t>(id), spes::v1::EXPERTS, 0);
  };
  for (int j = 0; j < m.n; ++j) {
    if (j == m.self || m.suspect[j]) continue;
    expect_from(m.label(j));
    expected.emplace_back(static_cast<std::uint32_t>(m.label(j)), spes::v1::SHARED_RAW, static_cast<std::uint32_t>(j));
  }
  for (int id : m.membership.observers) expect_from(id);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(static_cast<std::int64_t>(timeout_s * 1000));
  if (!m.store.wait_served(round, expected, deadline))
    spdlog::warn("sync: leaving before every peer fetched round {} from this node", round);
}

namespace {
// Residual keys: "experts", "average", "raw.K" for the whole model; with fragments the same
// under "whole." and "f<F>." for each fragment.
std::string carry_prefix(std::size_t parts, std::size_t p) {
  if (parts == 1) return "";
  return p == 0 ? "whole." : "f" + std::to_string(p - 1) + ".";
}
}  // namespace

std::optional<SyncCarry> SyncEngine::carry() const {
  const Impl& m = *impl_;
  bool residuals = false;
  for (const auto& fb : m.feedback) residuals = residuals || !fb.residual_experts.empty() || !fb.residual_average.empty();
  if (m.observer || (!m.keeps_baseline && !residuals)) return std::nullopt;
  SyncCarry c;
  c.round = m.store.latest();
  for (std::size_t p = 0; p < m.feedback.size(); ++p) {
    const Feedback& fb = m.feedback[p];
    const std::string prefix = carry_prefix(m.feedback.size(), p);
    // The baselines a resumed run rebuilds are its weights, i.e. those right after the last
    // round: with fragments, only the last round's parts (all after a whole-model round) keep
    // their base rounds; the others start over (their next round goes without a baseline) —
    // unless the shard holds their synced copy (sparse with the remainders in the weights, below;
    // the experts of other owners are not trained, so the weights hold their synced copy).
    const bool current = m.last_parts == 0 || p == m.last_parts;
    const std::vector<std::uint64_t> none(static_cast<std::size_t>(m.n), 0);
    const auto& slice_base = current || m.kept_shared() > 0 ? fb.base_slice : none;
    const auto& expert_base = current || m.kept_experts() > 0 ? fb.base_experts : none;
    c.base_slice.insert(c.base_slice.end(), slice_base.begin(), slice_base.end());
    c.base_experts.insert(c.base_experts.end(), expert_base.begin(), expert_base.end());
    // Where the weights hold part of a residual, they are not the baseline: the shard then holds
    // the synced copy too (bit for bit what the others hold).
    const RoundParts& P = m.parts[p];
    if (!fb.residual_experts.empty()) {
      c.residuals[prefix + "experts"] = fb.residual_experts;
      if (m.kept_experts() > 0) c.residuals[prefix + "base.experts"] = m.baseline_values(P.peer_experts[m.self], WireEncoding::Sparse);
    }
    if (!fb.residual_average.empty()) c.residuals[prefix + "average"] = fb.residual_average;
    for (std::size_t k = 0; k < fb.residual_raw.size(); ++k) {
      c.residuals[prefix + "raw." + std::to_string(k)] = fb.residual_raw[k];
      if (m.kept_shared() > 0)
        c.residuals[prefix + "base.raw." + std::to_string(k)] = m.baseline_values(P.slices[k], WireEncoding::Sparse);
    }
  }
  return c;
}

bool SyncEngine::restore(const SyncCarry& c) {
  Impl& m = *impl_;
  const auto mine = carry();
  if (!mine || c.base_slice.size() != mine->base_slice.size() || c.base_experts.size() != mine->base_experts.size() ||
      c.residuals.size() != mine->residuals.size())
    return false;
  for (const auto& [key, values] : mine->residuals) {
    auto it = c.residuals.find(key);
    if (it == c.residuals.end() || it->second.size() != values.size()) return false;
  }
  const auto n = static_cast<std::ptrdiff_t>(m.n);
  for (std::size_t p = 0; p < m.feedback.size(); ++p) {
    Feedback& fb = m.feedback[p];
    const std::string prefix = carry_prefix(m.feedback.size(), p);
    const auto at = static_cast<std::ptrdiff_t>(p) * n;
    fb.base_slice.assign(c.base_slice.begin() + at, c.base_slice.begin() + at + n);
    fb.base_experts.assign(c.base_experts.begin() + at, c.base_experts.begin() + at + n);
    const RoundParts& P = m.parts[p];
    if (!fb.residual_experts.empty()) {
      fb.residual_experts = c.residuals.at(prefix + "experts");
      if (m.kept_experts() > 0) m.set_baseline(P.peer_experts[m.self], c.residuals.at(prefix + "base.experts"));
    }
    if (!fb.residual_average.empty()) fb.residual_average = c.residuals.at(prefix + "average");
    for (std::size_t k = 0; k < fb.residual_raw.size(); ++k) {
      fb.residual_raw[k] = c.residuals.at(prefix + "raw." + std::to_string(k));
      if (m.kept_shared() > 0) m.set_baseline(P.slices[k], c.residuals.at(prefix + "base.raw." + std::to_string(k)));
    }
  }
  return true;
}

int SyncEngine::port() const { return impl_->server ? impl_->server->port() : 0; }
std::uint64_t SyncEngine::bytes_sent() const { return impl_->server ? impl_->server->bytes_sent() : 0; }
std::uint64_t SyncEngine::bytes_received() const { return impl_->bytes_in.load(); }

namespace {
// Byte counts indexed by spes.v1.Encoding value, keyed by encoding name (zeros left out).
template <typename Counts>
std::map<std::string, std::uint64_t> by_encoding_name(const Counts& counts) {
  static const char* const names[kWireEncodings] = {"unspecified", "fp32", "bf16", "int8_delta", "sparse"};
  std::map<std::string, std::uint64_t> out;
  for (std::size_t e = 0; e < counts.size(); ++e)
    if (const std::uint64_t b = counts[e]) out[names[e]] = b;
  return out;
}
}  // namespace

std::map<std::string, std::uint64_t> SyncEngine::bytes_received_by_encoding() const {
  std::array<std::uint64_t, kWireEncodings> counts{};
  for (std::size_t e = 0; e < counts.size(); ++e) counts[e] = impl_->bytes_in_by_encoding[e].load();
  return by_encoding_name(counts);
}
std::map<std::string, std::uint64_t> SyncEngine::bytes_sent_by_encoding() const {
  return impl_->server ? by_encoding_name(impl_->server->bytes_sent_by_encoding()) : std::map<std::string, std::uint64_t>{};
}
std::uint64_t SyncEngine::calls_refused() const { return impl_->server ? impl_->server->calls_refused() : 0; }
std::uint64_t SyncEngine::suspicious_calls() const {
  return impl_->server ? impl_->server->suspicious_calls().count() : 0;
}
std::string SyncEngine::last_suspicious_call() const {
  return impl_->server ? impl_->server->suspicious_calls().last() : std::string();
}
std::vector<std::uint64_t> SyncEngine::skip_counts() const { return impl_->skips; }

}  // namespace spes
