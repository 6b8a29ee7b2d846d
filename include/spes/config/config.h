// The training configuration: plain structs with defaults, one per YAML section.
//
// A YAML file maps one-to-one onto Config: `run:`, `model:`, `loss:`, `data:`, `optim:`,
// `schedule:`, `train:`. Every field's default is written here. load_config() rejects
// unknown keys, wrong types and impossible values with a message naming file, key and line.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace spes {

enum class QkNorm { None, Full, PerHead };
const char* qk_norm_name(QkNorm norm);

struct RunConfig {
  std::string name = "run";        // used in log lines and file names
  std::uint64_t seed = 6198;       // model init and data order; data order adds 1000 * node_id
  int node_id = 0;                 // which node of a SPES cluster this is (0 for a single node)
  std::string out_dir = "runs/run";  // metrics.jsonl, train.log, checkpoints go here
  std::string log_level = "info";
  int threads = 1;                 // libtorch intra-op threads; 0 = one per core (BLAS has its own pool)
};

struct ModelConfig {
  std::int64_t vocab_size = 0;     // required
  std::int64_t d_model = 0;        // required
  std::int64_t n_layers = 0;       // required
  std::int64_t n_heads = 0;        // required; must divide d_model
  std::int64_t n_kv_heads = 0;     // 0 = n_heads (no GQA); must divide n_heads
  std::int64_t d_ff = 0;           // required; hidden size F of one expert
  std::int64_t n_experts = 1;      // experts per layer
  std::int64_t top_k = 1;          // experts per token
  bool norm_topk_prob = false;     // renormalize the top-k weights to sum to 1 (9B style)
  QkNorm qk_norm = QkNorm::Full;   // none | full (over the whole q / k vector) | per_head
  double rope_theta = 10000.0;
  double rms_eps = 1e-6;
  double init_std = 0.02;          // truncated normal, cut at 3 std
  std::int64_t max_seq_len = 2048;

  std::int64_t kv_heads() const { return n_kv_heads == 0 ? n_heads : n_kv_heads; }
  std::int64_t head_dim() const { return d_model / n_heads; }
};

struct LossConfig {
  double z_loss = 1e-5;          // weight of mean(logsumexp(output logits)^2)
  double load_balance = 0.01;    // weight of the Switch-style load-balance loss, summed over layers
  double router_z_loss = 0.001;  // weight of mean(logsumexp(router logits)^2), summed over layers
};

struct DataConfig {
  std::string corpus = "kjv";         // "kjv" (Debian's bible-kjv) or a folder of .txt / .jsonl
  std::string dir = "data/kjv";     // tokenizer.model, train.bin, val.bin
  std::string tokenizer;              // existing SentencePiece .model; empty = train one
  std::string tokenizer_type = "bpe"; // SentencePiece model type: bpe | unigram
  double val_fraction = 0.02;         // share of documents held out for validation
  std::int64_t seq_len = 256;         // tokens per training window
};

struct OptimConfig {
  double lr = 5e-4;
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;
  double weight_decay = 0.1;     // decoupled (AdamW); applied to matrices only, never to norm scales
  double grad_clip = 1.0;        // global L2 norm; 0 = off
};

struct ScheduleConfig {
  std::int64_t warmup_steps = 2000;
  double warmup_start_ratio = 0.1;  // warm-up starts at this fraction of lr
  double min_lr_ratio = 0.1;        // cosine decays to this fraction of lr at train.steps
};

struct TrainConfig {
  std::int64_t steps = 1000;
  std::int64_t batch_size = 8;       // sequences per micro-batch
  std::int64_t grad_accum = 1;       // micro-batches per optimizer step
  std::int64_t log_every = 10;
  std::int64_t eval_every = 100;     // 0 = only at the end
  std::int64_t eval_windows = 64;    // validation windows (data.seq_len tokens each) per evaluation:
                                     // the first ones of val.bin, the same whatever the batch size
  std::vector<int> owned_experts;    // expert indices (same in every layer) this node trains; empty = all
  std::string device = "auto";       // auto (first CUDA GPU if any, else cpu) | cpu | cuda | cuda:N
  std::string precision = "auto";    // auto (bf16 on CUDA, fp32 on CPU) | fp32 | bf16 (CUDA autocast,
                                     // fp32 master weights and AdamW moments)
  std::string frozen_dtype = "fp32"; // fp32 | bf16: storage of the experts this node does not train
};

// How tensor values travel between nodes (see spes/sync/codec.h).
enum class WireEncoding { Fp32, Bf16, Int8Delta, Sparse };
const char* wire_encoding_name(WireEncoding encoding);
// int8_delta and sparse: sent as a difference against the last synced weights (a baseline).
bool is_delta_encoding(WireEncoding encoding);

// The sparse encoding (sync.sparse, docs/protocol.md): per chunk of `chunk` values, the
// round(density x chunk) largest deltas, quantized to `bits` bits. The rest is not lost: it waits
// in the sender's error-feedback buffer and goes out in later rounds. Meanwhile the node's own
// weights can hold it too (docs/quality.md, "Sparse payloads": far better than training on from
// the synced weights alone): an owner's experts its whole remainder (`local_experts`); the
// shared parameters all of the node's own remainder ("whole"), 1/nodes of it as the average
// would weigh it ("mean") or none ("off"). The others hold the synced weights either way.
struct SparseConfig {
  std::int64_t chunk = 4096;
  double density = 0.02;
  // The shared parameters' contributions: their own share of each chunk; 0 = density. At 1 (the
  // default) every value goes, at `bits` bits with a least-squares scale per chunk and no positions
  // on the wire: docs/quality.md, "Sparse payloads" (+0.42/+0.49% over fp32 against +0.77/+0.93%
  // with the shared part at 2% too; +2.60/-0.42% against +6.1% at 300 steps).
  double shared_density = 1;
  int bits = 2;
  bool local_experts = true;
  std::string local_shared = "whole";
  // The averaged slices an aggregator publishes: the share of each chunk it sends. 0 = density x
  // nodes (at most 1): room for every position its contributors sent, so that little of the
  // average waits in its buffer (docs/quality.md: 300 steps, +6.9% against +11.2% over fp32 at
  // the same density as the contributions).
  double average_density = 0;
  // Bits per value of the averaged slices (2, 4 or 8); 0 = `bits`. Every node applies the published
  // average, so its quantization error reaches all of them (docs/quality.md, "Sparse payloads").
  int average_bits = 0;
  // Each round the error-feedback buffers are multiplied by `decay` before the new update joins
  // them (SparseLoCo's beta): what waited too long fades instead of arriving all at once. 1 = off.
  double decay = 1;
  // Tensors of fewer values go as int8 deltas instead (router and norms at these model sizes): a
  // top-k of a few hundred values would starve them, and they cost little dense. 0 = none.
  std::int64_t dense_below = 4096;
  std::int64_t k() const;                      // values sent per full chunk of experts (at least 1)
  double contribution_density() const;         // shared_density, or density where it is 0
  std::int64_t shared_k() const;               // the same for a node's shared contributions
  std::int64_t average_k(int nodes) const;     // the same for averaged slices among `nodes`
  double shared_kept(int nodes) const;         // share of a node's shared remainder in its weights
  int bits_of_averages() const;                // average_bits, or bits where it is 0
};

// Robust merging (sync.robust, docs/security.md): bounds on what one peer can do to a merge.
struct RobustConfig {
  // An owner's expert update (|new - current| / |current| over all its experts, divided by the
  // round's mean learning rate over the peak's) is refused when it exceeds expert_factor x the
  // median of its last `window` accepted updates (once it has min_history of them). 0 = off.
  // Catches scaling drift that stays under max_rel_change.
  double expert_factor = 2.5;
  int window = 8;
  int min_history = 3;
  // Shared slices: "mean" of every contribution, or "trimmed": per value, the `trim` largest and
  // smallest contributions dropped before averaging (with at least 2 x trim + 2 contributors).
  std::string shared = "mean";
  int trim = 1;
};

struct PeerConfig {
  int id = 0;
  std::string address;        // host:port of that node's sync service
  std::vector<int> experts;   // experts it owns (same indices in every layer)
};

// The run token and TLS files (or the explicit insecure opt-out), as a node config's `sync:`
// section and a cluster file both write them: what every gRPC call of a run is checked against.
struct Credentials {
  std::string token;                  // run token sent and checked on every call
  std::string token_file;             // ... or read from this file
  bool insecure = false;              // plaintext without TLS: only when said explicitly
  std::string tls_ca, tls_cert, tls_key;  // PEM files: CA, this node's certificate and key
};

struct SyncConfig : Credentials {
  std::int64_t every = 0;             // H: optimizer steps between rounds; 0 = no sync (one node)
  std::vector<PeerConfig> peers;      // every node of the run, this one included
  std::string listen;                 // bind address; empty = this node's peer address
  std::string run_id;                 // empty = run.name; checked on every message
  WireEncoding shared_encoding = WireEncoding::Fp32;
  WireEncoding expert_encoding = WireEncoding::Fp32;
  SparseConfig sparse;                 // when an encoding is sparse
  std::int64_t chunk_bytes = 4 << 20;  // payload bytes per streamed message
  // Threads that encode a round's payloads (top-k, quantization, error feedback); 0 = one per
  // core. The bytes on the wire are the same at any count.
  int encode_threads = 0;
  // Lossless packing of every piece's bytes on top of its encoding: "zstd" (at compression_level,
  // 1..19; a piece that would not shrink goes as it is) or "none".
  std::string compression = "zstd";
  int compression_level = 1;
  int zstd_level() const { return compression == "zstd" ? compression_level : 0; }  // 0 = none
  double round_timeout_s = 600;        // a peer not answering within this is skipped this round
  // Adaptive deadline (docs/protocol.md, "Round deadline"): a round's deadline is deadline_factor ×
  // the slowest recent clean round, at least min_round_timeout_s and at most round_timeout_s
  // (0 = always round_timeout_s).
  double deadline_factor = 4;
  double min_round_timeout_s = 120;
  double peer_wait_s = 30;             // a peer refusing connections is retried this long (start-up skew)
  double retry_backoff_s = 0.2;        // first back-off between those retries, doubled up to 2 s
  // Reject a tensor with |new - current| > this * |current|. Honest updates reach 1.4x on tiny
  // (20-50 steps at lr 3e-3 from a small init; docs/quality.md), so 1.0 refused them.
  double max_rel_change = 4.0;
  RobustConfig robust;
  std::string dump_dir;                // write pre/post-round parameters here (tests, debugging)
  // Overlap (docs/protocol.md, "Overlapped rounds"): a round runs on background threads while
  // training goes on and lands max_delay steps after its snapshot (0 = at once: a blocking round).
  bool overlap = false;
  std::int64_t max_delay = -1;         // tau; -1 = period() / 4
  // Fragments (docs/protocol.md, "Fragments"): the model split into this many parts synced on a
  // staggered schedule, one part every every / fragments steps (each part every `every` steps).
  std::int64_t fragments = 1;
  // A round not done when it is due to land: "wait" for the rest of it (bounded by
  // round_timeout_s), or "skip": its deadline is tau steps of training, peers that miss it are
  // skipped, and training never waits for the network.
  std::string late = "wait";

  bool enabled() const { return every > 0; }
  // Steps between two rounds: every / fragments (each fragment is synced every `every` steps).
  std::int64_t period() const { return fragments > 0 ? every / fragments : every; }
  // The steps after its snapshot at which a round lands (0 without overlap).
  std::int64_t delay() const { return overlap ? (max_delay < 0 ? period() / 4 : max_delay) : 0; }
  std::string effective_run_id(const RunConfig& run) const { return run_id.empty() ? run.name : run_id; }
};

// Expert-merging warm-up (SPES.md): alpha(t) = alpha * (1 - min(t / horizon, 1)).
struct MergeConfig {
  double alpha = 0.01;           // alpha_0; 0 = off
  std::int64_t horizon = 10000;  // T: steps over which alpha decays to 0
  std::int64_t every = 500;      // merge at sync steps that are multiples of this
  int top_k = 4;                 // K most similar experts (at most n_experts - 1 are used)
};

// How a node talks to the coordinator (spes coordinator serve); empty address = static peers only.
struct CoordinatorClientConfig {
  std::string address;      // host:port of the coordinator; same token and TLS files as sync
  double heartbeat_s = 2;   // seconds between heartbeats
  double wait_s = 30;       // how long a round start waits for an unreachable coordinator
};

// Per-node checkpoint shards (docs/checkpoint-format.md).
struct CheckpointConfig {
  std::int64_t every = 0;       // write a shard every this many steps (0 = never; SIGTERM still writes one)
  int keep = 3;                 // complete shards kept; older ones are deleted
  std::string dir;              // empty = run.out_dir/checkpoints
  std::string resume;           // "" = start fresh; "auto" = newest usable shard in dir; a shard folder or its name in dir
  bool allow_mismatch = false;  // resume from a shard whose config or ownership differs
  std::string effective_dir(const RunConfig& run) const { return dir.empty() ? run.out_dir + "/checkpoints" : dir; }
};

// The node's own processes (docs/configuration.md, "Several GPUs per node"): K ranks train the
// same experts data-parallel through c10d; only rank 0 takes part in SPES rounds.
struct NodeConfig {
  int ranks = 1;                 // local ranks (one process per GPU); `spes node --nproc-per-node K`
  std::string backend = "auto";  // auto (nccl on CUDA, gloo on the CPU) | nccl | gloo
  double bucket_mb = 25;         // gradient all-reduce bucket size, MiB
  double timeout_s = 1800;       // a collective not done within this ends the node (a rank died or hangs)
};

// Prometheus metrics of `spes node` (docs/operations.md).
struct MetricsConfig {
  std::string listen;  // host:port for /metrics; empty = off (port 0 = any free port)
};

struct Config {
  RunConfig run;
  ModelConfig model;
  LossConfig loss;
  DataConfig data;
  OptimConfig optim;
  ScheduleConfig schedule;
  TrainConfig train;
  SyncConfig sync;
  MergeConfig merge;
  CoordinatorClientConfig coordinator;
  CheckpointConfig checkpoint;
  NodeConfig node;
  MetricsConfig metrics;

  std::string source;                     // the file it came from
  std::map<std::string, int> key_lines;   // "model.d_model" -> line in `source`

  // "configs/tiny.yaml:12 (model.n_heads)" for messages about a key.
  std::string where(const std::string& key) const;
  // True when this node trains every expert.
  bool owns_all_experts() const;
  // The sorted list of owned experts (all of them when train.owned_experts is empty).
  std::vector<int> owned_expert_list() const;
};

// Reads and validates a YAML file. `overrides` are "section.key=value" strings applied on top
// (value parsed as YAML), as given with `--set` on the command line.
// Throws Error(Config) naming the file, key and line on any problem.
Config load_config(const std::string& path, const std::vector<std::string>& overrides = {});
// Same, from text already in memory; `source_name` is used in messages.
Config parse_config(const std::string& yaml_text, const std::string& source_name,
                    const std::vector<std::string>& overrides = {});

}  // namespace spes
