#include "spes/ckpt/upcycle.h"

#include <cmath>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <random>

#include "spes/ckpt/hf.h"
#include "spes/model/size.h"
#include "spes/util/error.h"
#include "spes/util/fs.h"

namespace spes {
namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

std::int64_t get_int(const json& c, const char* key, const fs::path& file) {
  if (!c.contains(key) || !c.at(key).is_number_integer())
    raise(ErrorKind::Checkpoint, "{}: integer key '{}' is missing", file.string(), key);
  return c.at(key).get<std::int64_t>();
}

Shard read_hf_dense(const std::string& dir) {
  const fs::path file = fs::path(dir) / "config.json";
  json c;
  try {
    c = json::parse(read_file(file));
  } catch (const json::exception& e) {
    raise(ErrorKind::Checkpoint, "{}: not JSON: {}", file.string(), e.what());
  }
  const std::string type = c.value("model_type", "");
  ModelConfig m;
  if (type == "llama" || type == "mistral") {
    m.qk_norm = QkNorm::None;
  } else if (type == "qwen3") {
    m.qk_norm = QkNorm::PerHead;
  } else {
    raise(ErrorKind::Checkpoint, "{}: model_type '{}' is not a dense layout spes upcycles (llama, mistral, qwen3)",
          file.string(), type);
  }
  m.vocab_size = get_int(c, "vocab_size", file);
  m.d_model = get_int(c, "hidden_size", file);
  m.n_layers = get_int(c, "num_hidden_layers", file);
  m.n_heads = get_int(c, "num_attention_heads", file);
  const auto kv = c.contains("num_key_value_heads") ? get_int(c, "num_key_value_heads", file) : m.n_heads;
  m.n_kv_heads = kv == m.n_heads ? 0 : kv;
  m.d_ff = get_int(c, "intermediate_size", file);
  m.rope_theta = c.value("rope_theta", m.rope_theta);
  m.rms_eps = c.value("rms_norm_eps", m.rms_eps);
  m.init_std = c.value("initializer_range", m.init_std);
  m.max_seq_len = c.value("max_position_embeddings", m.max_seq_len);
  if (c.contains("head_dim") && !c.at("head_dim").is_null() && c.at("head_dim") != m.d_model / m.n_heads)
    raise(ErrorKind::Checkpoint, "{}: head_dim {} differs from hidden_size / num_attention_heads = {}, which spes "
          "models need", file.string(), c.at("head_dim").dump(), m.d_model / m.n_heads);
  if (c.contains("rope_scaling") && !c.at("rope_scaling").is_null())
    raise(ErrorKind::Checkpoint, "{}: rope_scaling = {} is not supported", file.string(), c.at("rope_scaling").dump());
  // A sliding window no shorter than the context is plain causal attention.
  if (c.contains("sliding_window") && c.at("sliding_window").is_number_integer() && c.value("use_sliding_window", true) &&
      c.at("sliding_window").get<std::int64_t>() < m.max_seq_len)
    raise(ErrorKind::Checkpoint, "{}: sliding-window attention ({} tokens) is not supported", file.string(),
          c.at("sliding_window").dump());
  if (c.value("attention_bias", false) || c.value("mlp_bias", false))
    raise(ErrorKind::Checkpoint, "{}: the model has biases, which spes models do not", file.string());
  if (c.value("hidden_act", "silu") != "silu")
    raise(ErrorKind::Checkpoint, "{}: hidden_act '{}' is not SwiGLU's silu", file.string(), c.value("hidden_act", ""));

  auto tensors = read_hf_tensors(dir);
  for (const auto& [name, t] : tensors)
    if (name.size() > 5 && name.compare(name.size() - 5, 5, ".bias") == 0)
      raise(ErrorKind::Checkpoint, "'{}' has bias '{}', which spes models do not", dir, name);
  const bool tied = c.value("tie_word_embeddings", false);
  Shard out;
  out.info.path = dir;
  out.info.kind = "imported";
  out.info.node_id = -1;
  out.info.owned_experts = {0};
  out.info.config_fields = model_fields(m);
  out.info.origin = fs::absolute(dir).string();
  if (fs::exists(fs::path(dir) / "tokenizer.model")) out.info.tokenizer = fs::absolute(fs::path(dir) / "tokenizer.model").string();
  for (const auto& [name, shape] : parameter_shapes(m)) {
    if (name.find(".mlp.gate.weight") != std::string::npos) {  // a dense model has no router
      out.model[name] = {shape, std::vector<float>(static_cast<std::size_t>(shape[0] * shape[1]), 0.0f)};
      continue;
    }
    std::string hf = name.find(".mlp.experts.0.") != std::string::npos
                         ? "model." + name.substr(0, name.find(".mlp.")) + ".mlp." + name.substr(name.find(".experts.0.") + 11)
                         : (name == "lm_head.weight" ? name : "model." + name);
    auto it = tensors.find(hf);
    if (it == tensors.end() && name == "lm_head.weight" && tied) it = tensors.find("model.embed_tokens.weight");
    if (it == tensors.end()) raise(ErrorKind::Checkpoint, "'{}' has no tensor '{}'", dir, hf);
    if (it->second.shape != shape)
      raise(ErrorKind::Checkpoint, "'{}': tensor '{}' has another shape than config.json implies", dir, hf);
    out.model[name] = it->second;
  }
  return out;
}

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
    if (fs::exists(fs::path(path) / "config.json")) return read_hf_dense(path);
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
