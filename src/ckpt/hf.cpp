#include "spes/ckpt/hf.h"

#include <spdlog/spdlog.h>
#include <unistd.h>

#include <filesystem>
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

json olmoe_config(const ModelConfig& m) {
  return {{"architectures", {"OlmoeForCausalLM"}},
          {"model_type", "olmoe"},
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
          {"clip_qkv", nullptr},
          {"num_experts_per_tok", m.top_k},
          {"num_experts", m.n_experts},
          {"output_router_logits", false},
          {"router_aux_loss_coef", 0.01},
          {"norm_topk_prob", m.norm_topk_prob},
          {"torch_dtype", "float32"}};
}

json qwen3_moe_config(const ModelConfig& m) {
  return {{"architectures", {"Qwen3MoeForCausalLM"}},
          {"model_type", "qwen3_moe"},
          {"vocab_size", m.vocab_size},
          {"hidden_size", m.d_model},
          {"intermediate_size", m.d_ff},
          {"moe_intermediate_size", m.d_ff},
          {"num_hidden_layers", m.n_layers},
          {"num_attention_heads", m.n_heads},
          {"num_key_value_heads", m.kv_heads()},
          {"head_dim", m.head_dim()},
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
          {"use_sliding_window", false},
          {"sliding_window", nullptr},
          {"max_window_layers", m.n_layers},
          {"decoder_sparse_step", 1},
          {"mlp_only_layers", json::array()},
          {"num_experts_per_tok", m.top_k},
          {"num_experts", m.n_experts},
          {"output_router_logits", false},
          {"router_aux_loss_coef", 0.01},
          {"norm_topk_prob", m.norm_topk_prob},
          {"torch_dtype", "float32"}};
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
  try {
    return config.at(key).get<T>();
  } catch (const json::exception& e) {
    raise(ErrorKind::Checkpoint, "{}: key '{}' has the wrong type ({})", file.string(), key, config.at(key).dump());
  }
}

// A key that must be absent, null or the given value for the model to be ours.
void require(const json& config, const std::string& key, const json& want, const fs::path& file) {
  if (!config.contains(key) || config.at(key).is_null() || config.at(key) == want) return;
  raise(ErrorKind::Checkpoint, "{}: {} = {} is not supported (spes models have {})", file.string(), key,
        config.at(key).dump(), want.dump());
}

ModelConfig model_of_hf_config(const json& c, const fs::path& file) {
  const std::string type = config_value<std::string>(c, "model_type", file);
  if (type != "olmoe" && type != "qwen3_moe")
    raise(ErrorKind::Checkpoint, "{}: model_type '{}' is not an MoE layout spes reads (olmoe, qwen3_moe)",
          file.string(), type);
  ModelConfig m;
  m.vocab_size = config_value<std::int64_t>(c, "vocab_size", file);
  m.d_model = config_value<std::int64_t>(c, "hidden_size", file);
  m.n_layers = config_value<std::int64_t>(c, "num_hidden_layers", file);
  m.n_heads = config_value<std::int64_t>(c, "num_attention_heads", file);
  const auto kv = c.contains("num_key_value_heads") ? config_value<std::int64_t>(c, "num_key_value_heads", file) : m.n_heads;
  m.n_kv_heads = kv == m.n_heads ? 0 : kv;
  m.n_experts = config_value<std::int64_t>(c, "num_experts", file);
  m.top_k = config_value<std::int64_t>(c, "num_experts_per_tok", file);
  m.norm_topk_prob = c.contains("norm_topk_prob") && config_value<bool>(c, "norm_topk_prob", file);
  if (c.contains("rope_theta")) m.rope_theta = config_value<double>(c, "rope_theta", file);
  if (c.contains("rms_norm_eps")) m.rms_eps = config_value<double>(c, "rms_norm_eps", file);
  if (c.contains("initializer_range")) m.init_std = config_value<double>(c, "initializer_range", file);
  if (c.contains("max_position_embeddings")) m.max_seq_len = config_value<std::int64_t>(c, "max_position_embeddings", file);
  require(c, "rope_scaling", nullptr, file);
  require(c, "attention_bias", false, file);
  require(c, "hidden_act", "silu", file);
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
    if (c.contains("head_dim") && !c.at("head_dim").is_null() && m.n_heads > 0 &&
        config_value<std::int64_t>(c, "head_dim", file) != m.d_model / m.n_heads)
      raise(ErrorKind::Checkpoint, "{}: head_dim {} differs from hidden_size / num_attention_heads = {}; spes models "
            "have head_dim = d_model / n_heads", file.string(), c.at("head_dim").dump(), m.d_model / m.n_heads);
  }
  // The same checks a YAML model section gets.
  ShardInfo probe;
  probe.path = file.parent_path().string();
  probe.config_fields = model_fields(m);
  return model_config_of(probe);
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
  const fs::path target(out_dir);
  if (fs::exists(target)) raise(ErrorKind::Io, "'{}' exists already: choose another folder or remove it", out_dir);
  const fs::path parent = target.has_parent_path() ? target.parent_path() : fs::path(".");
  ensure_directory(parent);
  const fs::path tmp = parent / fmt::format(".{}.tmp-{}", target.filename().string(), static_cast<long>(::getpid()));
  std::error_code ec;
  fs::remove_all(tmp, ec);
  ensure_directory(tmp);

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
  rename_durably(tmp, target);
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
  const fs::path file = fs::path(dir) / "config.json";
  if (!fs::exists(file)) raise(ErrorKind::Checkpoint, "'{}' has no config.json: not a Hugging Face model folder", dir);
  json config;
  try {
    config = json::parse(read_file(file));
  } catch (const json::exception& e) {
    raise(ErrorKind::Checkpoint, "{}: not JSON: {}", file.string(), e.what());
  }
  const ModelConfig m = model_of_hf_config(config, file);
  auto tensors = read_hf_tensors(dir);
  Shard out;
  ShardInfo& info = out.info;
  info.kind = "imported";
  info.node_id = -1;
  for (int e = 0; e < m.n_experts; ++e) info.owned_experts.push_back(e);
  info.config_fields = model_fields(m);
  info.origin = fs::absolute(dir).string();
  if (fs::exists(fs::path(dir) / "tokenizer.model")) info.tokenizer = fs::absolute(fs::path(dir) / "tokenizer.model").string();
  info.path = dir;
  const bool tied = config.contains("tie_word_embeddings") && config.at("tie_word_embeddings") == true;
  for (const auto& [name, shape] : parameter_shapes(m)) {
    auto it = tensors.find(hf_name(name));
    if (it == tensors.end() && name == "lm_head.weight" && tied) it = tensors.find(hf_name("embed_tokens.weight"));
    if (it == tensors.end()) raise(ErrorKind::Checkpoint, "'{}' has no tensor '{}'", dir, hf_name(name));
    if (it->second.shape != shape)
      raise(ErrorKind::Checkpoint, "'{}': tensor '{}' has shape [{}], config.json implies [{}]", dir, hf_name(name),
            fmt::join(it->second.shape, ", "), fmt::join(shape, ", "));
    out.model[name] = it->second;
  }
  std::size_t unused = 0;
  std::string example;
  for (const auto& [name, t] : tensors) {
    const bool known = name.rfind(kHfPrefix, 0) == 0 ? out.model.count(name.substr(6)) > 0 : out.model.count(name) > 0;
    if (!known && name.find("rotary_emb.inv_freq") == std::string::npos) {
      ++unused;
      if (example.empty()) example = name;
    }
  }
  if (unused > 0)
    raise(ErrorKind::Checkpoint, "'{}' holds {} tensor(s) the {} layout does not have, e.g. '{}'", dir, unused,
          config.at("model_type").get<std::string>(), example);
  for (const auto& [name, t] : out.model) info.bytes += static_cast<std::int64_t>(t.values.size() * sizeof(float));
  return out;
}

Shard read_model_folder(const std::string& path) {
  if (fs::exists(fs::path(path) / "manifest.json")) return read_shard(path);
  if (fs::exists(fs::path(path) / "config.json")) return import_hf(path);
  raise(ErrorKind::Checkpoint, "'{}' is neither a spes checkpoint folder (manifest.json) nor a Hugging Face model "
        "folder (config.json)", path);
}

}  // namespace spes
