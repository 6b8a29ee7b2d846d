#include "spes/ckpt/merge.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <map>
#include <set>

#include "spes/util/error.h"
#include "spes/util/progress.h"

namespace spes {
namespace {

// The tensor name a moment belongs to ("x.exp_avg" -> "x").
std::string parameter_of(const std::string& moment) { return moment.substr(0, moment.rfind('.')); }

std::vector<std::pair<std::string, std::string>> without_node_id(const ShardInfo& info) {
  std::vector<std::pair<std::string, std::string>> out;
  for (const auto& f : info.config_fields)
    if (f.first != "run.node_id") out.push_back(f);
  return out;
}

// Mean over the shards' copies, summed in node-id order; `same` tells whether they all agree.
LoadedTensor mean_of(const std::vector<const LoadedTensor*>& copies, bool& same) {
  same = true;
  for (const auto* c : copies) same = same && c->values == copies.front()->values;
  if (same) return *copies.front();
  LoadedTensor out{copies.front()->shape, std::vector<float>(copies.front()->values.size(), 0.0f)};
  for (const auto* c : copies)
    for (std::size_t i = 0; i < out.values.size(); ++i) out.values[i] += c->values[i];
  const float n = static_cast<float>(copies.size());
  for (auto& v : out.values) v /= n;
  return out;
}

const LoadedTensor& tensor_in(const Shard& s, const std::map<std::string, LoadedTensor>& tensors, const std::string& name) {
  auto it = tensors.find(name);
  if (it == tensors.end()) raise(ErrorKind::Checkpoint, "shard '{}' has no tensor '{}'", s.info.path, name);
  return it->second;
}

}  // namespace

Shard merge_shards(std::vector<Shard> shards) {
  if (shards.empty()) raise(ErrorKind::Usage, "ckpt merge: no shards given");
  std::sort(shards.begin(), shards.end(), [](const Shard& a, const Shard& b) { return a.info.node_id < b.info.node_id; });
  const Shard& first = shards.front();
  const auto fields = without_node_id(first.info);
  const ModelConfig model = model_config_of(first.info);
  std::map<int, int> owner;  // expert -> index into shards
  for (std::size_t i = 0; i < shards.size(); ++i) {
    const ShardInfo& s = shards[i].info;
    if (!s.is_node_shard())
      raise(ErrorKind::Checkpoint, "'{}' is a {} folder, not a node's shard: merge takes node shards", s.path, s.kind);
    if (i > 0 && s.node_id == shards[i - 1].info.node_id)
      raise(ErrorKind::Checkpoint, "'{}' and '{}' are both node {}'s", shards[i - 1].info.path, s.path, s.node_id);
    if (s.step != first.info.step || s.sync_round != first.info.sync_round)
      raise(ErrorKind::Checkpoint, "'{}' is at step {} (round {}) but '{}' at step {} (round {}): merge shards of one "
            "step, written at a round boundary", s.path, s.step, s.sync_round, first.info.path, first.info.step,
            first.info.sync_round);
    if (without_node_id(s) != fields)
      raise(ErrorKind::Checkpoint, "'{}' and '{}' come from different configurations (config hash differs)", s.path,
            first.info.path);
    for (int e : s.owned_experts) {
      auto [it, fresh] = owner.emplace(e, static_cast<int>(i));
      if (!fresh)
        raise(ErrorKind::Checkpoint, "expert {} is owned by both '{}' and '{}'", e, shards[it->second].info.path, s.path);
    }
  }
  std::vector<int> missing;
  for (int e = 0; e < model.n_experts; ++e)
    if (!owner.count(e)) missing.push_back(e);
  if (!missing.empty())
    raise(ErrorKind::Checkpoint, "no shard owns expert(s) {}: give the shards of every node of step {}",
          format_list(missing), first.info.step);

  Shard out;
  ShardInfo& info = out.info;
  info.kind = "merged";
  info.step = first.info.step;
  info.node_id = -1;
  info.sync_round = first.info.sync_round;
  for (int e = 0; e < model.n_experts; ++e) info.owned_experts.push_back(e);
  info.config_fields = fields;
  std::set<std::string> buffers;
  for (const auto& s : shards) {
    info.sources.push_back({s.info.node_id, s.info.owned_experts, s.info.loader});
    buffers.insert(s.info.grad_buffers.begin(), s.info.grad_buffers.end());
    if (info.tokenizer.empty()) info.tokenizer = s.info.tokenizer;
  }
  info.grad_buffers.assign(buffers.begin(), buffers.end());

  std::size_t differing = 0;
  for (const auto& [name, t] : first.model) {
    const int e = expert_index_of(name);
    if (e >= 0) {
      const Shard& o = shards[owner.at(e)];
      out.model[name] = tensor_in(o, o.model, name);
      continue;
    }
    std::vector<const LoadedTensor*> copies;
    for (const auto& s : shards) {
      copies.push_back(&tensor_in(s, s.model, name));
      if (copies.back()->shape != t.shape)
        raise(ErrorKind::Checkpoint, "shard '{}': '{}' has another shape than in '{}'", s.info.path, name, first.info.path);
    }
    bool same = true;
    out.model[name] = mean_of(copies, same);
    differing += same ? 0 : 1;
  }
  if (differing > 0)
    spdlog::warn("ckpt merge: {} shared tensor(s) differ between the shards (not written right after a sync round?): "
                 "they are averaged", differing);

  // Moments: an expert's from its owner, shared ones averaged over the nodes that have them.
  std::map<std::string, std::vector<const LoadedTensor*>> shared_moments;
  for (const auto& s : shards)
    for (const auto& [name, t] : s.optimizer) {
      const int e = expert_index_of(name);
      if (e >= 0) {
        if (&shards[owner.at(e)] == &s) out.optimizer[name] = t;
      } else {
        shared_moments[name].push_back(&t);
      }
    }
  for (const auto& [name, copies] : shared_moments) {
    bool same = true;
    out.optimizer[name] = mean_of(copies, same);
  }
  for (const auto& s : shards)
    for (const auto& [name, steps] : s.info.adam_steps) {
      const int e = expert_index_of(name);
      if (e >= 0 ? &shards[owner.at(e)] == &s : !info.adam_steps.count(name)) info.adam_steps[name] = steps;
    }
  for (const auto& [name, t] : out.optimizer)
    if (!info.adam_steps.count(parameter_of(name)))
      raise(ErrorKind::Checkpoint, "moment '{}' has no step count in the shards' manifests", name);
  return out;
}

}  // namespace spes
