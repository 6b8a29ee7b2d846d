#include "spes/train/checkpoint.h"

#include <spdlog/spdlog.h>
#include <torch/torch.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>

#include "spes/train/trainer.h"
#include "spes/util/error.h"
#include "spes/util/progress.h"
#include "spes/util/fs.h"

namespace spes {
namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

constexpr const char* kFormat = "spes-shard-1";
constexpr const char* kModelFile = "model.safetensors";
constexpr const char* kOptimizerFile = "optimizer.safetensors";

std::uint32_t crc_of(const float* data, std::size_t count) {
  return static_cast<std::uint32_t>(
      ::crc32(0L, reinterpret_cast<const Bytef*>(data), static_cast<uInt>(count * sizeof(float))));
}

std::string text(double v) { return fmt::format("{}", v); }
std::string text(std::int64_t v) { return std::to_string(v); }
std::string text(bool v) { return v ? "true" : "false"; }

torch::optim::AdamWParamState* adam_state(torch::optim::AdamW& optimizer, const torch::Tensor& p) {
  auto& states = optimizer.state();
  auto it = states.find(c10::guts::to_string(p.unsafeGetTensorImpl()));
  return it == states.end() ? nullptr : static_cast<torch::optim::AdamWParamState*>(it->second.get());
}

TensorView view_of(const std::string& name, const torch::Tensor& t) {
  return {name, t.sizes().vec(), t.data_ptr<float>()};
}

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

void keep_newest(const fs::path& dir, int keep) {
  auto shards = list_shards(dir.string());
  for (std::size_t i = 0; i + static_cast<std::size_t>(keep) < shards.size(); ++i) {
    std::error_code ec;
    fs::remove_all(dir / shards[i], ec);
    if (ec) spdlog::warn("checkpoint: could not delete old shard {}: {}", (dir / shards[i]).string(), ec.message());
  }
}

}  // namespace

std::vector<std::pair<std::string, std::string>> resume_fields(const Config& c) {
  const auto& m = c.model;
  return {
      {"run.seed", std::to_string(c.run.seed)},
      {"run.node_id", std::to_string(c.run.node_id)},
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
}

std::string config_hash(const Config& config) {
  std::string all;
  for (const auto& [k, v] : resume_fields(config)) all += k + "=" + v + "\n";
  std::uint64_t h = 1469598103934665603ull;  // FNV-1a
  for (unsigned char ch : all) h = (h ^ ch) * 1099511628211ull;
  return fmt::format("{:016x}", h);
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

std::string write_shard(Trainer& trainer, std::uint64_t sync_round) {
  const Config& c = trainer.config();
  const fs::path dir = c.checkpoint.effective_dir(c.run);
  const std::int64_t step = trainer.step_count();
  const fs::path final_path = dir / fmt::format("step-{:08d}", step);
  if (fs::exists(final_path)) return final_path.string();
  ensure_directory(dir);
  const fs::path tmp = dir / fmt::format(".step-{:08d}.tmp-{}", step, static_cast<long>(::getpid()));
  std::error_code ec;
  fs::remove_all(tmp, ec);
  ensure_directory(tmp);

  torch::NoGradGuard no_grad;
  std::vector<TensorView> weights, moments;
  json adam_steps = json::object();
  std::map<const void*, std::string> names;
  for (const auto& item : trainer.model()->named_parameters()) {
    weights.push_back(view_of(item.key(), item.value()));
    names[item.value().unsafeGetTensorImpl()] = item.key();
  }
  for (const auto& group : trainer.optimizer().param_groups())
    for (const auto& p : group.params()) {
      auto* st = adam_state(trainer.optimizer(), p);
      if (!st) continue;  // not stepped yet: zero moments
      const std::string& name = names.at(p.unsafeGetTensorImpl());
      moments.push_back(view_of(name + ".exp_avg", st->exp_avg()));
      moments.push_back(view_of(name + ".exp_avg_sq", st->exp_avg_sq()));
      adam_steps[name] = st->step();
    }
  // Which gradient buffers exist matters: AdamW steps a parameter with a zeroed buffer (an expert
  // that got no tokens this step) but skips one without. A resumed run must have the same ones.
  json with_grad = json::array();
  for (const auto& item : trainer.model()->named_parameters())
    if (item.value().requires_grad() && item.value().grad().defined()) with_grad.push_back(item.key());
  write_safetensors((tmp / kModelFile).string(), weights);
  write_safetensors((tmp / kOptimizerFile).string(), moments);
  json tensors = tensor_entries(weights, kModelFile);
  tensors.update(tensor_entries(moments, kOptimizerFile));
  json fields = json::object();
  for (const auto& [k, v] : resume_fields(c)) fields[k] = v;
  const auto loader = trainer.sampler().state();
  json manifest{{"format", kFormat},
                {"step", step},
                {"node_id", c.run.node_id},
                {"sync_round", sync_round},
                {"owned_experts", c.owned_expert_list()},
                {"config_hash", config_hash(c)},
                {"config", fields},
                {"loader", {{"epoch", loader.epoch}, {"cursor", loader.cursor}}},
                {"adam_steps", adam_steps},
                {"grad_buffers", with_grad},
                {"tensors", tensors}};
  // The manifest last: a folder without one is never taken for a shard.
  write_file_atomic(tmp / "manifest.json", manifest.dump(1));
  rename_durably(tmp, final_path);
  keep_newest(dir, c.checkpoint.keep);
  return final_path.string();
}

void checkpoint_if_due(Trainer& trainer, std::uint64_t sync_round) {
  const auto every = trainer.config().checkpoint.every;
  if (every <= 0 || trainer.step_count() % every != 0) return;
  const std::string path = write_shard(trainer, sync_round);
  spdlog::info("checkpoint: wrote {}", path);
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
    if (m.at("format") != kFormat)
      raise(ErrorKind::Checkpoint, "shard '{}' has format {}, expected {}", path, m.at("format").dump(), kFormat);
    info.step = m.at("step").get<std::int64_t>();
    info.node_id = m.at("node_id").get<int>();
    info.sync_round = m.at("sync_round").get<std::uint64_t>();
    info.owned_experts = m.at("owned_experts").get<std::vector<int>>();
    info.config_hash = m.at("config_hash").get<std::string>();
    for (auto it = m.at("config").begin(); it != m.at("config").end(); ++it)
      info.config_fields.emplace_back(it.key(), it.value().get<std::string>());
    info.loader.epoch = m.at("loader").at("epoch").get<std::uint64_t>();
    info.loader.cursor = m.at("loader").at("cursor").get<std::uint64_t>();
    info.adam_steps = m.at("adam_steps").get<std::map<std::string, std::int64_t>>();
    info.grad_buffers = m.at("grad_buffers").get<std::vector<std::string>>();
  } catch (const json::exception& e) {
    raise(ErrorKind::Checkpoint, "shard '{}': manifest.json is not readable: {}", path, e.what());
  } catch (const Error& e) {
    if (e.kind() == ErrorKind::Checkpoint) throw;
    raise(ErrorKind::Checkpoint, "shard '{}': {}", path, e.what());
  }
  for (const char* file : {kModelFile, kOptimizerFile})
    if (!fs::exists(dir / file)) raise(ErrorKind::Checkpoint, "shard '{}' is missing {}", path, file);
  shard.model = read_safetensors((dir / kModelFile).string());
  shard.optimizer = read_safetensors((dir / kOptimizerFile).string());
  std::size_t listed = 0;
  for (auto it = m.at("tensors").begin(); it != m.at("tensors").end(); ++it, ++listed) {
    const auto& t = it.value();
    const std::string file = t.at("file").get<std::string>();
    auto& tensors = file == kModelFile ? shard.model : shard.optimizer;
    auto found = tensors.find(it.key());
    if (found == tensors.end())
      raise(ErrorKind::Checkpoint, "shard '{}': tensor '{}' listed in the manifest is not in {}", path, it.key(), file);
    if (found->second.shape != t.at("shape").get<std::vector<std::int64_t>>())
      raise(ErrorKind::Checkpoint, "shard '{}': tensor '{}' has another shape than the manifest says", path, it.key());
    if (crc_of(found->second.values.data(), found->second.values.size()) != t.at("crc32").get<std::uint32_t>())
      raise(ErrorKind::Checkpoint, "shard '{}': tensor '{}' fails its checksum (corrupt file {})", path, it.key(), file);
    info.bytes += static_cast<std::int64_t>(found->second.values.size() * sizeof(float));
  }
  if (listed != shard.model.size() + shard.optimizer.size())
    raise(ErrorKind::Checkpoint, "shard '{}': its files hold tensors the manifest does not list", path);
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

std::vector<std::string> shard_differences(const ShardInfo& shard, const Config& config) {
  std::vector<std::string> out;
  std::map<std::string, std::string> theirs(shard.config_fields.begin(), shard.config_fields.end());
  for (const auto& [key, value] : resume_fields(config)) {
    auto it = theirs.find(key);
    const std::string had = it == theirs.end() ? "(absent)" : it->second;
    if (had != value) out.push_back(fmt::format("{}: shard {}, config {}", key, had, value));
  }
  if (shard.owned_experts != config.owned_expert_list())
    out.push_back(fmt::format("owned experts: shard {}, config {}", format_list(shard.owned_experts),
                              format_list(config.owned_expert_list())));
  return out;
}

void load_shard(Trainer& trainer, const Shard& shard, bool allow_mismatch) {
  const Config& c = trainer.config();
  const auto diffs = shard_differences(shard.info, c);
  if (!diffs.empty()) {
    std::string list;
    for (const auto& d : diffs) list += "\n  " + d;
    if (!allow_mismatch)
      raise(ErrorKind::Checkpoint, "shard '{}' was written by another configuration or ownership:{}\nresume anyway "
            "with checkpoint.allow_mismatch: true (or --set checkpoint.allow_mismatch=true)", shard.info.path, list);
    spdlog::warn("checkpoint: resuming from {} although it differs:{}", shard.info.path, list);
  }
  torch::NoGradGuard no_grad;
  std::map<const void*, std::string> names;
  for (const auto& item : trainer.model()->named_parameters()) {
    auto it = shard.model.find(item.key());
    if (it == shard.model.end())
      raise(ErrorKind::Checkpoint, "shard '{}' has no weight '{}'", shard.info.path, item.key());
    if (it->second.shape != item.value().sizes().vec())
      raise(ErrorKind::Checkpoint, "shard '{}': weight '{}' has another shape than the model", shard.info.path, item.key());
    item.value().copy_(torch::from_blob(const_cast<float*>(it->second.values.data()), item.value().sizes()));
    names[item.value().unsafeGetTensorImpl()] = item.key();
  }
  auto& optimizer = trainer.optimizer();
  std::vector<std::string> fresh;
  for (const auto& group : optimizer.param_groups())
    for (const auto& p : group.params()) {
      const std::string& name = names.at(p.unsafeGetTensorImpl());
      const std::string key = c10::guts::to_string(p.unsafeGetTensorImpl());
      auto avg = shard.optimizer.find(name + ".exp_avg"), sq = shard.optimizer.find(name + ".exp_avg_sq");
      auto steps = shard.info.adam_steps.find(name);
      if (avg == shard.optimizer.end() || sq == shard.optimizer.end() || steps == shard.info.adam_steps.end()) {
        optimizer.state().erase(key);
        if (shard.info.step > 0) fresh.push_back(name);
        continue;
      }
      auto st = std::make_unique<torch::optim::AdamWParamState>();
      st->step(steps->second);
      st->exp_avg(torch::from_blob(const_cast<float*>(avg->second.values.data()), p.sizes()).clone());
      st->exp_avg_sq(torch::from_blob(const_cast<float*>(sq->second.values.data()), p.sizes()).clone());
      optimizer.state()[key] = std::move(st);
    }
  if (!fresh.empty())
    spdlog::warn("checkpoint: {} trained tensor(s) have no moments in the shard (newly owned experts): their AdamW "
                 "moments start at zero, e.g. {}", fresh.size(), fresh.front());
  const std::set<std::string> buffers(shard.info.grad_buffers.begin(), shard.info.grad_buffers.end());
  for (const auto& item : trainer.model()->named_parameters()) {
    auto& p = item.value();
    if (p.requires_grad() && buffers.count(item.key())) p.mutable_grad() = torch::zeros_like(p);
    else p.mutable_grad() = torch::Tensor();
  }
  trainer.set_step(shard.info.step);
  trainer.sampler().restore(shard.info.loader);
  spdlog::info("checkpoint: resumed from {} at step {} (sync round {})", shard.info.path, shard.info.step,
               shard.info.sync_round);
}

std::optional<ShardInfo> resume_from_config(Trainer& trainer) {
  const Config& c = trainer.config();
  const std::string& resume = c.checkpoint.resume;
  if (resume.empty()) return std::nullopt;
  std::optional<Shard> shard;
  if (resume == "auto") {
    const std::string dir = c.checkpoint.effective_dir(c.run);
    shard = newest_shard(dir);
    if (!shard) {
      spdlog::info("checkpoint: no usable shard in {}: starting from step 0", dir);
      return std::nullopt;
    }
  } else {
    // A shard folder, or the name of one in the checkpoint folder (e.g. step-00000100).
    const fs::path in_dir = fs::path(c.checkpoint.effective_dir(c.run)) / resume;
    shard = read_shard(!fs::exists(resume) && fs::exists(in_dir) ? in_dir.string() : resume);
  }
  load_shard(trainer, *shard, c.checkpoint.allow_mismatch);
  return shard->info;
}

}  // namespace spes
