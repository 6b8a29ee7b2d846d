// spes bench generate — decoding speed with the KV cache against recomputing the whole sequence
// for every new token, in the same process on the same model (a ratio, robust to a noisy machine).
#include <chrono>
#include <cstdio>
#include <random>

#include "../../src/cli/commands.h"
#include "spes/config/config.h"
#include "spes/train/inference.h"
#include "spes/train/trainer.h"
#include "spes/util/error.h"
#include "spes/util/log.h"

namespace spes::cli {
namespace {

struct GenerateBenchOptions {
  ConfigOptions config;
  std::int64_t prompt_tokens = 32;
  std::int64_t new_tokens = 96;
  int repeats = 3;
};

// Best wall time of `repeats` greedy generations; `out` gets the tokens.
double best_seconds(MoeTransformer& model, const std::vector<std::uint32_t>& prompt, const GenerateOptions& g,
                    int repeats, std::vector<std::uint32_t>& out) {
  double best = 1e300;
  for (int i = 0; i < repeats; ++i) {
    const auto start = std::chrono::steady_clock::now();
    out = generate(model, prompt, g);
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  return best;
}

void run_generate_bench(const GenerateBenchOptions& o) {
  init_logging(o.config.log_level);
  const Config c = load_config(o.config.config, o.config.overrides);
  if (o.prompt_tokens < 1 || o.new_tokens < 1 || o.prompt_tokens + o.new_tokens > c.model.max_seq_len)
    raise(ErrorKind::Usage, "need prompt + new tokens ({} + {}) within model.max_seq_len {}", o.prompt_tokens,
          o.new_tokens, c.model.max_seq_len);
  const int threads = configure_threads(c.run);
  MoeTransformer model(c.model, c.run.seed);
  model->eval();
  std::mt19937_64 rng(c.run.seed);
  std::vector<std::uint32_t> prompt;
  for (std::int64_t i = 0; i < o.prompt_tokens; ++i)
    prompt.push_back(static_cast<std::uint32_t>(rng() % static_cast<std::uint64_t>(c.model.vocab_size)));
  GenerateOptions g;
  g.sampling.temperature = 0;  // greedy: both paths must give the same tokens
  g.max_tokens = o.new_tokens;
  std::vector<std::uint32_t> cached, full;
  const double with_cache = best_seconds(model, prompt, g, o.repeats, cached);
  g.use_cache = false;
  const double without = best_seconds(model, prompt, g, o.repeats, full);
  const double n = static_cast<double>(o.new_tokens);
  std::printf("%s: %lld prompt + %lld new tokens, greedy, %d thread(s), best of %d\n", c.source.c_str(),
              static_cast<long long>(o.prompt_tokens), static_cast<long long>(o.new_tokens), threads, o.repeats);
  std::printf("  KV cache     %8.1f tokens/s  (%.3f s)\n", n / with_cache, with_cache);
  std::printf("  no cache     %8.1f tokens/s  (%.3f s)\n", n / without, without);
  std::printf("  speed-up     %8.2fx; same tokens: %s\n", without / with_cache, cached == full ? "yes" : "NO");
  if (cached != full) raise(ErrorKind::Internal, "the KV cache changed the greedy tokens");
}

}  // namespace

void add_bench_generate(CLI::App& bench) {
  auto* cmd = bench.add_subcommand("generate", "decoding tokens/s with the KV cache vs recomputing every step");
  auto o = std::make_shared<GenerateBenchOptions>();
  add_config_options(*cmd, o->config);
  cmd->add_option("--prompt-tokens", o->prompt_tokens, "prompt length")->capture_default_str();
  cmd->add_option("--new-tokens", o->new_tokens, "tokens generated")->capture_default_str();
  cmd->add_option("--repeats", o->repeats, "runs per case; the best counts")->check(CLI::PositiveNumber);
  cmd->callback([o] { run_generate_bench(*o); });
}

}  // namespace spes::cli
