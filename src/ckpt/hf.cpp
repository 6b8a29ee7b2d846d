#include "spes/ckpt/hf.h"

#include <spdlog/spdlog.h>

#include <filesystem>
#include <functional>
#include <type_traits>
#include <nlohmann/json.hpp>
#include <set>

#include "spes/data/tokenizer.h"
#include "spes/model/size.h"
#include "spes/util/error.h"
#include "spes/util/fs.h"

namespace spes {
namespace fs = std::filesystem;
using json = nlohmann::ordered_json;

namespace {

constexpr const char* kHfPrefix = "model.";

std::string hf_name(const std::string& ours) { return ours == "lm_head.weight" ? ours : kHfPrefix + ours; }

// The keys both MoE layouts write; each adds its own (architecture, QK-norm and expert sizes).
json common_config(const ModelConfig& m, const char* architecture, const char* model_type) {
  return {{"architectures", {architecture}},
          {"model_type", model_type},
          {"vocab_size", m.vocab_size},
          {"hidden_size", m.d_model},
          {"intermediate_size", m.d_ff},
          {"num_hidden_layers", m.n_layers},
          {"num_attention_heads", m.n_heads},
          {"num_key_value_heads", m.kv_heads()},
          {"hidden_act", "silu"},
          {"max_position_embeddings", m.max_seq_len},
          {"initializer_range", m.init_std},
          {"rms_norm_eps", m.rms_eps},
          {"use_cache", true},
          {"tie_word_embeddings", false},
          {"rope_theta", m.rope_theta},
          {"rope_scaling", nullptr},
          {"attention_bias", false},
          {"attention_dropout", 0.0},
          {"num_experts_per_tok", m.top_k},
          {"num_experts", m.n_experts},
          {"output_router_logits", false},
          {"router_aux_loss_coef", 0.01},
          {"norm_topk_prob", m.norm_topk_prob},
          {"torch_dtype", "float32"}};
}

json olmoe_config(const ModelConfig& m) {
  json c = common_config(m, "OlmoeForCausalLM", "olmoe");
  c["clip_qkv"] = nullptr;
  return c;
}

json qwen3_moe_config(const ModelConfig& m) {
  json c = common_config(m, "Qwen3MoeForCausalLM", "qwen3_moe");
  c["moe_intermediate_size"] = m.d_ff;
  c["head_dim"] = m.head_dim();
  c["use_sliding_window"] = false;
  c["sliding_window"] = nullptr;
  c["max_window_layers"] = m.n_layers;
  c["decoder_sparse_step"] = 1;
  c["mlp_only_layers"] = json::array();
  return c;
}

void write_tokenizer(const fs::path& dir, const std::string& tokenizer, const ModelConfig& m, json& config) {
  const Tokenizer tok(tokenizer);  // Error(Data) if it is not a SentencePiece model
  if (tok.vocab_size() > m.vocab_size)
    raise(ErrorKind::Data, "tokenizer '{}' has {} pieces, more than the model's vocabulary of {}", tokenizer,
          tok.vocab_size(), m.vocab_size);
  fs::copy_file(tokenizer, dir / "tokenizer.model");
  // SentencePiece's defaults, which `spes data prepare` keeps: <unk> 0, <s> 1, </s> 2.
  const std::uint32_t eos = tok.eos_id();
  config["bos_token_id"] = 1;
  config["eos_token_id"] = eos;
  const json special{{"bos_token", "<s>"}, {"eos_token", "</s>"}, {"unk_token", "<unk>"}};
  json tok_config{{"tokenizer_class", "LlamaTokenizer"},
                  {"add_bos_token", false},
                  {"add_eos_token", false},
                  {"legacy", true},
                  {"model_max_length", m.max_seq_len},
                  {"clean_up_tokenization_spaces", false}};
  tok_config.update(special);
  write_file_atomic(dir / "tokenizer_config.json", tok_config.dump(2));
  write_file_atomic(dir / "special_tokens_map.json", special.dump(2));
}

template <typename T>
T config_value(const json& config, const std::string& key, const fs::path& file) {
  if (!config.contains(key)) raise(ErrorKind::Checkpoint, "{}: key '{}' is missing", file.string(), key);
  const json& v = config.at(key);
  bool fits = false;
  if constexpr (std::is_same_v<T, bool>) fits = v.is_boolean();
  else if constexpr (std::is_integral_v<T>) fits = v.is_number_integer();
  else if constexpr (std::is_floating_point_v<T>) fits = v.is_number();
  else fits = v.is_string();
  if (!fits) raise(ErrorKind::Checkpoint, "{}: key '{}' has the wrong type ({})", file.string(), key, v.dump());
  return v.get<T>();
}

template <typename T>
T config_value_or(const json& config, const std::string& key, T fallback, const fs::path& file) {
  return config.contains(key) && !config.at(key).is_null() ? config_value<T>(config, key, file) : fallback;
}

// A key that must be absent, null or the given value for the model to be ours.
void require(const json& config, const std::string& key, const json& want, const fs::path& file) {
  if (!config.contains(key) || config.at(key).is_null() || config.at(key) == want) return;
  raise(ErrorKind::Checkpoint, "{}: {} = {} is not supported (spes models have {})", file.string(), key,
        config.at(key).dump(), want.dump());
}

// DIR/config.json, parsed.
json read_config(const std::string& dir, fs::path& file) {
  file = fs::path(dir) / "config.json";
  if (!fs::exists(file)) raise(ErrorKind::Checkpoint, "'{}' has no config.json: not a Hugging Face model folder", dir);
  try {
    return json::parse(read_file(file));
  } catch (const json::exception& e) {
    raise(ErrorKind::Checkpoint, "{}: not JSON: {}", file.string(), e.what());
  }
}

// What every layout spes reads has in common: sizes, heads, RoPE, norms, no biases, SwiGLU.
// The caller sets QK-norm, d_ff and the experts, then `checked` validates the whole.
ModelConfig common_model_config(const json& c, const fs::path& file) {
  ModelConfig m;
  m.vocab_size = config_value<std::int64_t>(c, "vocab_size", file);
  m.d_model = config_value<std::int64_t>(c, "hidden_size", file);
  m.n_layers = config_value<std::int64_t>(c, "num_hidden_layers", file);
  m.n_heads = config_value<std::int64_t>(c, "num_attention_heads", file);
  const auto kv = config_value_or<std::int64_t>(c, "num_key_value_heads", m.n_heads, file);
  m.n_kv_heads = kv == m.n_heads ? 0 : kv;
  m.rope_theta = config_value_or(c, "rope_theta", m.rope_theta, file);
  m.rms_eps = config_value_or(c, "rms_norm_eps", m.rms_eps, file);
  m.init_std = config_value_or(c, "initializer_range", m.init_std, file);
  m.max_seq_len = config_value_or(c, "max_position_embeddings", m.max_seq_len, file);
  require(c, "rope_scaling", nullptr, file);
  require(c, "attention_bias", false, file);
  require(c, "hidden_act", "silu", file);
  if (c.contains("head_dim") && !c.at("head_dim").is_null() && m.n_heads > 0 &&
      config_value<std::int64_t>(c, "head_dim", file) != m.d_model / m.n_heads)
    raise(ErrorKind::Checkpoint, "{}: head_dim {} differs from hidden_size / num_attention_heads = {}; spes models "
          "have head_dim = d_model / n_heads", file.string(), c.at("head_dim").dump(), m.d_model / m.n_heads);
  return m;
}

// The same checks a YAML model section gets.
ModelConfig checked(const ModelConfig& m, const fs::path& file) {
  ShardInfo probe;
  probe.path = file.parent_path().string();
  probe.config_fields = model_fields(m);
  return model_config_of(probe);
}

ModelConfig moe_model_config(const json& c, const fs::path& file) {
  const std::string type = config_value<std::string>(c, "model_type", file);
  if (type != "olmoe" && type != "qwen3_moe")
    raise(ErrorKind::Checkpoint, "{}: model_type '{}' is not an MoE layout spes reads (olmoe, qwen3_moe)",
          file.string(), type);
  ModelConfig m = common_model_config(c, file);
  m.n_experts = config_value<std::int64_t>(c, "num_experts", file);
  m.top_k = config_value<std::int64_t>(c, "num_experts_per_tok", file);
  m.norm_topk_prob = config_value_or(c, "norm_topk_prob", false, file);
  if (type == "olmoe") {
    m.qk_norm = QkNorm::Full;
    m.d_ff = config_value<std::int64_t>(c, "intermediate_size", file);
    require(c, "clip_qkv", nullptr, file);
  } else {
    m.qk_norm = QkNorm::PerHead;
    m.d_ff = config_value<std::int64_t>(c, "moe_intermediate_size", file);
    require(c, "decoder_sparse_step", 1, file);
    require(c, "mlp_only_layers", json::array(), file);
    require(c, "use_sliding_window", false, file);
  }
  return checked(m, file);
}

ModelConfig dense_model_config(const json& c, const fs::path& file) {
  const std::string type = config_value_or<std::string>(c, "model_type", "", file);
  if (type != "llama" && type != "mistral" && type != "qwen3")
    raise(ErrorKind::Checkpoint, "{}: model_type '{}' is not a dense layout spes upcycles (llama, mistral, qwen3)",
          file.string(), type);
  ModelConfig m = common_model_config(c, file);
  m.qk_norm = type == "qwen3" ? QkNorm::PerHead : QkNorm::None;
  m.d_ff = config_value<std::int64_t>(c, "intermediate_size", file);
  require(c, "mlp_bias", false, file);
  // A sliding window no shorter than the context is plain causal attention.
  if (c.contains("sliding_window") && c.at("sliding_window").is_number_integer() &&
      config_value_or(c, "use_sliding_window", true, file) && c.at("sliding_window").get<std::int64_t>() < m.max_seq_len)
    raise(ErrorKind::Checkpoint, "{}: sliding-window attention ({} tokens) is not supported", file.string(),
          c.at("sliding_window").dump());
  return checked(m, file);
}

// A weights-only folder of kind "imported" for model `m` from a Hugging Face folder's tensors:
// each parameter from the tensor `hf_of(name)` names (an empty name: zeros, a dense model's
// router), lm_head from the embedding when the embeddings are tied.
Shard imported(const std::string& dir, const json& config, const ModelConfig& m,
               const std::map<std::string, LoadedTensor>& tensors,
               const std::function<std::string(const std::string&)>& hf_of) {
  Shard out;
  ShardInfo& info = out.info;
  info.path = dir;
  info.kind = "imported";
  info.node_id = -1;
  for (int e = 0; e < m.n_experts; ++e) info.owned_experts.push_back(e);
  info.config_fields = model_fields(m);
  info.origin = fs::absolute(dir).string();
  if (fs::exists(fs::path(dir) / "tokenizer.model")) info.tokenizer = fs::absolute(fs::path(dir) / "tokenizer.model").string();
  const bool tied = config.contains("tie_word_embeddings") && config.at("tie_word_embeddings") == true;
  for (const auto& [name, shape] : parameter_shapes(m)) {
    const std::string hf = hf_of(name);
    if (hf.empty()) {
      std::int64_t n = 1;
      for (auto d : shape) n *= d;
      out.model[name] = {shape, std::vector<float>(static_cast<std::size_t>(n), 0.0f)};
      continue;
    }
    auto it = tensors.find(hf);
    if (it == tensors.end() && name == "lm_head.weight" && tied) it = tensors.find(hf_name("embed_tokens.weight"));
    if (it == tensors.end()) raise(ErrorKind::Checkpoint, "'{}' has no tensor '{}'", dir, hf);
    if (it->second.shape != shape)
      raise(ErrorKind::Checkpoint, "'{}': tensor '{}' has shape [{}], config.json implies [{}]", dir, hf,
            fmt::join(it->second.shape, ", "), fmt::join(shape, ", "));
    out.model[name] = it->second;
    info.bytes += static_cast<std::int64_t>(it->second.values.size() * sizeof(float));
  }
  return out;
}

}  // namespace

HfExportReport export_hf(const Shard& model, const std::string& out_dir, const std::string& tokenizer) {
  const ModelConfig m = model_config_of(model.info);
  HfExportReport report;
  json config;
  if (m.qk_norm == QkNorm::Full) {
    config = olmoe_config(m);
    report.model_type = "olmoe";
  } else if (m.qk_norm == QkNorm::PerHead) {
    config = qwen3_moe_config(m);
    report.model_type = "qwen3_moe";
  } else {
    raise(ErrorKind::Checkpoint, "'{}' has no QK-norm (model.qk_norm: none): neither the OLMoE nor the Qwen3-MoE "
          "layout can hold it", model.info.path);
  }
  if (model.info.is_node_shard() && model.info.owned_experts.size() != static_cast<std::size_t>(m.n_experts))
    spdlog::warn("export: '{}' is node {}'s shard: the experts it does not own are its last synced copies; "
                 "`spes ckpt merge` the shards of all nodes first for the owners' weights", model.info.path,
                 model.info.node_id);
  std::vector<TensorView> views;
  for (const auto& [name, shape] : parameter_shapes(m)) {
    auto it = model.model.find(name);
    if (it == model.model.end()) raise(ErrorKind::Checkpoint, "'{}' has no weight '{}'", model.info.path, name);
    if (it->second.shape != shape)
      raise(ErrorKind::Checkpoint, "'{}': weight '{}' has another shape than its model config says", model.info.path, name);
    views.push_back({hf_name(name), shape, it->second.values.data()});
    report.bytes += static_cast<std::int64_t>(it->second.values.size() * sizeof(float));
  }
  report.tensors = views.size();
  write_folder_atomic(out_dir, [&](const fs::path& tmp) {
    write_safetensors((tmp / "model.safetensors").string(), views);
    if (!tokenizer.empty()) {
      write_tokenizer(tmp, tokenizer, m, config);
      report.tokenizer = true;
    }
    json generation{{"_from_model_config", true}};
    if (config.contains("eos_token_id")) {
      generation["bos_token_id"] = config["bos_token_id"];
      generation["eos_token_id"] = config["eos_token_id"];
    }
    write_file_atomic(tmp / "generation_config.json", generation.dump(2));
    write_file_atomic(tmp / "config.json", config.dump(2));
  });
  return report;
}

std::map<std::string, LoadedTensor> read_hf_tensors(const std::string& dir) {
  const fs::path folder(dir);
  std::vector<std::string> files;
  if (fs::exists(folder / "model.safetensors")) {
    files.push_back("model.safetensors");
  } else if (fs::exists(folder / "model.safetensors.index.json")) {
    const fs::path index = folder / "model.safetensors.index.json";
    std::set<std::string> names;
    try {
      const auto j = nlohmann::json::parse(read_file(index));
      for (const auto& [tensor, file] : j.at("weight_map").items()) names.insert(file.get<std::string>());
    } catch (const nlohmann::json::exception& e) {
      raise(ErrorKind::Checkpoint, "{}: not a safetensors index: {}", index.string(), e.what());
    }
    files.assign(names.begin(), names.end());
  } else {
    raise(ErrorKind::Checkpoint, "'{}' has neither model.safetensors nor model.safetensors.index.json "
          "(PyTorch .bin weights are not read: convert them to safetensors)", dir);
  }
  std::map<std::string, LoadedTensor> out;
  for (const auto& file : files) {
    if (file.find('/') != std::string::npos || file.find("..") != std::string::npos)
      raise(ErrorKind::Checkpoint, "'{}': the index names a file outside the folder: '{}'", dir, file);
    for (auto& [name, t] : read_safetensors((folder / file).string())) out[name] = std::move(t);
  }
  return out;
}

Shard import_hf(const std::string& dir) {
  fs::path file;
  const json config = read_config(dir, file);
  const ModelConfig m = moe_model_config(config, file);
  const auto tensors = read_hf_tensors(dir);
  Shard out = imported(dir, config, m, tensors, hf_name);
  std::size_t unused = 0;
  std::string example;
  for (const auto& [name, t] : tensors) {
    const bool known = out.model.count(name.rfind(kHfPrefix, 0) == 0 ? name.substr(6) : name) > 0;
    if (!known && name.find("rotary_emb.inv_freq") == std::string::npos) {
      ++unused;
      if (example.empty()) example = name;
    }
  }
  if (unused > 0)
    raise(ErrorKind::Checkpoint, "'{}' holds {} tensor(s) the {} layout does not have, e.g. '{}'", dir, unused,
          config.at("model_type").get<std::string>(), example);
  return out;
}

Shard import_hf_dense(const std::string& dir) {
  fs::path file;
  const json config = read_config(dir, file);
  ModelConfig m = dense_model_config(config, file);
  const auto tensors = read_hf_tensors(dir);
  for (const auto& [name, t] : tensors)
    if (name.size() > 5 && name.compare(name.size() - 5, 5, ".bias") == 0)
      raise(ErrorKind::Checkpoint, "'{}' has bias '{}', which spes models do not", dir, name);
  // Our 1-expert form: the dense MLP is expert 0; a dense model has no router.
  return imported(dir, config, m, tensors, [](const std::string& name) -> std::string {
    if (name.find(".mlp.gate.weight") != std::string::npos) return "";
    const auto at = name.find(".experts.0.");
    return at == std::string::npos ? hf_name(name) : hf_name(name.substr(0, at) + "." + name.substr(at + 11));
  });
}

Shard read_model_folder(const std::string& path) {
  if (fs::exists(fs::path(path) / "manifest.json")) return read_shard(path);
  if (fs::exists(fs::path(path) / "config.json")) return import_hf(path);
  raise(ErrorKind::Checkpoint, "'{}' is neither a spes checkpoint folder (manifest.json) nor a Hugging Face model "
        "folder (config.json)", path);
}

}  // namespace spes
