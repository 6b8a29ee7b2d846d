// spes model info: sizes of a configured model, without building it.
#include <cstdio>

#include "commands.h"
#include "spes/config/config.h"
#include "spes/model/size.h"
#include "spes/util/progress.h"

namespace spes::cli {

void add_model_commands(CLI::App& app) {
  auto* model = app.add_subcommand("model", "inspect model configurations");
  model->require_subcommand(1);
  auto* info = model->add_subcommand("info", "validate a config and print its parameter counts");
  auto options = std::make_shared<ConfigOptions>();
  add_config_options(*info, *options);
  info->callback([options] {
    Config c = load_config(options->config, options->overrides);
    const auto& m = c.model;
    auto p = count_params(m, static_cast<std::int64_t>(c.owned_expert_list().size()));
    std::printf("%s: d_model %lld, %lld layers, %lld heads (%lld KV), d_ff %lld, %lld experts top-%lld%s, "
                "qk_norm %s, vocab %lld\n",
                c.source.c_str(), (long long)m.d_model, (long long)m.n_layers, (long long)m.n_heads,
                (long long)m.kv_heads(), (long long)m.d_ff, (long long)m.n_experts, (long long)m.top_k,
                m.norm_topk_prob ? " (renormalized)" : "", qk_norm_name(m.qk_norm), (long long)m.vocab_size);
    auto row = [](const char* name, std::int64_t n) {
      std::printf("  %-22s %14lld  (%s)\n", name, static_cast<long long>(n), format_count(static_cast<double>(n)).c_str());
    };
    row("embedding", p.embedding);
    row("lm_head", p.lm_head);
    row("attention", p.attention);
    row("norms", p.norms);
    row("router", p.router);
    row("experts", p.experts);
    row("total", p.total);
    row("active per token", p.active);
    row("trainable (this node)", p.trainable);
  });
}

}  // namespace spes::cli
