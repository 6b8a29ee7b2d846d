#include "spes/config/config.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <regex>
#include <set>

#include "spes/sync/codec.h"
#include "spes/util/error.h"
#include "spes/util/fs.h"
#include "yaml_reader.h"

namespace spes {
using config_detail::MapReader;
using config_detail::read_expert_list;

const char* wire_encoding_name(WireEncoding encoding) {
  switch (encoding) {
    case WireEncoding::Fp32: return "fp32";
    case WireEncoding::Bf16: return "bf16";
    case WireEncoding::Int8Delta: return "int8_delta";
    case WireEncoding::Sparse: return "sparse";
  }
  return "?";
}

bool is_delta_encoding(WireEncoding encoding) {
  return encoding == WireEncoding::Int8Delta || encoding == WireEncoding::Sparse;
}

namespace {
std::int64_t values_per_chunk(double density, std::int64_t chunk) {
  return std::clamp<std::int64_t>(std::llround(std::min(density, 1.0) * static_cast<double>(chunk)), 1, chunk);
}
}  // namespace

std::int64_t SparseConfig::k() const { return values_per_chunk(density, chunk); }
double SparseConfig::contribution_density() const { return shared_density > 0 ? shared_density : density; }
std::int64_t SparseConfig::shared_k() const { return values_per_chunk(contribution_density(), chunk); }
double SparseConfig::shared_kept(int nodes) const {
  if (local_shared == "whole") return 1.0;
  return local_shared == "mean" ? 1.0 / std::max(nodes, 1) : 0.0;
}
int SparseConfig::bits_of_averages() const { return average_bits > 0 ? average_bits : bits; }
std::int64_t SparseConfig::average_k(int nodes) const {
  return values_per_chunk(average_density > 0 ? average_density : contribution_density() * std::max(nodes, 1), chunk);
}

const char* qk_norm_name(QkNorm norm) {
  switch (norm) {
    case QkNorm::None: return "none";
    case QkNorm::Full: return "full";
    case QkNorm::PerHead: return "per_head";
  }
  return "?";
}

std::string Config::where(const std::string& key) const { return config_detail::describe_key(source, key_lines, key); }

bool Config::owns_all_experts() const {
  return train.owned_experts.empty() ||
         static_cast<std::int64_t>(train.owned_experts.size()) == model.n_experts;
}

std::vector<int> Config::owned_expert_list() const {
  std::vector<int> owned = train.owned_experts;
  if (owned.empty())
    for (int e = 0; e < model.n_experts; ++e) owned.push_back(e);
  std::sort(owned.begin(), owned.end());
  return owned;
}

namespace {

void read_run(MapReader r, RunConfig& c) {
  r.get("name", c.name);
  r.get("seed", c.seed);
  r.get("node_id", c.node_id);
  r.get("out_dir", c.out_dir);
  r.get("log_level", c.log_level);
  r.get("threads", c.threads);
  r.finish();
  if (c.node_id < 0) r.fail("node_id", "must be >= 0");
  if (c.threads < 0) r.fail("threads", "must be >= 0 (0 = all cores)");
  if (c.name.empty()) r.fail("name", "must not be empty");
  static const std::set<std::string> levels = {"trace", "debug", "info", "warn", "error"};
  if (!levels.count(c.log_level))
    r.fail("log_level", "must be one of trace, debug, info, warn, error");
}

void read_model(MapReader r, ModelConfig& c) {
  r.get("vocab_size", c.vocab_size);
  r.get("d_model", c.d_model);
  r.get("n_layers", c.n_layers);
  r.get("n_heads", c.n_heads);
  r.get("n_kv_heads", c.n_kv_heads);
  r.get("d_ff", c.d_ff);
  r.get("n_experts", c.n_experts);
  r.get("top_k", c.top_k);
  r.get("norm_topk_prob", c.norm_topk_prob);
  std::string qk = qk_norm_name(c.qk_norm);
  r.get("qk_norm", qk);
  r.get("rope_theta", c.rope_theta);
  r.get("rms_eps", c.rms_eps);
  r.get("init_std", c.init_std);
  r.get("max_seq_len", c.max_seq_len);
  r.finish();

  if (qk == "none") c.qk_norm = QkNorm::None;
  else if (qk == "full") c.qk_norm = QkNorm::Full;
  else if (qk == "per_head") c.qk_norm = QkNorm::PerHead;
  else r.fail("qk_norm", fmt::format("must be none, full or per_head, got '{}'", qk));

  auto require_positive = [&r](const char* key, std::int64_t value) {
    if (!r.has(key)) r.fail(key, "is required");
    if (value <= 0) r.fail(key, fmt::format("must be positive, got {}", value));
  };
  require_positive("vocab_size", c.vocab_size);
  require_positive("d_model", c.d_model);
  require_positive("n_layers", c.n_layers);
  require_positive("n_heads", c.n_heads);
  require_positive("d_ff", c.d_ff);
  if (c.d_model % c.n_heads != 0)
    r.fail("n_heads", fmt::format("n_heads ({}) must divide d_model ({})", c.n_heads, c.d_model));
  if (c.head_dim() % 2 != 0)
    r.fail("n_heads", fmt::format("head size d_model/n_heads = {} must be even for RoPE", c.head_dim()));
  if (c.n_kv_heads < 0) r.fail("n_kv_heads", "must be >= 0 (0 = n_heads)");
  if (c.n_heads % c.kv_heads() != 0)
    r.fail("n_kv_heads",
           fmt::format("n_kv_heads ({}) must divide n_heads ({})", c.kv_heads(), c.n_heads));
  if (c.n_experts < 1) r.fail("n_experts", fmt::format("must be >= 1, got {}", c.n_experts));
  if (c.top_k < 1 || c.top_k > c.n_experts)
    r.fail("top_k", fmt::format("top_k ({}) must be between 1 and n_experts ({})", c.top_k, c.n_experts));
  if (c.rope_theta <= 0) r.fail("rope_theta", "must be positive");
  if (c.rms_eps <= 0) r.fail("rms_eps", "must be positive");
  if (c.init_std <= 0) r.fail("init_std", "must be positive");
  if (c.max_seq_len <= 0) r.fail("max_seq_len", "must be positive");
}

void read_loss(MapReader r, LossConfig& c) {
  r.get("z_loss", c.z_loss);
  r.get("load_balance", c.load_balance);
  r.get("router_z_loss", c.router_z_loss);
  r.finish();
  if (c.z_loss < 0) r.fail("z_loss", "must be >= 0");
  if (c.load_balance < 0) r.fail("load_balance", "must be >= 0");
  if (c.router_z_loss < 0) r.fail("router_z_loss", "must be >= 0");
}

void read_data(MapReader r, DataConfig& c) {
  if (r.has("cache_dir"))
    r.fail("cache_dir", "is gone: it held the npm Brown corpus; the 'kjv' corpus is read from the installed "
                        "bible-kjv package, so remove the key");
  r.get("corpus", c.corpus);
  r.get("dir", c.dir);
  r.get("tokenizer", c.tokenizer);
  r.get("tokenizer_type", c.tokenizer_type);
  r.get("val_fraction", c.val_fraction);
  r.get("seq_len", c.seq_len);
  r.finish();
  if (c.corpus.empty()) r.fail("corpus", "must be 'kjv' or a folder of .txt / .jsonl files");
  if (c.corpus == "brown")
    r.fail("corpus", "'brown' came from the npm registry, which spes no longer uses: use 'kjv' (the King James "
                     "Bible from Debian's bible-kjv) or a folder of .txt / .jsonl files");

  if (c.dir.empty()) r.fail("dir", "must name the folder for the tokenizer and token shards");
  if (c.tokenizer_type != "bpe" && c.tokenizer_type != "unigram")
    r.fail("tokenizer_type", fmt::format("must be bpe or unigram, got '{}'", c.tokenizer_type));
  if (!(c.val_fraction > 0 && c.val_fraction < 0.5))
    r.fail("val_fraction", fmt::format("must be in (0, 0.5), got {}", c.val_fraction));
  if (c.seq_len <= 0) r.fail("seq_len", "must be positive");
}

void read_optim(MapReader r, OptimConfig& c) {
  r.get("lr", c.lr);
  r.get("beta1", c.beta1);
  r.get("beta2", c.beta2);
  r.get("eps", c.eps);
  r.get("weight_decay", c.weight_decay);
  r.get("grad_clip", c.grad_clip);
  r.finish();
  if (c.lr <= 0) r.fail("lr", "must be positive");
  if (c.beta1 < 0 || c.beta1 >= 1) r.fail("beta1", "must be in [0, 1)");
  if (c.beta2 < 0 || c.beta2 >= 1) r.fail("beta2", "must be in [0, 1)");
  if (c.eps <= 0) r.fail("eps", "must be positive");
  if (c.weight_decay < 0) r.fail("weight_decay", "must be >= 0");
  if (c.grad_clip < 0) r.fail("grad_clip", "must be >= 0 (0 = off)");
}

void read_schedule(MapReader r, ScheduleConfig& c) {
  r.get("warmup_steps", c.warmup_steps);
  r.get("warmup_start_ratio", c.warmup_start_ratio);
  r.get("min_lr_ratio", c.min_lr_ratio);
  r.finish();
  if (c.warmup_steps < 0) r.fail("warmup_steps", "must be >= 0");
  if (c.warmup_start_ratio < 0 || c.warmup_start_ratio > 1)
    r.fail("warmup_start_ratio", "must be in [0, 1]");
  if (c.min_lr_ratio < 0 || c.min_lr_ratio > 1) r.fail("min_lr_ratio", "must be in [0, 1]");
}

// A list of experts: `all`, or a list of indices and "a-b" ranges.

void read_train(MapReader r, TrainConfig& c, const ModelConfig& model) {
  r.get("steps", c.steps);
  r.get("batch_size", c.batch_size);
  r.get("grad_accum", c.grad_accum);
  r.get("log_every", c.log_every);
  r.get("eval_every", c.eval_every);
  if (r.has("eval_batches"))
    r.fail("eval_batches", "was replaced by train.eval_windows: how many validation windows each evaluation "
                           "reads, the same ones whatever the batch size (eval_batches × batch_size gives the old count)");
  r.get("eval_windows", c.eval_windows);
  c.owned_experts = read_expert_list(r, r.raw("owned_experts"), "owned_experts");
  r.get("device", c.device);
  r.get("precision", c.precision);
  r.get("frozen_dtype", c.frozen_dtype);
  r.finish();
  static const std::regex device_pattern(R"(auto|cpu|cuda(:\d+)?)");
  if (!std::regex_match(c.device, device_pattern))
    r.fail("device", fmt::format("must be auto, cpu, cuda or cuda:N, got '{}'", c.device));
  if (c.precision != "auto" && c.precision != "fp32" && c.precision != "bf16")
    r.fail("precision", fmt::format("must be auto, fp32 or bf16, got '{}'", c.precision));
  if (c.frozen_dtype != "fp32" && c.frozen_dtype != "bf16")
    r.fail("frozen_dtype", fmt::format("must be fp32 or bf16, got '{}'", c.frozen_dtype));
  if (c.steps <= 0) r.fail("steps", "must be positive");
  if (c.batch_size <= 0) r.fail("batch_size", "must be positive");
  if (c.grad_accum <= 0) r.fail("grad_accum", "must be positive");
  if (c.log_every <= 0) r.fail("log_every", "must be positive");
  if (c.eval_every < 0) r.fail("eval_every", "must be >= 0 (0 = only at the end)");
  if (c.eval_windows <= 0) r.fail("eval_windows", "must be positive");
  std::set<int> seen;
  for (int e : c.owned_experts) {
    if (e < 0 || e >= model.n_experts)
      r.fail("owned_experts", fmt::format("expert {} is out of range: the model has experts 0..{}",
                                          e, model.n_experts - 1));
    if (!seen.insert(e).second) r.fail("owned_experts", fmt::format("expert {} is listed twice", e));
  }
}

WireEncoding read_encoding(MapReader& r, const std::string& key, WireEncoding value) {
  std::string name = wire_encoding_name(value);
  r.get(key, name);
  for (auto e : {WireEncoding::Fp32, WireEncoding::Bf16, WireEncoding::Int8Delta, WireEncoding::Sparse})
    if (name == wire_encoding_name(e)) return e;
  r.fail(key, fmt::format("must be fp32, bf16, int8_delta or sparse, got '{}'", name));
}

void read_peers(MapReader& r, SyncConfig& c, const ModelConfig& model, const std::string& source,
                std::map<std::string, int>* lines) {
  YAML::Node list = r.raw("peers");
  if (!list || list.IsNull()) return;
  if (!list.IsSequence()) r.fail("peers", "expected a list of {id, address, experts} mappings");
  for (std::size_t i = 0; i < list.size(); ++i) {
    MapReader item(list[i], fmt::format("sync.peers[{}]", i), source, lines);
    PeerConfig peer;
    if (!item.has("id")) item.fail("id", "is required");
    if (!item.has("address")) item.fail("address", "is required (host:port of its sync service)");
    item.get("id", peer.id);
    item.get("address", peer.address);
    peer.experts = read_expert_list(item, item.raw("experts"), "experts");
    item.finish();
    for (int e : peer.experts)
      if (e < 0 || e >= model.n_experts)
        item.fail("experts", fmt::format("expert {} is out of range: the model has experts 0..{}", e,
                                         model.n_experts - 1));
    if (peer.address.rfind(':') == std::string::npos)
      item.fail("address", fmt::format("'{}' is not host:port", peer.address));
    c.peers.push_back(std::move(peer));
  }
}

// Checks the peer list and fills in contiguous expert ownership when no peer lists experts.
void check_peers(MapReader& r, SyncConfig& c, const ModelConfig& model) {
  const int n = static_cast<int>(c.peers.size());
  std::set<std::string> addresses;
  std::vector<bool> ids(static_cast<std::size_t>(n), false);
  bool any_experts = false, all_experts = true;
  for (const auto& p : c.peers) {
    if (p.id < 0 || p.id >= n)
      r.fail("peers", fmt::format("peer id {} is out of range: ids must be 0..{} (one per peer)", p.id, n - 1));
    if (ids[static_cast<std::size_t>(p.id)]) r.fail("peers", fmt::format("peer id {} is listed twice", p.id));
    ids[static_cast<std::size_t>(p.id)] = true;
    if (!addresses.insert(p.address).second)
      r.fail("peers", fmt::format("address {} is used by two peers", p.address));
    any_experts |= !p.experts.empty();
    all_experts &= !p.experts.empty();
  }
  std::sort(c.peers.begin(), c.peers.end(), [](const PeerConfig& a, const PeerConfig& b) { return a.id < b.id; });
  if (!any_experts) {
    if (model.n_experts % n != 0)
      r.fail("peers", fmt::format("{} experts cannot be split evenly over {} peers: list each peer's experts",
                                  model.n_experts, n));
    const int m = static_cast<int>(model.n_experts) / n;
    for (auto& p : c.peers)
      for (int e = 0; e < m; ++e) p.experts.push_back(p.id * m + e);
    return;
  }
  if (!all_experts) r.fail("peers", "either every peer lists its experts or none does (contiguous split)");
  std::vector<int> owner(static_cast<std::size_t>(model.n_experts), -1);
  for (const auto& p : c.peers)
    for (int e : p.experts) {
      if (owner[e] >= 0)
        r.fail("peers", fmt::format("expert {} is owned by peers {} and {}", e, owner[e], p.id));
      owner[e] = p.id;
    }
  for (int e = 0; e < model.n_experts; ++e)
    if (owner[e] < 0) r.fail("peers", fmt::format("expert {} is owned by no peer", e));
}

void read_sync(MapReader r, SyncConfig& c, const ModelConfig& model, const std::string& source,
               std::map<std::string, int>* lines) {
  r.get("every", c.every);
  read_peers(r, c, model, source, lines);
  r.get("listen", c.listen);
  r.get("run_id", c.run_id);
  read_credentials(r, c);
  MapReader enc = r.section("encoding");
  c.shared_encoding = read_encoding(enc, "shared", c.shared_encoding);
  c.expert_encoding = read_encoding(enc, "experts", c.expert_encoding);
  enc.finish();
  MapReader sparse = r.section("sparse");
  sparse.get("chunk", c.sparse.chunk);
  sparse.get("density", c.sparse.density);
  sparse.get("shared_density", c.sparse.shared_density);
  sparse.get("bits", c.sparse.bits);
  sparse.get("local_experts", c.sparse.local_experts);
  sparse.get("local_shared", c.sparse.local_shared);
  sparse.get("average_density", c.sparse.average_density);
  sparse.get("average_bits", c.sparse.average_bits);
  sparse.get("decay", c.sparse.decay);
  sparse.get("dense_below", c.sparse.dense_below);
  sparse.finish();
  if (c.sparse.chunk < 64 || c.sparse.chunk > 65536) sparse.fail("chunk", "must be between 64 and 65536 values");
  if (!(c.sparse.density > 0 && c.sparse.density <= 1)) sparse.fail("density", "must be in (0, 1]: the share of each chunk sent");
  if (!(c.sparse.shared_density >= 0 && c.sparse.shared_density <= 1))
    sparse.fail("shared_density", "must be in [0, 1]: the share of each chunk of shared contributions sent (0 = density)");
  if (!sparse_bits_supported(c.sparse.bits)) sparse.fail("bits", "must be 2, 4 or 8");
  if (c.sparse.average_bits != 0 && !sparse_bits_supported(c.sparse.average_bits))
    sparse.fail("average_bits", "must be 0 (= bits), 2, 4 or 8");
  if (c.sparse.local_shared != "mean" && c.sparse.local_shared != "whole" && c.sparse.local_shared != "off")
    sparse.fail("local_shared", fmt::format("must be mean, whole or off, got '{}'", c.sparse.local_shared));
  if (!(c.sparse.decay > 0 && c.sparse.decay <= 1))
    sparse.fail("decay", "must be in (0, 1]: the share of each error-feedback buffer a round keeps (1 = all)");
  if (!(c.sparse.average_density >= 0 && c.sparse.average_density <= 1))
    sparse.fail("average_density", "must be in [0, 1]: the share of each averaged chunk sent (0 = density x nodes)");
  if (c.sparse.dense_below < 0)
    sparse.fail("dense_below", "must be 0 (every tensor sparse) or more: tensors of fewer values go as int8 deltas");
  r.get("chunk_bytes", c.chunk_bytes);
  r.get("encode_threads", c.encode_threads);
  r.get("compression", c.compression);
  r.get("compression_level", c.compression_level);
  r.get("round_timeout_s", c.round_timeout_s);
  r.get("deadline_factor", c.deadline_factor);
  r.get("min_round_timeout_s", c.min_round_timeout_s);
  r.get("peer_wait_s", c.peer_wait_s);
  r.get("retry_backoff_s", c.retry_backoff_s);
  r.get("max_rel_change", c.max_rel_change);
  MapReader robust = r.section("robust");
  robust.get("expert_factor", c.robust.expert_factor);
  robust.get("window", c.robust.window);
  robust.get("min_history", c.robust.min_history);
  robust.get("shared", c.robust.shared);
  robust.get("trim", c.robust.trim);
  robust.finish();
  if (c.robust.expert_factor != 0 && !(c.robust.expert_factor > 1))
    robust.fail("expert_factor", "must be 0 (off) or more than 1 (a multiple of the owner's median update)");
  if (c.robust.window < 1 || c.robust.window > 1000) robust.fail("window", "must be between 1 and 1000 rounds");
  if (c.robust.min_history < 1 || c.robust.min_history > c.robust.window)
    robust.fail("min_history", fmt::format("must be between 1 and sync.robust.window ({})", c.robust.window));
  if (c.robust.shared != "mean" && c.robust.shared != "trimmed")
    robust.fail("shared", "must be mean or trimmed, not '" + c.robust.shared + "'");
  if (c.robust.trim < 1) robust.fail("trim", "must be >= 1 (values dropped at each end)");
  r.get("dump_dir", c.dump_dir);
  r.get("overlap", c.overlap);
  r.get("max_delay", c.max_delay);
  r.get("late", c.late);
  r.get("fragments", c.fragments);
  r.finish();
  if (c.every < 0) r.fail("every", "must be >= 0 (0 = no synchronization)");
  if (c.chunk_bytes < 4096 || c.chunk_bytes > (64 << 20)) r.fail("chunk_bytes", "must be between 4096 and 64 MiB");
  if (c.encode_threads < 0 || c.encode_threads > 1024)
    r.fail("encode_threads", "must be between 0 (one per core) and 1024");
  if (c.compression != "zstd" && c.compression != "none")
    r.fail("compression", "must be zstd or none, not '" + c.compression + "'");
  if (c.compression_level < 1 || c.compression_level > 19) r.fail("compression_level", "must be between 1 and 19");
  if (c.round_timeout_s <= 0) r.fail("round_timeout_s", "must be positive");
  if (c.deadline_factor != 0 && !(c.deadline_factor >= 1))
    r.fail("deadline_factor", "must be 0 (a fixed deadline: round_timeout_s) or >= 1 (a multiple of the slowest recent round)");
  if (!(c.min_round_timeout_s > 0)) r.fail("min_round_timeout_s", "must be positive");
  if (c.peer_wait_s < 0) r.fail("peer_wait_s", "must be >= 0");
  if (c.retry_backoff_s < 0) r.fail("retry_backoff_s", "must be >= 0");
  if (c.max_rel_change <= 0) r.fail("max_rel_change", "must be positive");
  if (c.max_delay < -1) r.fail("max_delay", "must be >= 0 (or -1: a quarter of the steps between rounds)");
  if (c.fragments < 1) r.fail("fragments", "must be >= 1 (1 = the whole model every round)");
  if (c.enabled() && c.every % c.fragments != 0)
    r.fail("fragments", fmt::format("must divide sync.every ({}): one fragment is synced every every / fragments steps",
                                    c.every));
  if (c.late != "wait" && c.late != "skip") r.fail("late", "must be wait or skip, not '" + c.late + "'");
  if (c.enabled() && c.delay() >= c.period())
    r.fail("max_delay", c.fragments > 1
                            ? fmt::format("must be less than sync.every / sync.fragments ({}): a round lands before the "
                                          "next one starts", c.period())
                            : fmt::format("must be less than sync.every ({}): a round lands before the next one starts",
                                          c.every));
  if (!c.enabled()) return;
  if (c.peers.empty()) r.fail("peers", "is required when sync.every > 0: list every node of the run");
  check_peers(r, c, model);
  check_credentials(r, c, /*files_exist=*/true);
}

void read_checkpoint(MapReader r, CheckpointConfig& c) {
  r.get("every", c.every);
  r.get("keep", c.keep);
  r.get("dir", c.dir);
  r.get("resume", c.resume);
  r.get("allow_mismatch", c.allow_mismatch);
  r.finish();
  if (c.every < 0) r.fail("every", "must be >= 0 (0 = only on SIGTERM)");
  if (c.keep < 1) r.fail("keep", "must be >= 1");
}

void read_coordinator(MapReader r, CoordinatorClientConfig& c) {
  r.get("address", c.address);
  r.get("heartbeat_s", c.heartbeat_s);
  r.get("wait_s", c.wait_s);
  r.finish();
  if (!c.address.empty() && c.address.rfind(':') == std::string::npos)
    r.fail("address", fmt::format("'{}' is not host:port", c.address));
  if (c.heartbeat_s <= 0) r.fail("heartbeat_s", "must be positive");
  if (c.wait_s < 0) r.fail("wait_s", "must be >= 0");
}

void read_node(MapReader r, NodeConfig& c) {
  r.get("ranks", c.ranks);
  r.get("backend", c.backend);
  r.get("bucket_mb", c.bucket_mb);
  r.get("timeout_s", c.timeout_s);
  r.finish();
  if (c.ranks < 1) r.fail("ranks", fmt::format("must be >= 1 (local processes of this node), got {}", c.ranks));
  if (c.backend != "auto" && c.backend != "nccl" && c.backend != "gloo")
    r.fail("backend", fmt::format("must be auto, nccl or gloo, got '{}'", c.backend));
  if (!(c.bucket_mb > 0)) r.fail("bucket_mb", "must be positive");
  if (!(c.timeout_s > 0)) r.fail("timeout_s", "must be positive");
}

void read_metrics(MapReader r, MetricsConfig& c) {
  r.get("listen", c.listen);
  r.finish();
  if (!c.listen.empty() && c.listen.rfind(':') == std::string::npos)
    r.fail("listen", fmt::format("'{}' is not host:port (e.g. 127.0.0.1:9400; empty = off)", c.listen));
}

void read_merge(MapReader r, MergeConfig& c) {
  r.get("alpha", c.alpha);
  r.get("horizon", c.horizon);
  r.get("every", c.every);
  r.get("top_k", c.top_k);
  r.finish();
  if (c.alpha < 0 || c.alpha >= 1) r.fail("alpha", "must be in [0, 1) (0 = no warm-up)");
  if (c.horizon <= 0) r.fail("horizon", "must be positive");
  if (c.every <= 0) r.fail("every", "must be positive");
  if (c.top_k < 1) r.fail("top_k", "must be >= 1");
}

}  // namespace

Config parse_config(const std::string& yaml_text, const std::string& source_name,
                    const std::vector<std::string>& overrides) {
  YAML::Node root;
  try {
    root = YAML::Load(yaml_text);
  } catch (const YAML::ParserException& e) {
    raise(ErrorKind::Config, "{}:{}: not valid YAML: {}", source_name, e.mark.line + 1, e.msg);
  }
  if (!root || root.IsNull()) root = YAML::Node(YAML::NodeType::Map);
  Config c;
  c.source = source_name;
  for (const auto& o : overrides) {
    config_detail::apply_override(root, o);
    c.key_lines[o.substr(0, o.find('='))] = -1;
  }
  MapReader top(root, "", source_name, &c.key_lines);
  read_run(top.section("run"), c.run);
  if (!top.has("model")) raise(ErrorKind::Config, "{}: the 'model' section is required", source_name);
  read_model(top.section("model"), c.model);
  read_loss(top.section("loss"), c.loss);
  read_data(top.section("data"), c.data);
  read_optim(top.section("optim"), c.optim);
  read_schedule(top.section("schedule"), c.schedule);
  read_train(top.section("train"), c.train, c.model);
  read_sync(top.section("sync"), c.sync, c.model, source_name, &c.key_lines);
  read_merge(top.section("merge"), c.merge);
  read_coordinator(top.section("coordinator"), c.coordinator);
  read_checkpoint(top.section("checkpoint"), c.checkpoint);
  read_node(top.section("node"), c.node);
  read_metrics(top.section("metrics"), c.metrics);
  top.finish();
  if (!c.coordinator.address.empty() && !c.sync.enabled())
    raise(ErrorKind::Config, "{}: a coordinator needs sync (sync.every and sync.peers)", c.where("coordinator.address"));

  if (c.sync.enabled()) {
    auto self = std::find_if(c.sync.peers.begin(), c.sync.peers.end(),
                             [&](const PeerConfig& p) { return p.id == c.run.node_id; });
    if (self == c.sync.peers.end())
      raise(ErrorKind::Config, "{}: run.node_id {} is not among sync.peers", c.where("run.node_id"), c.run.node_id);
    std::vector<int> mine = self->experts;
    std::sort(mine.begin(), mine.end());
    if (c.train.owned_experts.empty()) c.train.owned_experts = mine;
    else if (c.owned_expert_list() != mine)
      raise(ErrorKind::Config, "{}: train.owned_experts differs from the experts sync.peers gives node {}",
            c.where("train.owned_experts"), c.run.node_id);
    if (c.merge.alpha > 0 && c.merge.every % c.sync.every != 0)
      raise(ErrorKind::Config, "{}: merge.every ({}) must be a multiple of sync.every ({}): merges happen at sync rounds",
            c.where("merge.every"), c.merge.every, c.sync.every);
  }

  // The other ranks wait in a collective while rank 0 runs a round: the collective timeout must outlast it.
  if (c.node.ranks > 1 && c.sync.enabled() && c.node.timeout_s <= c.sync.round_timeout_s)
    raise(ErrorKind::Config, "{}: node.timeout_s ({} s) must exceed sync.round_timeout_s ({} s): the node's other "
          "ranks wait in a collective while rank 0 runs a round", c.where("node.timeout_s"), c.node.timeout_s,
          c.sync.round_timeout_s);

  if (c.data.seq_len > c.model.max_seq_len)
    raise(ErrorKind::Config, "{}: data.seq_len ({}) exceeds model.max_seq_len ({})",
          c.where("data.seq_len"), c.data.seq_len, c.model.max_seq_len);
  return c;
}

Config load_config(const std::string& path, const std::vector<std::string>& overrides) {
  if (!std::filesystem::exists(path))
    raise(ErrorKind::Config, "config file '{}' does not exist", path);
  std::string text;
  try {
    text = read_file(path);
  } catch (const Error& e) {
    raise(ErrorKind::Config, "cannot read config file: {}", e.what());
  }
  return parse_config(text, path, overrides);
}

}  // namespace spes
