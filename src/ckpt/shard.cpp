#include "spes/ckpt/shard.h"

#include <spdlog/spdlog.h>
#include <zlib.h>

#include <algorithm>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <regex>

#include "spes/util/error.h"
#include "spes/util/failpoint.h"
#include "spes/util/fs.h"
#include "spes/util/progress.h"

namespace spes {
namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

constexpr const char* kFormat = "spes-shard-1";
constexpr const char* kModelFile = "model.safetensors";
constexpr const char* kOptimizerFile = "optimizer.safetensors";
constexpr const char* kSyncFile = "sync.safetensors";
constexpr const char* kResidualPrefix = "residual.";

std::uint32_t crc_of(const float* data, std::size_t count) {
  return static_cast<std::uint32_t>(
      ::crc32(0L, reinterpret_cast<const Bytef*>(data), static_cast<uInt>(count * sizeof(float))));
}

std::string text(double v) { return fmt::format("{}", v); }
std::string text(std::int64_t v) { return std::to_string(v); }
std::string text(bool v) { return v ? "true" : "false"; }

json tensor_entries(const std::vector<TensorView>& views, const std::string& file) {
  json out = json::object();
  for (const auto& v : views) {
    std::int64_t n = 1;
    for (auto d : v.shape) n *= d;
    out[v.name] = {{"file", file}, {"shape", v.shape}, {"dtype", "F32"},
                   {"crc32", crc_of(v.data, static_cast<std::size_t>(n))}};
  }
  return out;
}

json loader_json(const LoaderState& s) { return {{"epoch", s.epoch}, {"cursor", s.cursor}}; }
LoaderState loader_of(const json& j) { return {j.at("epoch").get<std::uint64_t>(), j.at("cursor").get<std::uint64_t>()}; }

json manifest_of(const ShardInfo& info) {
  json fields = json::object();
  for (const auto& [k, v] : info.config_fields) fields[k] = v;
  json sources = json::array();
  for (const auto& s : info.sources)
    sources.push_back({{"node_id", s.node_id}, {"owned_experts", s.owned_experts}, {"loader", loader_json(s.loader)}});
  return {{"format", kFormat},
          {"kind", info.kind},
          {"step", info.step},
          {"node_id", info.node_id},
          {"sync_round", info.sync_round},
          {"owned_experts", info.owned_experts},
          {"config_hash", config_hash(info.config_fields)},
          {"config", fields},
          {"loader", loader_json(info.loader)},
          {"adam_steps", info.adam_steps},
          {"grad_buffers", info.grad_buffers},
          {"sources", sources},
          {"tokenizer", info.tokenizer},
          {"origin", info.origin},
          {"sync_carry", info.sync_carry ? json{{"round", info.sync_carry->round},
                                                {"base_slice", info.sync_carry->base_slice},
                                                {"base_experts", info.sync_carry->base_experts}}
                                         : json(nullptr)}};
}

void parse_manifest(const json& m, ShardInfo& info) {
  if (m.at("format") != kFormat)
    raise(ErrorKind::Checkpoint, "format {}, expected {}", m.at("format").dump(), kFormat);
  info.kind = m.value("kind", "node");
  info.step = m.at("step").get<std::int64_t>();
  info.node_id = m.at("node_id").get<int>();
  info.sync_round = m.at("sync_round").get<std::uint64_t>();
  info.owned_experts = m.at("owned_experts").get<std::vector<int>>();
  info.config_hash = m.at("config_hash").get<std::string>();
  for (auto it = m.at("config").begin(); it != m.at("config").end(); ++it)
    info.config_fields.emplace_back(it.key(), it.value().get<std::string>());
  info.loader = loader_of(m.at("loader"));
  info.adam_steps = m.at("adam_steps").get<std::map<std::string, std::int64_t>>();
  info.grad_buffers = m.at("grad_buffers").get<std::vector<std::string>>();
  for (const auto& s : m.value("sources", json::array()))
    info.sources.push_back({s.at("node_id").get<int>(), s.at("owned_experts").get<std::vector<int>>(),
                            loader_of(s.at("loader"))});
  info.tokenizer = m.value("tokenizer", "");
  info.origin = m.value("origin", "");
  if (m.contains("sync_carry") && !m.at("sync_carry").is_null()) {
    const auto& c = m.at("sync_carry");
    info.sync_carry = SyncCarry{c.at("round").get<std::uint64_t>(), c.at("base_slice").get<std::vector<std::uint64_t>>(),
                                c.at("base_experts").get<std::vector<std::uint64_t>>(), {}};
  }
}

std::vector<TensorView> views_of(const std::map<std::string, LoadedTensor>& tensors) {
  std::vector<TensorView> out;
  for (const auto& [name, t] : tensors) out.push_back({name, t.shape, t.values.data()});
  return out;
}

}  // namespace

std::vector<std::pair<std::string, std::string>> model_fields(const ModelConfig& m) {
  return {
      {"model.vocab_size", text(m.vocab_size)},
      {"model.d_model", text(m.d_model)},
      {"model.n_layers", text(m.n_layers)},
      {"model.n_heads", text(m.n_heads)},
      {"model.n_kv_heads", text(m.n_kv_heads)},
      {"model.d_ff", text(m.d_ff)},
      {"model.n_experts", text(m.n_experts)},
      {"model.top_k", text(m.top_k)},
      {"model.norm_topk_prob", text(m.norm_topk_prob)},
      {"model.qk_norm", qk_norm_name(m.qk_norm)},
      {"model.rope_theta", text(m.rope_theta)},
      {"model.rms_eps", text(m.rms_eps)},
      {"model.max_seq_len", text(m.max_seq_len)},
  };
}

std::vector<std::pair<std::string, std::string>> resume_fields(const Config& c) {
  std::vector<std::pair<std::string, std::string>> out{
      {"run.seed", std::to_string(c.run.seed)},
      {"run.node_id", std::to_string(c.run.node_id)},
  };
  for (auto& f : model_fields(c.model)) out.push_back(std::move(f));
  std::vector<std::pair<std::string, std::string>> rest{
      {"loss.z_loss", text(c.loss.z_loss)},
      {"loss.load_balance", text(c.loss.load_balance)},
      {"loss.router_z_loss", text(c.loss.router_z_loss)},
      {"optim.lr", text(c.optim.lr)},
      {"optim.beta1", text(c.optim.beta1)},
      {"optim.beta2", text(c.optim.beta2)},
      {"optim.eps", text(c.optim.eps)},
      {"optim.weight_decay", text(c.optim.weight_decay)},
      {"optim.grad_clip", text(c.optim.grad_clip)},
      {"schedule.warmup_steps", text(c.schedule.warmup_steps)},
      {"schedule.warmup_start_ratio", text(c.schedule.warmup_start_ratio)},
      {"schedule.min_lr_ratio", text(c.schedule.min_lr_ratio)},
      {"data.seq_len", text(c.data.seq_len)},
      {"train.steps", text(c.train.steps)},
      {"train.batch_size", text(c.train.batch_size)},
      {"train.grad_accum", text(c.train.grad_accum)},
      {"sync.every", text(c.sync.every)},
      {"merge.alpha", text(c.merge.alpha)},
      {"merge.horizon", text(c.merge.horizon)},
      {"merge.every", text(c.merge.every)},
      {"merge.top_k", std::to_string(c.merge.top_k)},
  };
  for (auto& f : rest) out.push_back(std::move(f));
  // Rounds map to steps by every / fragments; listed only when split, so that shards written
  // before fragments existed keep their hash.
  if (c.sync.fragments > 1) out.emplace_back("sync.fragments", std::to_string(c.sync.fragments));
  return out;
}

std::string config_hash(const std::vector<std::pair<std::string, std::string>>& fields) {
  std::string all;
  for (const auto& [k, v] : fields) all += k + "=" + v + "\n";
  std::uint64_t h = 1469598103934665603ull;  // FNV-1a
  for (unsigned char ch : all) h = (h ^ ch) * 1099511628211ull;
  return fmt::format("{:016x}", h);
}

std::string config_hash(const Config& config) { return config_hash(resume_fields(config)); }

ModelConfig model_config_of(const ShardInfo& info) {
  std::vector<std::string> overrides;
  for (const auto& [k, v] : info.config_fields) {
    if (k.rfind("model.", 0) == 0) overrides.push_back(k + "=" + v);
    // The default training window may exceed a small model's context; the model alone is read.
    if (k == "model.max_seq_len") overrides.push_back("data.seq_len=" + v);
  }
  if (overrides.empty()) raise(ErrorKind::Checkpoint, "'{}' records no model configuration", info.path);
  return parse_config("", info.path + "/manifest.json", overrides).model;
}

std::vector<std::string> list_shards(const std::string& dir) {
  static const std::regex name("step-[0-9]{8}");
  std::vector<std::string> out;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return out;
  for (const auto& entry : fs::directory_iterator(dir, ec))
    if (entry.is_directory() && std::regex_match(entry.path().filename().string(), name))
      out.push_back(entry.path().filename().string());
  std::sort(out.begin(), out.end());
  return out;
}

void remove_abandoned_shards(const std::string& dir) {
  for (const auto& name : remove_abandoned_temporaries(dir))
    spdlog::warn("checkpoint: removed {}/{}, a shard whose writer was killed before it finished", dir, name);
}

void keep_newest_shards(const std::string& dir, int keep) {
  remove_abandoned_shards(dir);
  auto shards = list_shards(dir);
  for (std::size_t i = 0; i + static_cast<std::size_t>(keep) < shards.size(); ++i) {
    std::error_code ec;
    fs::remove_all(fs::path(dir) / shards[i], ec);
    if (ec) spdlog::warn("checkpoint: could not delete old shard {}: {}", (fs::path(dir) / shards[i]).string(), ec.message());
  }
}

void write_shard_folder(const std::string& final_path, const ShardInfo& info, const std::vector<TensorView>& weights,
                        const std::vector<TensorView>& moments) {
  write_folder_atomic(final_path, [&](const fs::path& tmp) {
    write_safetensors((tmp / kModelFile).string(), weights);
    failpoint("checkpoint");
    write_safetensors((tmp / kOptimizerFile).string(), moments);
    json manifest = manifest_of(info);
    json tensors = tensor_entries(weights, kModelFile);
    tensors.update(tensor_entries(moments, kOptimizerFile));
    if (info.sync_carry) {
      std::vector<TensorView> residuals;
      for (const auto& [key, values] : info.sync_carry->residuals)
        residuals.push_back({kResidualPrefix + key, {static_cast<std::int64_t>(values.size())}, values.data()});
      write_safetensors((tmp / kSyncFile).string(), residuals);
      tensors.update(tensor_entries(residuals, kSyncFile));
    }
    manifest["tensors"] = tensors;
    // The manifest last: a folder without one is never taken for a shard.
    write_file_atomic(tmp / "manifest.json", manifest.dump(1));
  });
}

void write_shard_folder(const std::string& final_path, const Shard& shard) {
  write_shard_folder(final_path, shard.info, views_of(shard.model), views_of(shard.optimizer));
}

Shard read_shard(const std::string& path) {
  const fs::path dir(path);
  const fs::path manifest_path = dir / "manifest.json";
  if (!fs::exists(manifest_path))
    raise(ErrorKind::Checkpoint, "shard '{}' has no manifest.json (incomplete or not a shard)", path);
  Shard shard;
  ShardInfo& info = shard.info;
  info.path = path;
  json m;
  try {
    m = json::parse(read_file(manifest_path));
    parse_manifest(m, info);
  } catch (const json::exception& e) {
    raise(ErrorKind::Checkpoint, "shard '{}': manifest.json is not readable: {}", path, e.what());
  } catch (const Error& e) {
    raise(ErrorKind::Checkpoint, "shard '{}': {}", path, e.what());
  }
  for (const char* file : {kModelFile, kOptimizerFile})
    if (!fs::exists(dir / file)) raise(ErrorKind::Checkpoint, "shard '{}' is missing {}", path, file);
  shard.model = read_safetensors((dir / kModelFile).string());
  shard.optimizer = read_safetensors((dir / kOptimizerFile).string());
  std::map<std::string, LoadedTensor> sync;
  if (info.sync_carry) {
    if (!fs::exists(dir / kSyncFile)) raise(ErrorKind::Checkpoint, "shard '{}' is missing {}", path, kSyncFile);
    sync = read_safetensors((dir / kSyncFile).string());
  }
  std::size_t listed = 0;
  try {  // the manifest's tensor list: a field of the wrong type is a broken shard, like a bad value
    const json& tensor_list = m.at("tensors");
    if (!tensor_list.is_object()) raise(ErrorKind::Checkpoint, "shard '{}': manifest 'tensors' is not an object", path);
    for (auto it = tensor_list.begin(); it != tensor_list.end(); ++it, ++listed) {
      const auto& t = it.value();
      const std::string file = t.at("file").get<std::string>();
      if (file != kModelFile && file != kOptimizerFile && !(file == kSyncFile && info.sync_carry))
        raise(ErrorKind::Checkpoint, "shard '{}': tensor '{}' is in an unknown file '{}'", path, it.key(), file);
      auto& tensors = file == kModelFile ? shard.model : file == kOptimizerFile ? shard.optimizer : sync;
      auto found = tensors.find(it.key());
      if (found == tensors.end())
        raise(ErrorKind::Checkpoint, "shard '{}': tensor '{}' listed in the manifest is not in {}", path, it.key(), file);
      if (found->second.shape != t.at("shape").get<std::vector<std::int64_t>>())
        raise(ErrorKind::Checkpoint, "shard '{}': tensor '{}' has another shape than the manifest says", path, it.key());
      if (crc_of(found->second.values.data(), found->second.values.size()) != t.at("crc32").get<std::uint32_t>())
        raise(ErrorKind::Checkpoint, "shard '{}': tensor '{}' fails its checksum (corrupt file {})", path, it.key(), file);
      info.bytes += static_cast<std::int64_t>(found->second.values.size() * sizeof(float));
    }
  } catch (const json::exception& e) {
    raise(ErrorKind::Checkpoint, "shard '{}': manifest.json lists its tensors wrongly: {}", path, e.what());
  }
  if (listed != shard.model.size() + shard.optimizer.size() + sync.size())
    raise(ErrorKind::Checkpoint, "shard '{}': its files hold tensors the manifest does not list", path);
  for (auto& [name, t] : sync) {
    if (name.rfind(kResidualPrefix, 0) != 0)
      raise(ErrorKind::Checkpoint, "shard '{}': unexpected tensor '{}' in {}", path, name, kSyncFile);
    info.sync_carry->residuals[name.substr(std::string(kResidualPrefix).size())] = std::move(t.values);
  }
  return shard;
}

std::optional<Shard> newest_shard(const std::string& dir) {
  auto shards = list_shards(dir);
  for (auto it = shards.rbegin(); it != shards.rend(); ++it) {
    const std::string path = (fs::path(dir) / *it).string();
    try {
      return read_shard(path);
    } catch (const Error& e) {
      spdlog::warn("checkpoint: skipping {}: {}", path, e.what());
    }
  }
  return std::nullopt;
}

int expert_index_of(const std::string& name) {
  const auto at = name.find(".mlp.experts.");
  return at == std::string::npos ? -1 : std::stoi(name.substr(at + 13));
}

std::vector<std::string> shard_differences(const ShardInfo& shard, const Config& config) {
  std::vector<std::string> out;
  std::map<std::string, std::string> theirs(shard.config_fields.begin(), shard.config_fields.end());
  for (const auto& [key, value] : resume_fields(config)) {
    if (!shard.is_node_shard() && key == "run.node_id") continue;
    auto it = theirs.find(key);
    if (it == theirs.end()) continue;
    if (it->second != value) out.push_back(fmt::format("{}: shard {}, config {}", key, it->second, value));
  }
  if (shard.is_node_shard() && shard.owned_experts != config.owned_expert_list())
    out.push_back(fmt::format("owned experts: shard {}, config {}", format_list(shard.owned_experts),
                              format_list(config.owned_expert_list())));
  return out;
}

}  // namespace spes
