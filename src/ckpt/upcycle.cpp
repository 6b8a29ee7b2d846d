#include "spes/ckpt/upcycle.h"

#include <cmath>
#include <filesystem>
#include <random>

#include "spes/ckpt/hf.h"
#include "spes/model/size.h"
#include "spes/util/error.h"

namespace spes {
namespace fs = std::filesystem;

namespace {

double std_of(const std::vector<float>& v) {
  double sum = 0, sq = 0;
  for (float x : v) sum += x;
  const double mean = sum / static_cast<double>(v.size());
  for (float x : v) sq += (x - mean) * (x - mean);
  return std::sqrt(sq / static_cast<double>(v.size()));
}

}  // namespace

Shard read_dense_folder(const std::string& path) {
  if (!fs::exists(fs::path(path) / "manifest.json")) {
    if (fs::exists(fs::path(path) / "config.json")) return import_hf_dense(path);
    raise(ErrorKind::Checkpoint, "'{}' is neither a spes checkpoint folder nor a Hugging Face model folder", path);
  }
  Shard s = read_shard(path);
  const ModelConfig m = model_config_of(s.info);
  if (m.n_experts != 1)
    raise(ErrorKind::Checkpoint, "'{}' has {} experts per layer: upcycle starts from a dense model (model.n_experts: 1)",
          path, m.n_experts);
  return s;
}

Shard upcycle(const Shard& dense, const UpcycleOptions& o) {
  ModelConfig m = model_config_of(dense.info);
  if (m.n_experts != 1) raise(ErrorKind::Usage, "upcycle: '{}' is not dense ({} experts)", dense.info.path, m.n_experts);
  if (o.n_experts < 1 || o.top_k < 1 || o.top_k > o.n_experts)
    raise(ErrorKind::Usage, "upcycle: need 1 <= top-k ({}) <= experts ({})", o.top_k, o.n_experts);
  if (!(o.noise_fraction >= 0 && o.noise_fraction <= 1) || !(o.noise_std >= 0))
    raise(ErrorKind::Usage, "upcycle: noise fraction must be in [0, 1] and noise std >= 0 (got {}, {})",
          o.noise_fraction, o.noise_std);
  if (o.router != "zeros" && o.router != "normal")
    raise(ErrorKind::Usage, "upcycle: router init '{}' is not zeros or normal", o.router);
  m.n_experts = o.n_experts;
  m.top_k = o.top_k;
  m.norm_topk_prob = o.norm_topk_prob;

  Shard out;
  out.info.kind = "upcycled";
  out.info.node_id = -1;
  for (int e = 0; e < m.n_experts; ++e) out.info.owned_experts.push_back(e);
  out.info.config_fields = model_fields(m);
  out.info.tokenizer = dense.info.tokenizer;
  out.info.origin = !dense.info.origin.empty() || dense.info.path.empty() ? dense.info.origin
                                                                         : fs::absolute(dense.info.path).string();
  std::mt19937_64 rng(o.seed);
  std::uniform_real_distribution<double> pick(0.0, 1.0);
  std::normal_distribution<double> noise(0.0, o.noise_std);
  for (const auto& [name, shape] : parameter_shapes(m)) {
    const int e = expert_index_of(name);
    if (e >= 0) {
      const std::string source = name.substr(0, name.find(".experts.") + 9) + "0" + name.substr(name.find('.', name.find(".experts.") + 9));
      LoadedTensor t = dense.model.at(source);
      if (o.noise_std > 0 && o.noise_fraction > 0)
        for (auto& v : t.values)
          if (pick(rng) < o.noise_fraction) v = static_cast<float>(v + noise(rng));
      out.model[name] = std::move(t);
    } else if (name.find(".mlp.gate.weight") != std::string::npos) {
      LoadedTensor t{shape, std::vector<float>(static_cast<std::size_t>(shape[0] * shape[1]), 0.0f)};
      if (o.router == "normal") {
        const std::string layer = name.substr(0, name.find(".mlp."));
        std::normal_distribution<double> init(0.0, std_of(dense.model.at(layer + ".mlp.experts.0.down_proj.weight").values));
        for (auto& v : t.values) v = static_cast<float>(init(rng));
      }
      out.model[name] = std::move(t);
    } else {
      out.model[name] = dense.model.at(name);
    }
  }
  return out;
}

}  // namespace spes
