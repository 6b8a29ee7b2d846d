// Checkpoint folders without torch: merging node shards, Hugging Face export and import,
// upcycling, and reading 16-bit safetensors.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>

#include "spes/ckpt/hf.h"
#include "spes/ckpt/merge.h"
#include "spes/ckpt/upcycle.h"
#include "spes/model/size.h"
#include "spes/util/error.h"
#include "spes/util/fs.h"
#include "test_paths.h"

namespace spes {
namespace {
namespace fs = std::filesystem;

struct Scratch : test::ScratchDir {
  Scratch() : test::ScratchDir("ckpt-tools") {}
};

ModelConfig small_model(QkNorm qk = QkNorm::Full, std::int64_t experts = 4) {
  ModelConfig m;
  m.vocab_size = 32;
  m.d_model = 8;
  m.n_layers = 2;
  m.n_heads = 2;
  m.d_ff = 6;
  m.n_experts = experts;
  m.top_k = experts > 1 ? 2 : 1;
  m.qk_norm = qk;
  m.max_seq_len = 16;
  return m;
}

LoadedTensor random_tensor(const std::vector<std::int64_t>& shape, std::mt19937& rng) {
  std::int64_t n = 1;
  for (auto d : shape) n *= d;
  std::normal_distribution<float> normal(0.0f, 1.0f);
  LoadedTensor t{shape, std::vector<float>(static_cast<std::size_t>(n))};
  for (auto& v : t.values) v = normal(rng);
  return t;
}

// A node's shard with random weights: shared tensors from `shared_seed` (equal across nodes
// after a round), experts and moments from the node's own seed.
Shard node_shard(const ModelConfig& m, int node, std::vector<int> owned, unsigned shared_seed = 1) {
  Config c;
  c.model = m;
  c.run.node_id = node;
  c.train.owned_experts = owned;
  Shard s;
  s.info.path = "node" + std::to_string(node);
  s.info.step = 30;
  s.info.node_id = node;
  s.info.sync_round = 3;
  s.info.owned_experts = owned;
  s.info.config_fields = resume_fields(c);
  s.info.loader = {0, static_cast<std::uint64_t>(100 + node)};
  std::mt19937 shared_rng(shared_seed), own_rng(1000 + node);
  for (const auto& [name, shape] : parameter_shapes(m)) {
    const int e = expert_index_of(name);
    s.model[name] = random_tensor(shape, e < 0 ? shared_rng : own_rng);
    const bool trained = e < 0 || std::find(owned.begin(), owned.end(), e) != owned.end();
    if (!trained) continue;
    s.optimizer[name + ".exp_avg"] = random_tensor(shape, own_rng);
    s.optimizer[name + ".exp_avg_sq"] = random_tensor(shape, own_rng);
    s.info.adam_steps[name] = 30;
  }
  return s;
}

// Found by fuzz_checkpoint_manifest: a tensor entry without its crc32 (or with a field of the
// wrong type) escaped read_shard as a JSON exception instead of a Checkpoint error.
TEST(CkptShard, ManifestTensorEntriesOfTheWrongFormAreCheckpointErrors) {
  Scratch dir;
  fs::create_directories(dir.path);
  const std::string folder = (dir.path / "step-00000030").string();
  write_shard_folder(folder, node_shard(small_model(), 0, {0, 1}));
  const std::string manifest = read_file(fs::path(folder) / "manifest.json");
  for (const auto& [from, to] : std::vector<std::pair<std::string, std::string>>{{"\"crc32\"", "\"crc\""},
                                                                                 {"\"file\": \"", "\"file\": 7, \"x\": \""}}) {
    std::string broken = manifest;
    broken.replace(broken.find(from), from.size(), to);
    write_file_atomic(fs::path(folder) / "manifest.json", broken);
    try {
      read_shard(folder);
      ADD_FAILURE() << "accepted a manifest with " << to;
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::Checkpoint);
      EXPECT_NE(std::string(e.what()).find("lists its tensors wrongly"), std::string::npos) << e.what();
    }
  }
}

TEST(CkptMerge, ExpertsComeFromTheirOwners) {
  const ModelConfig m = small_model();
  const Shard a = node_shard(m, 0, {0, 1}), b = node_shard(m, 1, {2, 3});
  const Shard merged = merge_shards({b, a});  // any order
  EXPECT_EQ(merged.info.kind, "merged");
  EXPECT_EQ(merged.info.step, 30);
  EXPECT_EQ(merged.info.sync_round, 3u);
  EXPECT_EQ(merged.info.owned_experts, (std::vector<int>{0, 1, 2, 3}));
  ASSERT_EQ(merged.info.sources.size(), 2u);
  EXPECT_EQ(merged.info.sources[1].node_id, 1);
  EXPECT_EQ(merged.info.sources[1].owned_experts, (std::vector<int>{2, 3}));
  EXPECT_EQ(merged.info.sources[1].loader.cursor, 101u);
  for (const auto& [name, t] : merged.model) {
    const int e = expert_index_of(name);
    const Shard& owner = e < 0 || e < 2 ? a : b;
    EXPECT_EQ(t.values, owner.model.at(name).values) << name;
  }
  // Expert moments from the owner; shared moments are the nodes' mean.
  const std::string expert3 = "layers.1.mlp.experts.3.up_proj.weight.exp_avg";
  EXPECT_EQ(merged.optimizer.at(expert3).values, b.optimizer.at(expert3).values);
  const std::string shared = "layers.0.self_attn.q_proj.weight.exp_avg";
  for (std::size_t i = 0; i < 5; ++i)
    EXPECT_FLOAT_EQ(merged.optimizer.at(shared).values[i],
                    (a.optimizer.at(shared).values[i] + b.optimizer.at(shared).values[i]) / 2);
  EXPECT_EQ(merged.info.adam_steps.at("layers.1.mlp.experts.3.up_proj.weight"), 30);
  // The manifest records the run without a node id, so it fits any node.
  for (const auto& f : merged.info.config_fields) EXPECT_NE(f.first, "run.node_id");

  Scratch dir;
  write_shard_folder((dir.path / "merged").string(), merged);
  const Shard back = read_shard((dir.path / "merged").string());
  EXPECT_EQ(back.info.kind, "merged");
  EXPECT_EQ(back.info.sources.size(), 2u);
  EXPECT_EQ(back.model.at("lm_head.weight").values, merged.model.at("lm_head.weight").values);
  EXPECT_THROW(write_shard_folder((dir.path / "merged").string(), merged), Error);  // never overwritten
}

TEST(CkptMerge, DifferingSharedTensorsAreAveraged) {
  const ModelConfig m = small_model();
  const Shard a = node_shard(m, 0, {0, 1}, 1), b = node_shard(m, 1, {2, 3}, 2);
  const Shard merged = merge_shards({a, b});
  const auto& x = merged.model.at("norm.weight").values;
  for (std::size_t i = 0; i < x.size(); ++i)
    EXPECT_FLOAT_EQ(x[i], (a.model.at("norm.weight").values[i] + b.model.at("norm.weight").values[i]) / 2);
}

TEST(CkptMerge, RefusesShardsThatDoNotFit) {
  const ModelConfig m = small_model();
  auto message = [](std::vector<Shard> shards) {
    try {
      merge_shards(std::move(shards));
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message({node_shard(m, 0, {0, 1})}).find("no shard owns expert(s) 2,3"), std::string::npos);
  EXPECT_NE(message({node_shard(m, 0, {0, 1, 2}), node_shard(m, 1, {2, 3})}).find("expert 2 is owned by both"),
            std::string::npos);
  Shard late = node_shard(m, 1, {2, 3});
  late.info.step = 40;
  EXPECT_NE(message({node_shard(m, 0, {0, 1}), late}).find("at step 40"), std::string::npos);
  Shard other = node_shard(m, 1, {2, 3});
  other.info.config_fields.back().second = "99";
  EXPECT_NE(message({node_shard(m, 0, {0, 1}), other}).find("different configurations"), std::string::npos);
  EXPECT_NE(message({node_shard(m, 0, {0, 1}), node_shard(m, 0, {2, 3})}).find("both node 0's"), std::string::npos);
}

nlohmann::json read_json(const fs::path& p) { return nlohmann::json::parse(read_file(p)); }

TEST(CkptHf, ExportImportRoundTripIsBitExact) {
  for (QkNorm qk : {QkNorm::Full, QkNorm::PerHead}) {
    Scratch dir;
    ModelConfig m = small_model(qk);
    m.n_kv_heads = 1;  // grouped-query attention too
    m.norm_topk_prob = qk == QkNorm::PerHead;
    const Shard merged = merge_shards({node_shard(m, 0, {0, 1}), node_shard(m, 1, {2, 3})});
    const auto report = export_hf(merged, (dir.path / "hf").string(), "");
    EXPECT_EQ(report.tensors, parameter_shapes(m).size());
    const auto config = read_json(dir.path / "hf" / "config.json");
    EXPECT_EQ(config["model_type"], qk == QkNorm::Full ? "olmoe" : "qwen3_moe");
    EXPECT_EQ(config["num_experts"], 4);
    EXPECT_EQ(config["num_experts_per_tok"], 2);
    EXPECT_EQ(config["num_key_value_heads"], 1);
    EXPECT_EQ(config["norm_topk_prob"], m.norm_topk_prob);
    EXPECT_EQ(config["tie_word_embeddings"], false);
    // The standard names, with the "model." prefix.
    const auto raw = read_safetensors((dir.path / "hf" / "model.safetensors").string());
    EXPECT_TRUE(raw.count("model.layers.1.mlp.experts.3.down_proj.weight"));
    EXPECT_TRUE(raw.count("model.layers.0.self_attn.k_norm.weight"));
    EXPECT_TRUE(raw.count("model.embed_tokens.weight"));
    EXPECT_TRUE(raw.count("lm_head.weight"));

    const Shard back = import_hf((dir.path / "hf").string());
    EXPECT_EQ(back.info.kind, "imported");
    EXPECT_EQ(back.info.config_fields, model_fields(m));
    ASSERT_EQ(back.model.size(), merged.model.size());
    for (const auto& [name, t] : merged.model) {
      ASSERT_TRUE(back.model.count(name)) << name;
      EXPECT_EQ(back.model.at(name).values, t.values) << name;
      EXPECT_EQ(back.model.at(name).shape, t.shape) << name;
    }
    EXPECT_THROW(export_hf(merged, (dir.path / "hf").string(), ""), Error);  // exists
  }
}

TEST(CkptHf, RefusesWhatTheLayoutCannotHold) {
  Scratch dir;
  const ModelConfig m = small_model(QkNorm::None);
  const Shard merged = merge_shards({node_shard(m, 0, {0, 1, 2, 3})});
  EXPECT_THROW(export_hf(merged, (dir.path / "none").string(), ""), Error);
  EXPECT_FALSE(fs::exists(dir.path / "none"));

  const Shard ok = merge_shards({node_shard(small_model(), 0, {0, 1, 2, 3})});
  export_hf(ok, (dir.path / "hf").string(), "");
  auto edit = [&](const char* key, nlohmann::json value) {
    auto c = read_json(dir.path / "hf" / "config.json");
    const auto saved = c;
    c[key] = value;
    write_file_atomic(dir.path / "hf" / "config.json", c.dump());
    std::string msg = "no error";
    try {
      import_hf((dir.path / "hf").string());
    } catch (const Error& e) {
      msg = e.what();
    }
    write_file_atomic(dir.path / "hf" / "config.json", saved.dump());
    return msg;
  };
  EXPECT_NE(edit("model_type", "llama").find("model_type 'llama'"), std::string::npos);
  EXPECT_NE(edit("rope_scaling", {{"type", "linear"}}).find("rope_scaling"), std::string::npos);
  EXPECT_NE(edit("num_experts", 5).find("'model.layers.0.mlp.gate.weight' has shape [4, 8], config.json implies [5, 8]"),
            std::string::npos);
  EXPECT_NE(edit("hidden_size", 12).find("has shape"), std::string::npos);
  EXPECT_NE(edit("num_attention_heads", 3).find("must divide"), std::string::npos);
  EXPECT_EQ(edit("rope_theta", 10000.0), "no error");
  EXPECT_THROW(import_hf(dir.path.string()), Error);  // no config.json
}

// Writes one little-endian 16-bit tensor file by hand, as PyTorch would.
void write_16bit(const fs::path& path, const std::string& dtype, const std::vector<std::uint16_t>& values) {
  nlohmann::json header{{"x", {{"dtype", dtype}, {"shape", {values.size()}}, {"data_offsets", {0, 2 * values.size()}}}}};
  std::string text = header.dump();
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((text.size() >> (8 * i)) & 0xff);
  out += text;
  for (auto v : values) {
    out.push_back(static_cast<char>(v & 0xff));
    out.push_back(static_cast<char>(v >> 8));
  }
  write_file_atomic(path, out);
}

TEST(Safetensors, ReadsBf16AndF16Exactly) {
  Scratch dir;
  fs::create_directories(dir.path);
  write_16bit(dir.path / "bf16.safetensors", "BF16", {0x3f80, 0xc000, 0x3e80, 0x0000});  // 1, -2, 0.25, 0
  write_16bit(dir.path / "f16.safetensors", "F16", {0x3c00, 0xc000, 0x3400, 0x0001, 0x7bff});
  EXPECT_EQ(read_safetensors((dir.path / "bf16.safetensors").string()).at("x").values,
            (std::vector<float>{1.0f, -2.0f, 0.25f, 0.0f}));
  const auto f16 = read_safetensors((dir.path / "f16.safetensors").string()).at("x").values;
  EXPECT_EQ(f16, (std::vector<float>{1.0f, -2.0f, 0.25f, std::ldexp(1.0f, -24), 65504.0f}));
  write_16bit(dir.path / "i16.safetensors", "I16", {1});
  EXPECT_THROW(read_safetensors((dir.path / "i16.safetensors").string()), Error);
}

// Found by fuzz_safetensors: a header that is JSON but not an object escaped as a JSON exception;
// a shape whose product overflows could pass the offset check.
TEST(Safetensors, MalformedHeadersAreCheckpointErrors) {
  Scratch dir;
  fs::create_directories(dir.path);
  auto file_with_header = [&](const std::string& name, const std::string& json, std::size_t data_bytes) {
    std::string out(8, '\0');
    for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((json.size() >> (8 * i)) & 0xff);
    out += json + std::string(data_bytes, '\0');
    write_file_atomic(dir.path / name, out);
    return (dir.path / name).string();
  };
  auto message = [](const std::string& path) -> std::string {
    try {
      read_safetensors(path);
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::Checkpoint);
      return e.what();
    }
    return "";
  };
  EXPECT_NE(message(file_with_header("array", "[1, 2]", 0)).find("header is not a JSON object"), std::string::npos);
  EXPECT_NE(message(file_with_header("number", "48", 0)).find("header is not a JSON object"), std::string::npos);
  // 2^32 x 2^32 x 4 bytes wraps to 0 in 64 bits.
  const std::string huge = R"({"x": {"dtype": "F32", "shape": [4294967296, 4294967296], "data_offsets": [0, 0]}})";
  EXPECT_NE(message(file_with_header("huge", huge, 0)).find("impossible shape"), std::string::npos);
  const std::string negative = R"({"x": {"dtype": "F32", "shape": [-1, -4], "data_offsets": [0, 16]}})";
  EXPECT_NE(message(file_with_header("negative", negative, 16)).find("impossible shape"), std::string::npos);
}

TEST(CkptUpcycle, CopiesTheDenseModelIntoEveryExpert) {
  const ModelConfig dense_model = small_model(QkNorm::Full, 1);
  const Shard dense = merge_shards({node_shard(dense_model, 0, {0})});
  UpcycleOptions o;
  o.n_experts = 4;
  o.top_k = 2;
  o.noise_std = 0;
  o.router = "zeros";
  const Shard moe = upcycle(dense, o);
  EXPECT_EQ(moe.info.kind, "upcycled");
  EXPECT_EQ(moe.info.step, 0);
  EXPECT_TRUE(moe.optimizer.empty());
  const ModelConfig m = model_config_of(moe.info);
  EXPECT_EQ(m.n_experts, 4);
  EXPECT_TRUE(m.norm_topk_prob);
  EXPECT_EQ(moe.model.size(), parameter_shapes(m).size());
  for (int e = 0; e < 4; ++e)
    EXPECT_EQ(moe.model.at("layers.1.mlp.experts." + std::to_string(e) + ".down_proj.weight").values,
              dense.model.at("layers.1.mlp.experts.0.down_proj.weight").values);
  EXPECT_EQ(moe.model.at("layers.0.self_attn.q_proj.weight").values, dense.model.at("layers.0.self_attn.q_proj.weight").values);
  for (float v : moe.model.at("layers.0.mlp.gate.weight").values) EXPECT_EQ(v, 0.0f);
}

TEST(CkptUpcycle, NoiseTouchesTheConfiguredShareOfEntries) {
  ModelConfig dense_model = small_model(QkNorm::Full, 1);
  dense_model.d_model = 32;
  dense_model.d_ff = 64;
  const Shard dense = merge_shards({node_shard(dense_model, 0, {0})});
  UpcycleOptions o;
  o.n_experts = 4;
  o.noise_fraction = 0.5;
  o.noise_std = 0.02;
  o.router = "normal";
  const Shard a = upcycle(dense, o), b = upcycle(dense, o);
  const auto& base = dense.model.at("layers.0.mlp.experts.0.gate_proj.weight").values;
  const auto& e0 = a.model.at("layers.0.mlp.experts.0.gate_proj.weight").values;
  const auto& e1 = a.model.at("layers.0.mlp.experts.1.gate_proj.weight").values;
  std::size_t changed = 0;
  double sq = 0;
  for (std::size_t i = 0; i < base.size(); ++i)
    if (e0[i] != base[i]) {
      ++changed;
      sq += (e0[i] - base[i]) * (e0[i] - base[i]);
    }
  const double share = static_cast<double>(changed) / static_cast<double>(base.size());  // 2048 entries
  EXPECT_GT(share, 0.45);
  EXPECT_LT(share, 0.55);
  EXPECT_NEAR(std::sqrt(sq / static_cast<double>(changed)), 0.02, 0.002);
  EXPECT_NE(e0, e1);  // experts differ from one another
  EXPECT_EQ(e0, b.model.at("layers.0.mlp.experts.0.gate_proj.weight").values);  // same seed, same model
  // The router: normal with the std of the dense down projection (1 here).
  const auto& router = a.model.at("layers.1.mlp.gate.weight").values;
  double r2 = 0;
  for (float v : router) r2 += v * v;
  EXPECT_NEAR(std::sqrt(r2 / static_cast<double>(router.size())), 1.0, 0.2);
  o.top_k = 5;
  EXPECT_THROW(upcycle(dense, o), Error);
  EXPECT_THROW(upcycle(a, UpcycleOptions{}), Error);  // not dense
}

// A Hugging Face Llama folder (the names and config keys transformers writes) upcycles.
TEST(CkptUpcycle, ReadsAHuggingFaceLlamaFolder) {
  Scratch dir;
  fs::create_directories(dir.path / "llama");
  const ModelConfig m = small_model(QkNorm::None, 1);
  nlohmann::json config{{"model_type", "llama"}, {"vocab_size", m.vocab_size}, {"hidden_size", m.d_model},
                        {"num_hidden_layers", m.n_layers}, {"num_attention_heads", m.n_heads},
                        {"num_key_value_heads", m.n_heads}, {"intermediate_size", m.d_ff},
                        {"rms_norm_eps", 1e-5}, {"rope_theta", 500000.0}, {"max_position_embeddings", 16},
                        {"tie_word_embeddings", true}, {"hidden_act", "silu"}, {"attention_bias", false}};
  write_file_atomic(dir.path / "llama" / "config.json", config.dump());
  std::mt19937 rng(3);
  std::vector<std::pair<std::string, LoadedTensor>> tensors;
  for (const auto& [name, shape] : parameter_shapes(m)) {
    if (name.find("mlp.gate.weight") != std::string::npos || name == "lm_head.weight") continue;
    std::string hf = "model." + name;
    const auto at = hf.find(".experts.0");
    if (at != std::string::npos) hf.erase(at, 10);
    tensors.emplace_back(hf, random_tensor(shape, rng));
  }
  std::vector<TensorView> views;
  for (const auto& [name, t] : tensors) views.push_back({name, t.shape, t.values.data()});
  write_safetensors((dir.path / "llama" / "model.safetensors").string(), views);

  const Shard dense = read_dense_folder((dir.path / "llama").string());
  const ModelConfig dm = model_config_of(dense.info);
  EXPECT_EQ(dm.qk_norm, QkNorm::None);
  EXPECT_EQ(dm.rope_theta, 500000.0);
  EXPECT_EQ(dm.rms_eps, 1e-5);
  EXPECT_EQ(dense.model.at("lm_head.weight").values, dense.model.at("embed_tokens.weight").values);  // tied
  const Shard moe = upcycle(dense, UpcycleOptions{});
  EXPECT_EQ(moe.model.at("layers.1.mlp.experts.7.up_proj.weight").shape, (std::vector<std::int64_t>{m.d_ff, m.d_model}));

  config["attention_bias"] = true;
  write_file_atomic(dir.path / "llama" / "config.json", config.dump());
  EXPECT_THROW(read_dense_folder((dir.path / "llama").string()), Error);
}

}  // namespace
}  // namespace spes
