// spes eval and spes generate: a trained (or imported) model on held-out tokens, and text from it.
#include <spdlog/spdlog.h>

#include <chrono>
#include <cstdio>
#include <filesystem>

#include "commands.h"
#include "spes/ckpt/hf.h"
#include "spes/data/tokenizer.h"
#include "spes/train/inference.h"
#include "spes/train/trainer.h"
#include "spes/util/error.h"
#include "spes/util/log.h"

namespace spes::cli {
namespace {
namespace fs = std::filesystem;

struct ModelOptions {
  std::string path;
  int threads = 0;
  std::string log_level = "info";
};

void add_model_options(CLI::App& cmd, ModelOptions& o) {
  cmd.add_option("MODEL", o.path, "a checkpoint folder (shard, merged, imported, upcycled) or a Hugging Face folder")
      ->required();
  cmd.add_option("--threads", o.threads, "libtorch threads (0 = one per core)")->capture_default_str();
  cmd.add_option("--log-level", o.log_level, "trace, debug, info, warn or error");
}

Shard open_model(const ModelOptions& o) {
  init_logging(o.log_level);
  RunConfig run;
  run.threads = o.threads;
  configure_threads(run);
  return read_model_folder(o.path);
}

// The run's training window when the folder records it, else the model's context.
std::int64_t default_seq_len(const ShardInfo& info, const ModelConfig& m) {
  for (const auto& [k, v] : info.config_fields)
    if (k == "data.seq_len") return std::stoll(v);
  return m.max_seq_len;
}

void add_eval(CLI::App& app) {
  auto* cmd = app.add_subcommand("eval", "validation loss and perplexity of a model on a token shard");
  auto o = std::make_shared<ModelOptions>();
  auto data = std::make_shared<std::string>();
  auto seq_len = std::make_shared<std::int64_t>(0);
  auto batch = std::make_shared<std::int64_t>(8);
  auto windows = std::make_shared<std::int64_t>(0);
  add_model_options(*cmd, *o);
  cmd->add_option("--data", *data, "token shard (e.g. data/small/val.bin from spes data prepare)")->required();
  cmd->add_option("--seq-len", *seq_len, "tokens per window (0 = the run's data.seq_len, else the model's context)");
  cmd->add_option("--batch-size", *batch, "windows per forward pass")->capture_default_str();
  cmd->add_option("--windows", *windows, "windows to evaluate, from the start of the shard (0 = every whole window once)")
      ->capture_default_str();
  cmd->callback([o, data, seq_len, batch, windows] {
    const Shard folder = open_model(*o);
    const ModelConfig m = model_config_of(folder.info);
    const TokenShard shard(*data);
    if (shard.vocab_size() > m.vocab_size)
      raise(ErrorKind::Data, "token shard '{}' has a vocabulary of {}, the model only {}", *data, shard.vocab_size(),
            m.vocab_size);
    const std::int64_t S = *seq_len > 0 ? *seq_len : default_seq_len(folder.info, m);
    if (S > m.max_seq_len) raise(ErrorKind::Usage, "--seq-len {} exceeds the model's context of {}", S, m.max_seq_len);
    if (*batch < 1) raise(ErrorKind::Usage, "--batch-size must be at least 1");
    if (*windows < 0) raise(ErrorKind::Usage, "--windows must be 0 (every window) or more");
    MoeTransformer model = build_model(folder);
    const auto start = std::chrono::steady_clock::now();
    const EvalStats e = evaluate_model(model, shard, S, *batch, *windows);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::printf("%s on %s: loss %.6f, perplexity %.3f over %lld tokens (windows of %lld; %.0f tokens/s)\n",
                o->path.c_str(), data->c_str(), e.loss, e.perplexity, static_cast<long long>(e.tokens),
                static_cast<long long>(S), static_cast<double>(e.tokens) / s);
  });
}

void add_generate(CLI::App& app) {
  auto* cmd = app.add_subcommand("generate", "continue a prompt with text sampled from a model (KV cache)");
  auto o = std::make_shared<ModelOptions>();
  auto prompt = std::make_shared<std::string>();
  auto tokenizer = std::make_shared<std::string>();
  auto g = std::make_shared<GenerateOptions>();
  add_model_options(*cmd, *o);
  cmd->add_option("-p,--prompt", *prompt, "the text to continue")->required();
  cmd->add_option("--tokenizer", *tokenizer, "SentencePiece model (default: the one the folder records)");
  cmd->add_option("-n,--max-tokens", g->max_tokens, "new tokens at most")->capture_default_str();
  cmd->add_option("--temperature", g->sampling.temperature, "softmax temperature (0 = greedy)")->capture_default_str();
  cmd->add_option("--top-k", g->sampling.top_k, "sample among the k most likely tokens (0 = all)")->capture_default_str();
  cmd->add_option("--top-p", g->sampling.top_p, "sample among the most likely tokens up to this probability")
      ->capture_default_str();
  cmd->add_option("--seed", g->seed, "seed of the sampler")->capture_default_str();
  cmd->add_flag("!--no-cache", g->use_cache, "recompute the whole sequence for every token (slow; for checks)");
  cmd->callback([o, prompt, tokenizer, g] {
    if (g->sampling.temperature < 0 || g->sampling.top_k < 0 || !(g->sampling.top_p > 0 && g->sampling.top_p <= 1))
      raise(ErrorKind::Usage, "need --temperature >= 0, --top-k >= 0 and 0 < --top-p <= 1");
    if (g->max_tokens < 1) raise(ErrorKind::Usage, "--max-tokens must be at least 1");
    const Shard folder = open_model(*o);
    const std::string tok_path = tokenizer->empty() ? folder.info.tokenizer : *tokenizer;
    if (tok_path.empty()) raise(ErrorKind::Usage, "'{}' records no tokenizer: give --tokenizer FILE", o->path);
    const Tokenizer tok(tok_path);
    if (tok.vocab_size() > model_config_of(folder.info).vocab_size)
      raise(ErrorKind::Data, "tokenizer '{}' has {} pieces, more than the model's vocabulary", tok_path, tok.vocab_size());
    MoeTransformer model = build_model(folder);
    g->stop_token = tok.eos_id();
    const auto ids = tok.encode(*prompt);
    const auto start = std::chrono::steady_clock::now();
    const auto out = generate(model, ids, *g);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    // Decoded together: SentencePiece drops the leading space of a sequence's first piece.
    auto all = ids;
    all.insert(all.end(), out.begin(), out.end());
    std::printf("%s\n", tok.decode(all).c_str());
    std::fflush(stdout);
    std::fprintf(stderr, "%zu prompt tokens, %zu new tokens in %.2f s (%.1f tokens/s, %s)\n", ids.size(), out.size(), s,
                 static_cast<double>(out.size()) / s, g->use_cache ? "KV cache" : "no cache");
  });
}

}  // namespace

void add_eval_commands(CLI::App& app) {
  add_eval(app);
  add_generate(app);
}

}  // namespace spes::cli
