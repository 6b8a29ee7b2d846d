#include "spes/train/checkpoint.h"

#include <spdlog/spdlog.h>
#include <torch/torch.h>

#include <filesystem>
#include <set>

#include "spes/ckpt/hf.h"
#include "spes/train/host_copy.h"
#include "spes/train/trainer.h"
#include "spes/util/error.h"
#include "spes/util/progress.h"

namespace spes {
namespace fs = std::filesystem;

namespace {

torch::optim::AdamWParamState* adam_state(torch::optim::AdamW& optimizer, const torch::Tensor& p) {
  auto& states = optimizer.state();
  auto it = states.find(p.unsafeGetTensorImpl());
  return it == states.end() ? nullptr : static_cast<torch::optim::AdamWParamState*>(it->second.get());
}

// Views of fp32 host copies of `tensors` (one transfer from a GPU), named; `host` keeps them alive.
std::vector<TensorView> host_views(const std::vector<std::string>& names, const std::vector<torch::Tensor>& tensors,
                                   HostCopy& host) {
  host = copy_to_host(tensors);
  std::vector<TensorView> views;
  for (std::size_t i = 0; i < names.size(); ++i)
    views.push_back({names[i], host.views[i].sizes().vec(), host.views[i].data_ptr<float>()});
  return views;
}

// Whether node `node_id` trained expert `e` in the run the folder comes from (so its moments
// belong to this node's optimizer).
bool owned_before(const ShardInfo& info, int node_id, int e) {
  auto has = [e](const std::vector<int>& list) { return std::find(list.begin(), list.end(), e) != list.end(); };
  if (info.is_node_shard()) return has(info.owned_experts);
  for (const auto& s : info.sources)
    if (s.node_id == node_id) return has(s.owned_experts);
  return false;
}

// The data position this node continues from.
LoaderState loader_for(const ShardInfo& info, int node_id) {
  if (info.is_node_shard()) return info.loader;
  for (const auto& s : info.sources)
    if (s.node_id == node_id) return s.loader;
  if (info.step > 0)
    spdlog::warn("checkpoint: {} has no data position for node {}: its data order starts from the beginning",
                 info.path, node_id);
  return {};
}

}  // namespace

std::string write_shard(Trainer& trainer, std::uint64_t sync_round, const SyncCarry* carry) {
  const Config& c = trainer.config();
  const fs::path dir = c.checkpoint.effective_dir(c.run);
  const std::int64_t step = trainer.step_count();
  const fs::path final_path = dir / fmt::format("step-{:08d}", step);
  if (fs::exists(final_path)) return final_path.string();

  torch::NoGradGuard no_grad;
  ShardInfo info;
  info.step = step;
  info.node_id = c.run.node_id;
  info.sync_round = sync_round;
  info.owned_experts = c.owned_expert_list();
  info.config_fields = resume_fields(c);
  info.loader = trainer.sampler().state();
  const fs::path tokenizer = fs::path(c.data.dir) / "tokenizer.model";
  if (fs::exists(tokenizer)) info.tokenizer = fs::absolute(tokenizer).string();
  if (carry) info.sync_carry = *carry;

  // Weights (frozen bf16 experts included) and moments are written as fp32.
  std::vector<std::string> weight_names, moment_names;
  std::vector<torch::Tensor> weight_tensors, moment_tensors;
  std::map<const void*, std::string> names;
  for (const auto& item : trainer.model()->named_parameters()) {
    weight_names.push_back(item.key());
    weight_tensors.push_back(item.value());
    names[item.value().unsafeGetTensorImpl()] = item.key();
  }
  for (const auto& group : trainer.optimizer().param_groups())
    for (const auto& p : group.params()) {
      auto* st = adam_state(trainer.optimizer(), p);
      if (!st) continue;  // not stepped yet: zero moments
      const std::string& name = names.at(p.unsafeGetTensorImpl());
      moment_names.push_back(name + ".exp_avg");
      moment_tensors.push_back(st->exp_avg());
      moment_names.push_back(name + ".exp_avg_sq");
      moment_tensors.push_back(st->exp_avg_sq());
      info.adam_steps[name] = st->step();
    }
  HostCopy weights_host, moments_host;
  const std::vector<TensorView> weights = host_views(weight_names, weight_tensors, weights_host);
  const std::vector<TensorView> moments = host_views(moment_names, moment_tensors, moments_host);
  // Which gradient buffers exist matters: AdamW steps a parameter with a zeroed buffer (an expert
  // that got no tokens this step) but skips one without. A resumed run must have the same ones.
  for (const auto& item : trainer.model()->named_parameters())
    if (item.value().requires_grad() && item.value().grad().defined()) info.grad_buffers.push_back(item.key());
  write_shard_folder(final_path.string(), info, weights, moments);
  keep_newest_shards(dir.string(), c.checkpoint.keep);
  return final_path.string();
}

bool checkpoint_due(const Trainer& trainer) {
  const auto every = trainer.config().checkpoint.every;
  return every > 0 && trainer.step_count() % every == 0;
}

void checkpoint_if_due(Trainer& trainer, std::uint64_t sync_round, const SyncCarry* carry) {
  if (!checkpoint_due(trainer)) return;
  const std::string path = write_shard(trainer, sync_round, carry);
  spdlog::info("checkpoint: wrote {}", path);
}

void load_shard(Trainer& trainer, const Shard& shard, bool allow_mismatch) {
  const Config& c = trainer.config();
  const ShardInfo& info = shard.info;
  const auto diffs = shard_differences(info, c);
  if (!diffs.empty()) {
    std::string list;
    for (const auto& d : diffs) list += "\n  " + d;
    if (!allow_mismatch)
      raise(ErrorKind::Checkpoint, "shard '{}' was written by another configuration or ownership:{}\nresume anyway "
            "with checkpoint.allow_mismatch: true (or --set checkpoint.allow_mismatch=true)", info.path, list);
    spdlog::warn("checkpoint: resuming from {} although it differs:{}", info.path, list);
  }
  torch::NoGradGuard no_grad;
  std::map<const void*, std::string> names;
  for (const auto& item : trainer.model()->named_parameters()) {
    auto it = shard.model.find(item.key());
    if (it == shard.model.end())
      raise(ErrorKind::Checkpoint, "shard '{}' has no weight '{}'", info.path, item.key());
    if (it->second.shape != item.value().sizes().vec())
      raise(ErrorKind::Checkpoint, "shard '{}': weight '{}' has another shape than the model", info.path, item.key());
    item.value().copy_(torch::from_blob(const_cast<float*>(it->second.values.data()), item.value().sizes()));
    names[item.value().unsafeGetTensorImpl()] = item.key();
  }
  auto& optimizer = trainer.optimizer();
  std::set<int> fresh_experts;
  std::size_t fresh_shared = 0;
  std::set<std::string> restored;
  for (const auto& group : optimizer.param_groups())
    for (const auto& p : group.params()) {
      const std::string& name = names.at(p.unsafeGetTensorImpl());
      void* const key = p.unsafeGetTensorImpl();
      const int expert = expert_index_of(name);
      auto avg = shard.optimizer.find(name + ".exp_avg"), sq = shard.optimizer.find(name + ".exp_avg_sq");
      auto steps = info.adam_steps.find(name);
      const bool ours = expert < 0 || owned_before(info, c.run.node_id, expert);
      if (!ours || avg == shard.optimizer.end() || sq == shard.optimizer.end() || steps == info.adam_steps.end()) {
        optimizer.state().erase(key);
        if (info.step > 0 && expert < 0) ++fresh_shared;
        if (info.step > 0 && expert >= 0) fresh_experts.insert(expert);
        continue;
      }
      auto st = std::make_unique<torch::optim::AdamWParamState>();
      st->step(steps->second);
      auto moment = [&](const std::vector<float>& values) {
        return torch::from_blob(const_cast<float*>(values.data()), p.sizes()).to(p.device(), torch::kFloat32, false, true);
      };
      st->exp_avg(moment(avg->second.values));
      st->exp_avg_sq(moment(sq->second.values));
      optimizer.state()[key] = std::move(st);
      restored.insert(name);
    }
  if (!fresh_experts.empty())
    spdlog::warn("checkpoint: expert(s) {} are newly owned by node {}: their AdamW moments start at zero",
                 format_list(std::vector<int>(fresh_experts.begin(), fresh_experts.end())), c.run.node_id);
  if (fresh_shared > 0)
    spdlog::warn("checkpoint: {} shared tensor(s) have no moments in {}: their AdamW moments start at zero",
                 fresh_shared, info.path);
  const std::set<std::string> buffers(info.grad_buffers.begin(), info.grad_buffers.end());
  for (const auto& item : trainer.model()->named_parameters()) {
    auto& p = item.value();
    if (p.requires_grad() && buffers.count(item.key()) && restored.count(item.key())) p.mutable_grad() = torch::zeros_like(p);
    else p.mutable_grad() = torch::Tensor();
  }
  trainer.set_step(info.step);
  trainer.sampler().restore(loader_for(info, c.run.node_id));
  spdlog::info("checkpoint: resumed from {} at step {} (sync round {}{})", info.path, info.step, info.sync_round,
               info.is_node_shard() ? "" : ", " + info.kind + " folder");
}

std::optional<ShardInfo> resume_from_config(Trainer& trainer) {
  const Config& c = trainer.config();
  const std::string& resume = c.checkpoint.resume;
  if (resume.empty()) return std::nullopt;
  std::optional<Shard> shard;
  if (resume == "auto") {
    const std::string dir = c.checkpoint.effective_dir(c.run);
    remove_abandoned_shards(dir);
    shard = newest_shard(dir);
    if (!shard) {
      spdlog::info("checkpoint: no usable shard in {}: starting from step 0", dir);
      return std::nullopt;
    }
  } else {
    // A folder (ours, or a Hugging Face one), or the name of a shard in the checkpoint folder
    // (e.g. step-00000100).
    const fs::path in_dir = fs::path(c.checkpoint.effective_dir(c.run)) / resume;
    shard = read_model_folder(!fs::exists(resume) && fs::exists(in_dir) ? in_dir.string() : resume);
  }
  load_shard(trainer, *shard, c.checkpoint.allow_mismatch);
  return shard->info;
}

}  // namespace spes
