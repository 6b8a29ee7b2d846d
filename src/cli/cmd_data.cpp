// spes data prepare
#include "commands.h"
#include "spes/config/config.h"
#include "spes/data/prepare.h"
#include "spes/util/log.h"

#include <cstdio>

namespace spes::cli {

void add_data_commands(CLI::App& app) {
  auto* data = app.add_subcommand("data", "corpora, tokenizers and token shards");
  data->require_subcommand(1);
  auto* prepare = data->add_subcommand("prepare", "fetch the corpus, train the tokenizer, write token shards");
  auto options = std::make_shared<ConfigOptions>();
  auto force = std::make_shared<bool>(false);
  add_config_options(*prepare, *options);
  prepare->add_flag("--force", *force, "rebuild even when data.dir is up to date");
  prepare->callback([options, force] {
    init_logging(options->log_level);
    Config config = load_config(options->config, options->overrides);
    PreparedData d = prepare_data(config, *force);
    std::printf("%s: %lld train tokens (%lld documents), %lld validation tokens (%lld documents), vocab %lld\n",
                d.paths.dir.c_str(), static_cast<long long>(d.train_tokens), static_cast<long long>(d.train_docs),
                static_cast<long long>(d.val_tokens), static_cast<long long>(d.val_docs),
                static_cast<long long>(d.vocab_size));
  });
}

}  // namespace spes::cli
