// spes bench sync — bytes per SPES round, on the wire, against the reference star protocol.
//
// By count for any config (also the paper shapes): every node of the reference uploads fp32
// shared + own experts to one server, which sends every node the full fp32 model. Measured for
// configs that fit in memory: N in-process nodes on loopback run real rounds with model-shaped
// buffers, and the bytes are the gRPC payload bytes their services sent.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <spdlog/spdlog.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <functional>
#include <future>
#include <random>

#include "../../src/cli/commands.h"
#include "../../src/sync/compression.h"
#include "spes/config/config.h"
#include "spes/model/size.h"
#include "spes/sync/codec.h"
#include "spes/sync/engine.h"
#include "spes/sync/traffic.h"
#include "spes/util/error.h"
#include "spes/util/log.h"
#include "spes/util/parallel.h"
#include "spes/util/progress.h"
#include "spes/util/safetensors.h"

namespace spes::cli {
namespace {

// A port on 127.0.0.1 that is free right now (the kernel picks it).
int free_loopback_port() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof addr;
  ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  ::close(fd);
  return ntohs(addr.sin_port);
}

// Bytes per value of an encoding, int8 scales (one per row of d values) and sparse positions and
// scales included.
// `k`: values a sparse chunk sends (each part has its own, sync.sparse.*density).
double value_bytes(WireEncoding e, std::int64_t d, const SparseConfig& sparse, std::int64_t k) {
  if (e == WireEncoding::Sparse) {
    SparseFormat f = SparseFormat::of(sparse);
    f.k = k;
    const std::int64_t n = sparse.chunk * 1000;
    return static_cast<double>(f.size(n)) / static_cast<double>(n);
  }
  return static_cast<double>(encoded_size(e, d * 1000, d)) / static_cast<double>(d * 1000);
}

// The same averaged over the model's expert tensors (`experts`) or its shared ones, each tensor in
// its own encoding (a sparse part sends tensors under sync.sparse.dense_below as int8 deltas).
double part_value_bytes(const ModelConfig& m, bool experts, WireEncoding e, const SparseConfig& sparse, std::int64_t k) {
  const SparseFormat f = SparseFormat::of(sparse);
  double bytes = 0, values = 0;
  for (const auto& [name, shape] : parameter_shapes(m)) {
    if ((name.find(".mlp.experts.") != std::string::npos) != experts) continue;
    std::int64_t numel = 1;
    for (auto x : shape) numel *= x;
    bytes += static_cast<double>(numel) * value_bytes(f.tensor_encoding(e, numel), shape.back(), sparse, k);
    values += static_cast<double>(numel);
  }
  return bytes / values;
}

// Buffers with the model's tensors (names and shapes as registered), filled with noise.
struct Buffers {
  std::vector<std::vector<float>> storage;
  ParamSet params;
  Buffers(const ModelConfig& c, unsigned seed) {
    std::vector<ParamRef> refs;
    for (const auto& [name, shape] : parameter_shapes(c)) {
      ParamRef r;
      r.name = name;
      r.shape = shape;
      r.numel = 1;
      for (auto s : r.shape) r.numel *= s;
      int layer = -1, expert = -1;  // experts are named layers.L.mlp.experts.E.*
      if (std::sscanf(name.c_str(), "layers.%d.mlp.experts.%d.", &layer, &expert) != 2) layer = expert = -1;
      r.layer = layer;
      r.expert = expert;
      refs.push_back(std::move(r));
    }
    std::mt19937 gen(seed);
    std::normal_distribution<float> normal(0.0f, 0.02f);
    storage.resize(refs.size());
    for (std::size_t i = 0; i < refs.size(); ++i) {
      storage[i].resize(static_cast<std::size_t>(refs[i].numel));
      for (auto& v : storage[i]) v = normal(gen);
      refs[i].data = storage[i].data();
    }
    params = ParamSet(std::move(refs));
  }
  // Every tensor's values from a checkpoint's model.safetensors (`spes bench sync --from/--to`).
  void load(const std::map<std::string, LoadedTensor>& weights, const std::string& file) {
    for (std::size_t i = 0; i < params.size(); ++i) {
      const auto it = weights.find(params[i].name);
      if (it == weights.end())
        raise(ErrorKind::Usage, "{} has no tensor '{}': is it a checkpoint of this config's model?", file, params[i].name);
      if (it->second.shape != params[i].shape)
        raise(ErrorKind::Usage, "{}: tensor '{}' has another shape than this config's model", file, params[i].name);
      storage[i] = it->second.values;
    }
  }
  void train_a_little(float scale, unsigned seed) {  // stands in for H local steps
    std::mt19937 gen(seed);
    std::normal_distribution<float> normal(0.0f, scale);
    for (auto& t : storage)
      for (auto& v : t) v += normal(gen);
  }
};

// Real weights for the measured rounds: node i holds from[i] in round 1 and to[i] in round 2 (one
// file stands for every node), so the deltas on the wire are a training run's, not noise.
struct RealWeights {
  std::vector<std::map<std::string, LoadedTensor>> from, to;
  std::vector<std::string> from_files, to_files;
};

// Runs `rounds` rounds between N in-process nodes; returns the traffic of the last round.
// `sync`: the config's sync section, for its compression.
Traffic measure(const ModelConfig& model, const SyncConfig& sync, int N, WireEncoding shared, WireEncoding experts,
                const SparseConfig& sparse, int rounds, const RealWeights* real) {
  // The in-process nodes talk over loopback without TLS: their "sync.insecure" warnings (one per
  // node and row) would bury the table. Errors still show.
  const auto log_level = spdlog::get_level();
  spdlog::set_level(std::max(log_level, spdlog::level::err));
  struct RestoreLevel {
    spdlog::level::level_enum level;
    ~RestoreLevel() { spdlog::set_level(level); }
  } restore{log_level};
  std::vector<int> ports;
  std::string peers;
  for (int i = 0; i < N; ++i) {
    ports.push_back(free_loopback_port());
    peers += fmt::format("    - {{id: {}, address: \"127.0.0.1:{}\"}}\n", i, ports[i]);
  }
  std::vector<std::unique_ptr<Buffers>> buffers;
  std::vector<std::unique_ptr<SyncEngine>> engines;
  for (int i = 0; i < N; ++i) {
    buffers.push_back(std::make_unique<Buffers>(model, 1));  // same init on every node, as in training
    const std::string yaml = fmt::format(
        "run: {{name: bench, node_id: {}}}\nmodel: {{vocab_size: {}, d_model: {}, n_layers: {}, n_heads: {}, "
        "n_kv_heads: {}, d_ff: {}, n_experts: {}, top_k: {}}}\nmerge: {{alpha: 0}}\n"
        "sync:\n  every: 1\n  insecure: true\n  token: bench\n  encoding: {{shared: {}, experts: {}}}\n"
        "  sparse: {{chunk: {}, density: {}, shared_density: {}, bits: {}, dense_below: {}, average_density: {}, average_bits: {}}}\n"
        "  compression: {}\n  compression_level: {}\n  peers:\n{}",
        i, model.vocab_size, model.d_model, model.n_layers, model.n_heads, model.kv_heads(), model.d_ff,
        model.n_experts, model.top_k, wire_encoding_name(shared), wire_encoding_name(experts), sparse.chunk,
        sparse.density, sparse.shared_density, sparse.bits, sparse.dense_below, sparse.average_density, sparse.average_bits,
        sync.compression, sync.compression_level, peers);
    engines.push_back(std::make_unique<SyncEngine>(parse_config(yaml, "bench"), buffers[i]->params));
  }
  Traffic t;
  for (int r = 1; r <= rounds; ++r) {
    for (int i = 0; i < N; ++i) {
      if (!real) {
        buffers[i]->train_a_little(1e-3f, static_cast<unsigned>(100 * r + i));
        continue;
      }
      const auto k = static_cast<std::size_t>(i) % real->from.size();
      if (r == 1) buffers[i]->load(real->from[k], real->from_files[k]);
      else buffers[i]->load(real->to[k], real->to_files[k]);
    }
    std::vector<std::uint64_t> in0, out0;
    for (auto& e : engines) in0.push_back(e->bytes_received()), out0.push_back(e->bytes_sent());
    std::vector<std::future<SyncRoundReport>> calls;
    for (auto& e : engines) calls.push_back(std::async(std::launch::async, [&e, r] { return e->run_round(r, r); }));
    for (auto& c : calls) c.get();
    for (auto& e : engines) e->finish(30);
    t = {};
    for (int i = 0; i < N; ++i) {
      const double in = static_cast<double>(engines[i]->bytes_received() - in0[i]);
      const double out = static_cast<double>(engines[i]->bytes_sent() - out0[i]);
      t.total += out;
      t.busiest = std::max({t.busiest, in, out});
    }
  }
  return t;
}

// Encode and decode speed: seconds per 10^8 values (a round of `small` moves ~5·10^6 per node, of
// `1b` ~5·10^8), with error feedback, for int8_delta and each sparse setting; encoding on one
// thread and on `threads` (sync.encode_threads), decoding on one (each stream decodes on its own).
void codec_speed(const SparseConfig& base_sparse, std::int64_t row, int threads, int zstd_level) {
  const std::int64_t n = std::int64_t{1} << 24;
  std::mt19937 gen(3);
  std::normal_distribution<float> normal(0.0f, 0.02f);
  std::vector<float> base(n), values(n), residual(n, 0.0f), decoded(n), back(n);
  for (std::int64_t i = 0; i < n; ++i) {
    base[i] = normal(gen);
    values[i] = base[i] + 0.05f * normal(gen);
  }
  auto seconds = [](auto&& f) {
    const auto t0 = std::chrono::steady_clock::now();
    f();
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  };
  const double per = 1e8 / static_cast<double>(n);
  std::string bytes;
  std::printf("\ncodec speed, seconds per 10^8 values: encode with error feedback on 1 / %d threads "
              "(speed-up), decode on 1:\n", threads);
  auto row_of = [&](const char* name, const std::function<void(int)>& encode, const std::function<void()>& decode) {
    const double e1 = seconds([&] { encode(1); });
    const double en = seconds([&] { encode(threads); });
    const double d = seconds(decode);
    std::printf("  %-16s %6.2f / %5.2f (%.1fx) / %5.2f\n", name, e1 * per, en * per, e1 / en, d * per);
  };
  row_of(
      "int8_delta",
      [&](int t) { encode_values(WireEncoding::Int8Delta, values.data(), base.data(), residual.data(), n, row, bytes, decoded.data(), t); },
      [&] { decode_values(WireEncoding::Int8Delta, bytes, base.data(), n, row, back.data()); });
  // Every delta piece carries the crc32 of its baseline (4 bytes a value): the sender's share
  // (the receiver checks its own copy on one thread per stream: the last column).
  row_of(
      "baseline crc32", [&](int t) { (void)crc32_of(base.data(), static_cast<std::size_t>(n) * 4, t); },
      [&] { (void)crc32_of(base.data(), static_cast<std::size_t>(n) * 4); });
  for (double density : {0.01, 0.02, 0.05, 1.0})
    for (int bits : {2, 4}) {
      SparseConfig s = base_sparse;
      s.density = density;
      s.bits = bits;
      const SparseFormat f = SparseFormat::of(s);
      const std::string name = fmt::format("sparse {:3.0f}% {}b", 100 * density, bits);
      row_of(
          name.c_str(),
          [&](int t) { encode_sparse(f, values.data(), base.data(), residual.data(), n, bytes, decoded.data(), t); },
          [&] { decode_sparse(f, bytes, base.data(), n, back.data()); });
    }
  // sync.compression on top: the whole 2-bit payload (the default shared part) in 4 MiB pieces,
  // packed side by side as build_stream does, unpacked one piece at a time.
  if (zstd_level > 0) {
    SparseConfig s = base_sparse;
    s.density = 1.0;
    s.bits = 2;
    const SparseFormat f = SparseFormat::of(s);
    encode_sparse(f, values.data(), base.data(), residual.data(), n, bytes, decoded.data(), threads);
    const std::int64_t piece = 4 << 20, pieces = (static_cast<std::int64_t>(bytes.size()) + piece - 1) / piece;
    std::vector<std::string> packed(static_cast<std::size_t>(pieces));
    std::size_t packed_bytes = 0;
    row_of(
        fmt::format("zstd {} of 100% 2b", zstd_level).c_str(),
        [&](int t) {
          parallel_ranges(pieces, 1, t, [&](std::int64_t lo, std::int64_t hi) {
            for (std::int64_t i = lo; i < hi; ++i) {
              auto& p = packed[static_cast<std::size_t>(i)];
              p = bytes.substr(static_cast<std::size_t>(i * piece), static_cast<std::size_t>(piece));
              (void)sync_detail::compress_payload(p, zstd_level);  // left as it is where it does not shrink
            }
          });
        },
        [&] {
          packed_bytes = 0;
          for (std::int64_t i = 0; i < pieces; ++i) {
            const auto& p = packed[static_cast<std::size_t>(i)];
            const std::size_t raw = std::min<std::size_t>(piece, bytes.size() - static_cast<std::size_t>(i * piece));
            packed_bytes += p.size();
            if (p.size() < raw) (void)sync_detail::decompress_payload(p, raw, "bench");
          }
        });
    std::printf("  (noise: %.1f%% of the bytes remain; a training run's deltas: docs/benchmarks.md)\n",
                100.0 * static_cast<double>(packed_bytes) / static_cast<double>(bytes.size()));
  }
}

struct SyncBenchOptions {
  ConfigOptions config;
  int nodes = 4;
  bool measure = true;
  bool codec_only = false;
  std::vector<std::string> from, to;  // model.safetensors of two checkpoints: real deltas
};

void run_sync_bench(const SyncBenchOptions& o) {
  init_logging("warn");
  Config c = load_config(o.config.config, o.config.overrides);
  if (o.codec_only) {
    codec_speed(c.sync.sparse, c.model.d_model, threads_or_cores(c.sync.encode_threads), c.sync.zstd_level());
    return;
  }
  const int N = o.nodes, E = static_cast<int>(c.model.n_experts);
  if (N < 1 || E % N != 0) raise(ErrorKind::Usage, "--nodes {} must divide the {} experts", N, E);
  std::unique_ptr<RealWeights> real;
  if (!o.from.empty() || !o.to.empty()) {
    if (o.from.size() != o.to.size() || (o.from.size() != 1 && o.from.size() != static_cast<std::size_t>(N)))
      raise(ErrorKind::Usage, "--from and --to take one file each, or one per node ({}); got {} and {}", N, o.from.size(),
            o.to.size());
    real = std::make_unique<RealWeights>();
    for (std::size_t i = 0; i < o.from.size(); ++i) {
      real->from.push_back(read_safetensors(o.from[i]));
      real->to.push_back(read_safetensors(o.to[i]));
    }
    real->from_files = o.from;
    real->to_files = o.to;
  }
  const ParamCounts pc = count_params(c.model, E);
  const double S = static_cast<double>(pc.shared), X = static_cast<double>(pc.one_expert * c.model.n_layers);
  const Traffic ref = reference_star_traffic(S, X, N, E);
  std::printf("config %s: %s shared + %d experts × %s; N = %d nodes, %d experts each\n", c.source.c_str(),
              format_count(S).c_str(), E, format_count(X).c_str(), N, E / N);
  std::printf("reference star (fp32): total %s per round, busiest link (server downlink) %s\n\n",
              format_bytes(ref.total).c_str(), format_bytes(ref.busiest).c_str());
  std::printf("%-32s %12s %8s %12s %8s   %s\n", "encoding (experts,shared %)", "total", "vs ref", "busiest", "vs ref",
              "target total / busiest");
  struct Case {
    WireEncoding e;
    double total_target, busiest_target;
    SparseConfig sparse;
  };
  // Experts at `density`, the shared contributions at `shared_density` (< 0: the same), the
  // averages at `average_bits` (0: the configuration's sync.sparse.average_bits).
  auto sparse = [&](double density, int bits, double shared_density = -1, int average_bits = 0) {
    SparseConfig s = c.sync.sparse;
    s.density = density;
    s.bits = bits;
    s.shared_density = shared_density < 0 ? density : shared_density;
    if (average_bits > 0) s.average_bits = average_bits;
    return Case{WireEncoding::Sparse, 0.02, 0.01, s};
  };
  const std::int64_t d = c.model.d_model;
  for (const Case& k : {Case{WireEncoding::Fp32, 0.70, 0.25, {}}, Case{WireEncoding::Bf16, 0.35, 0.0, {}},
                        Case{WireEncoding::Int8Delta, 0.20, 1.0 / 12, {}}, sparse(0.01, 2), sparse(0.02, 2),
                        sparse(0.05, 2), sparse(0.01, 4), sparse(0.02, 4), sparse(0.05, 4), sparse(0.01, 2, 1),
                        sparse(0.02, 2, 1), sparse(0.02, 2, 1, 4), sparse(0.02, 4, 1)}) {
    const SparseConfig& sp = k.sparse;
    SparseConfig averages = sp;
    averages.bits = sp.bits_of_averages();
    const Traffic counted = spes_traffic(S, X, N, E, part_value_bytes(c.model, false, k.e, sp, sp.shared_k()),
                                         part_value_bytes(c.model, true, k.e, sp, sp.k()),
                                         part_value_bytes(c.model, false, k.e, averages, averages.average_k(N)));
    std::string name = wire_encoding_name(k.e);
    if (k.e == WireEncoding::Sparse) {
      name = sp.shared_density != sp.density ? fmt::format("sparse {:g}%,{:g}% {}b", 100 * sp.density, 100 * sp.shared_density, sp.bits)
                                   : fmt::format("sparse {:g}% {}b", 100 * sp.density, sp.bits);
      if (averages.bits != sp.bits) name += fmt::format("/{}b", averages.bits);
    }
    auto row = [&](const char* how, const Traffic& t) {
      const double rt = t.total / ref.total, rb = t.busiest / ref.busiest;
      std::printf("%-21s %-10s %12s %7.4f× %12s %7.4f×   ≤ %.2f%s / %s%s\n", name.c_str(), how,
                  format_bytes(t.total).c_str(), rt, format_bytes(t.busiest).c_str(), rb, k.total_target,
                  rt <= k.total_target ? " met" : " MISSED",
                  k.busiest_target > 0 ? fmt::format("≤ {:.3f}", k.busiest_target).c_str() : "-",
                  k.busiest_target > 0 ? (rb <= k.busiest_target ? " met" : " MISSED") : "");
    };
    row("by count", counted);
    if (o.measure) row("measured", measure(c.model, c.sync, N, k.e, k.e, k.sparse, 2, real.get()));
  }
  if (o.measure)
    std::printf("\nmeasured = gRPC payload bytes sent by the nodes' services in round 2 (round 1 of int8_delta and\n"
                "sparse is fp32: it sets the shared baseline), %d in-process nodes on 127.0.0.1, sync.compression %s;\n"
                "%s\n",
                N, c.sync.zstd_level() > 0 ? fmt::format("zstd at level {}", c.sync.zstd_level()).c_str() : "none",
                real ? fmt::format("weights of {} (round 1) and {} (round 2): a training run's deltas", o.from.front(),
                                   o.to.front()).c_str()
                     : "the deltas are Gaussian noise, which compresses less than a training run's (--from/--to)");
  std::printf("sparse: chunks of %lld values (sync.sparse.chunk); positions %d bits each, one fp32 scale per chunk;\n"
              "tensors under %lld values as int8 deltas (sync.sparse.dense_below); averaged slices at %s, %d bits\n",
              static_cast<long long>(c.sync.sparse.chunk), SparseFormat::of(c.sync.sparse).index_bits(),
              static_cast<long long>(c.sync.sparse.dense_below),
              c.sync.sparse.average_density > 0 ? fmt::format("{:g}% of each chunk", 100 * c.sync.sparse.average_density).c_str()
                                                : fmt::format("{} x the contributions' density (sync.sparse.average_density 0)", N).c_str(),
              c.sync.sparse.bits_of_averages());
  std::printf("sparse a%%,b%% Cb/Ab: experts at a%%, shared contributions at b%% (sync.sparse.shared_density; 100%% = every\n"
              "value, no positions), C bits, the averages at A bits where they differ (sync.sparse.average_bits)\n");
  if (o.measure)
    codec_speed(c.sync.sparse, d, threads_or_cores(c.sync.encode_threads), c.sync.zstd_level());
}

}  // namespace

void add_bench_sync(CLI::App& bench) {
  auto* sync = bench.add_subcommand("sync", "bytes per SPES round vs the reference star protocol");
  auto o = std::make_shared<SyncBenchOptions>();
  add_config_options(*sync, o->config);
  sync->add_option("--nodes", o->nodes, "nodes N (must divide the experts)");
  sync->add_flag("!--count-only", o->measure, "only count; do not run rounds (for the paper shapes)");
  sync->add_option("--from", o->from,
                   "measure with real deltas: model.safetensors of a checkpoint of this config (one, or one per node) "
                   "held in round 1 ...")
      ->check(CLI::ExistingFile);
  sync->add_option("--to", o->to, "... and of a later checkpoint, held in round 2")->check(CLI::ExistingFile);
  sync->add_flag("--codec", o->codec_only,
                 "only the codec's speed: encoding on 1 and sync.encode_threads threads (0 = every core), decoding");
  sync->callback([o] { run_sync_bench(*o); });
}

}  // namespace spes::cli
