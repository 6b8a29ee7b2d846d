// spes ckpt: what checkpoint folders hold, merging node shards, Hugging Face export and import,
// upcycling a dense model.
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <iterator>

#include "commands.h"
#include "spes/ckpt/hf.h"
#include "spes/ckpt/merge.h"
#include "spes/ckpt/upcycle.h"
#include "spes/util/error.h"
#include "spes/util/progress.h"

namespace spes::cli {
namespace {
namespace fs = std::filesystem;

void print_shard(const Shard& s) {
  const ShardInfo& i = s.info;
  std::printf("%s: verified %s folder (%zu tensors, %s)\n", i.path.c_str(), i.kind.c_str(),
              s.model.size() + s.optimizer.size(), format_bytes(static_cast<double>(i.bytes)).c_str());
  if (i.is_node_shard())
    std::printf("  node %d, step %lld, sync round %llu, data position epoch %llu window %llu\n", i.node_id,
                static_cast<long long>(i.step), static_cast<unsigned long long>(i.sync_round),
                static_cast<unsigned long long>(i.loader.epoch), static_cast<unsigned long long>(i.loader.cursor));
  else
    std::printf("  step %lld, sync round %llu%s%s\n", static_cast<long long>(i.step),
                static_cast<unsigned long long>(i.sync_round), i.origin.empty() ? "" : ", from ", i.origin.c_str());
  for (const auto& src : i.sources)
    std::printf("  from node %d: experts %s, data position epoch %llu window %llu\n", src.node_id,
                format_list(src.owned_experts).c_str(), static_cast<unsigned long long>(src.loader.epoch),
                static_cast<unsigned long long>(src.loader.cursor));
  const ModelConfig m = model_config_of(i);
  std::printf("  model: d_model %lld, %lld layers, %lld experts top-%lld, vocab %lld\n", (long long)m.d_model,
              (long long)m.n_layers, (long long)m.n_experts, (long long)m.top_k, (long long)m.vocab_size);
  std::printf("  owned experts: %s; weights: %zu tensors; AdamW moments: %zu tensors; config hash %s\n",
              format_list(i.owned_experts).c_str(), s.model.size(), s.optimizer.size(), i.config_hash.c_str());
  if (!i.tokenizer.empty()) std::printf("  tokenizer: %s\n", i.tokenizer.c_str());
}

void print_hf_folder(const std::string& path) {
  const Shard s = import_hf(path);
  const ModelConfig m = model_config_of(s.info);
  std::printf("%s: Hugging Face folder, %zu tensors (%s as fp32)\n", path.c_str(), s.model.size(),
              format_bytes(static_cast<double>(s.info.bytes)).c_str());
  std::printf("  model: d_model %lld, %lld layers, %lld heads, d_ff %lld, %lld experts top-%lld%s, qk_norm %s, vocab %lld\n",
              (long long)m.d_model, (long long)m.n_layers, (long long)m.n_heads, (long long)m.d_ff,
              (long long)m.n_experts, (long long)m.top_k, m.norm_topk_prob ? " (renormalized)" : "",
              qk_norm_name(m.qk_norm), (long long)m.vocab_size);
  std::printf("  tokenizer: %s\n", s.info.tokenizer.empty() ? "(none)" : s.info.tokenizer.c_str());
}

void inspect(const std::string& path) {
  if (fs::exists(fs::path(path) / "manifest.json")) return print_shard(read_shard(path));
  if (fs::exists(fs::path(path) / "config.json")) return print_hf_folder(path);
  auto shards = list_shards(path);
  if (shards.empty())
    raise(ErrorKind::Checkpoint, "'{}' is neither a checkpoint folder, a folder of shards nor a Hugging Face folder", path);
  int broken = 0;
  for (const auto& name : shards) {
    try {
      print_shard(read_shard((fs::path(path) / name).string()));
    } catch (const Error& e) {
      std::printf("%s: BROKEN: %s\n", (fs::path(path) / name).c_str(), e.what());
      ++broken;
    }
  }
  if (broken > 0) raise(ErrorKind::Checkpoint, "{} of {} shard(s) in '{}' are broken", broken, shards.size(), path);
}

void add_inspect(CLI::App& ckpt) {
  auto* cmd = ckpt.add_subcommand("inspect", "verify a checkpoint folder (or every shard in a folder, or a Hugging Face "
                                              "folder) and print what it holds");
  auto path = std::make_shared<std::string>();
  cmd->add_option("PATH", *path, "a shard (step-NNNNNNNN), a merged/imported/upcycled folder, a checkpoint folder "
                                  "or a Hugging Face folder")->required();
  cmd->callback([path] { inspect(*path); });
}

// The shard folders to merge: shard folders as given, or checkpoint folders, of which the newest
// step that every one of them holds is taken.
std::vector<std::string> shards_to_merge(const std::vector<std::string>& paths) {
  bool folders = false;
  for (const auto& p : paths) folders = folders || !fs::exists(fs::path(p) / "manifest.json");
  if (!folders) return paths;
  std::vector<std::string> common;
  for (std::size_t i = 0; i < paths.size(); ++i) {
    if (fs::exists(fs::path(paths[i]) / "manifest.json"))
      raise(ErrorKind::Usage, "ckpt merge: give either shard folders or checkpoint folders, not both ('{}')", paths[i]);
    auto names = list_shards(paths[i]);
    if (names.empty()) raise(ErrorKind::Checkpoint, "'{}' holds no checkpoint shards", paths[i]);
    if (i == 0) {
      common = names;
    } else {
      std::vector<std::string> both;
      std::set_intersection(common.begin(), common.end(), names.begin(), names.end(), std::back_inserter(both));
      common = both;
    }
  }
  if (common.empty()) raise(ErrorKind::Checkpoint, "the checkpoint folders have no step in common");
  std::vector<std::string> out;
  for (const auto& p : paths) out.push_back((fs::path(p) / common.back()).string());
  std::printf("merging %s of every node\n", common.back().c_str());
  return out;
}

void add_merge(CLI::App& ckpt) {
  auto* cmd = ckpt.add_subcommand("merge", "assemble the whole model from every node's shard of one step (each "
                                            "expert from its owner)");
  auto shards = std::make_shared<std::vector<std::string>>();
  auto out = std::make_shared<std::string>();
  cmd->add_option("SHARDS", *shards, "the nodes' shard folders of one step, or their checkpoint folders (the newest "
                                      "step they all hold is taken)")->required();
  cmd->add_option("-o,--out", *out, "the merged folder to write (must not exist)")->required();
  cmd->callback([shards, out] {
    std::vector<Shard> read;
    for (const auto& p : shards_to_merge(*shards)) read.push_back(read_shard(p));
    Shard merged = merge_shards(std::move(read));
    write_shard_folder(*out, merged);
    std::printf("merged %zu shard(s) of step %lld (sync round %llu) into %s: %zu weights, %zu moments\n",
                shards->size(), static_cast<long long>(merged.info.step),
                static_cast<unsigned long long>(merged.info.sync_round), out->c_str(), merged.model.size(),
                merged.optimizer.size());
  });
}

void add_export(CLI::App& ckpt) {
  auto* cmd = ckpt.add_subcommand("export", "write a checkpoint folder as a Hugging Face model folder");
  auto path = std::make_shared<std::string>();
  auto out = std::make_shared<std::string>();
  auto format = std::make_shared<std::string>("hf");
  auto tokenizer = std::make_shared<std::string>();
  auto no_tokenizer = std::make_shared<bool>(false);
  cmd->add_option("PATH", *path, "a merged folder (or a shard, imported or upcycled folder)")->required();
  cmd->add_option("DIR", *out, "the folder to write (must not exist)")->required();
  cmd->add_option("--format", *format, "hf: OLMoE layout (qk_norm full) or Qwen3-MoE (qk_norm per_head)")
      ->check(CLI::IsMember({"hf"}));
  cmd->add_option("--tokenizer", *tokenizer, "SentencePiece model to ship (default: the one the run trained with)");
  cmd->add_flag("--no-tokenizer", *no_tokenizer, "write the weights and config only");
  cmd->callback([path, out, tokenizer, no_tokenizer] {
    const Shard model = read_shard(*path);
    std::string tok = *no_tokenizer ? "" : (tokenizer->empty() ? model.info.tokenizer : *tokenizer);
    if (!*no_tokenizer && tok.empty())
      raise(ErrorKind::Usage, "'{}' records no tokenizer: give --tokenizer FILE or --no-tokenizer", *path);
    if (!tok.empty() && !fs::exists(tok))
      raise(ErrorKind::Data, "tokenizer '{}' does not exist: give --tokenizer FILE or --no-tokenizer", tok);
    const HfExportReport r = export_hf(model, *out, tok);
    std::printf("exported %s as %s: %zu tensors, %s of weights, tokenizer %s\n", path->c_str(), r.model_type.c_str(),
                r.tensors, format_bytes(static_cast<double>(r.bytes)).c_str(), r.tokenizer ? tok.c_str() : "(none)");
    std::printf("load with transformers: AutoModelForCausalLM.from_pretrained(\"%s\")\n", out->c_str());
  });
}

void add_import(CLI::App& ckpt) {
  auto* cmd = ckpt.add_subcommand("import", "read a Hugging Face OLMoE or Qwen3-MoE folder into a checkpoint folder");
  auto path = std::make_shared<std::string>();
  auto out = std::make_shared<std::string>();
  cmd->add_option("DIR", *path, "the Hugging Face folder")->required();
  cmd->add_option("-o,--out", *out, "the checkpoint folder to write (must not exist)")->required();
  cmd->callback([path, out] {
    Shard s = import_hf(*path);
    write_shard_folder(*out, s);
    std::printf("imported %s into %s: %zu tensors; resume from it with checkpoint.resume: %s\n", path->c_str(),
                out->c_str(), s.model.size(), out->c_str());
  });
}

void add_upcycle(CLI::App& ckpt) {
  auto* cmd = ckpt.add_subcommand("upcycle", "turn a dense model (1-expert spes folder, or Hugging Face Llama/Mistral/"
                                              "Qwen3 folder) into an MoE");
  auto path = std::make_shared<std::string>();
  auto out = std::make_shared<std::string>();
  auto o = std::make_shared<UpcycleOptions>();
  auto olmoe_style = std::make_shared<bool>(false);
  cmd->add_option("DENSE", *path, "the dense model folder")->required();
  cmd->add_option("-o,--out", *out, "the MoE folder to write (must not exist)")->required();
  cmd->add_option("--experts", o->n_experts, "experts per layer")->capture_default_str();
  cmd->add_option("--top-k", o->top_k, "experts per token")->capture_default_str();
  cmd->add_flag("--no-renormalize", *olmoe_style, "keep the top-k router weights unnormalized (OLMoE style)");
  cmd->add_option("--noise-fraction", o->noise_fraction, "share of each expert's entries that get noise")->capture_default_str();
  cmd->add_option("--noise-std", o->noise_std, "std of that noise")->capture_default_str();
  cmd->add_option("--router", o->router, "router init: zeros or normal (std of the dense down projection)")
      ->check(CLI::IsMember({"zeros", "normal"}))->capture_default_str();
  cmd->add_option("--seed", o->seed, "seed of the noise and the router init")->capture_default_str();
  cmd->callback([path, out, o, olmoe_style] {
    o->norm_topk_prob = !*olmoe_style;
    Shard moe = upcycle(read_dense_folder(*path), *o);
    write_shard_folder(*out, moe);
    std::printf("upcycled %s into %s: %lld experts top-%lld%s, noise %.3g on %.0f%% of entries, router %s\n",
                path->c_str(), out->c_str(), static_cast<long long>(o->n_experts), static_cast<long long>(o->top_k),
                o->norm_topk_prob ? " (renormalized)" : "", o->noise_std, 100 * o->noise_fraction, o->router.c_str());
    std::printf("train it with checkpoint.resume: %s and model.n_experts: %lld, model.top_k: %lld, "
                "model.norm_topk_prob: %s\n", out->c_str(), static_cast<long long>(o->n_experts),
                static_cast<long long>(o->top_k), o->norm_topk_prob ? "true" : "false");
  });
}

}  // namespace

void add_ckpt_commands(CLI::App& app) {
  auto* ckpt = app.add_subcommand("ckpt", "inspect, merge, export, import and upcycle checkpoints");
  ckpt->require_subcommand(1);
  add_inspect(*ckpt);
  add_merge(*ckpt);
  add_export(*ckpt);
  add_import(*ckpt);
  add_upcycle(*ckpt);
}

}  // namespace spes::cli
