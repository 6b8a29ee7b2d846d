// spes — decentralized SPES pretraining of mixture-of-experts language models.
#include <cstdio>
#include <exception>

#include "commands.h"
#include "spes/util/error.h"
#include "spes/util/process.h"

namespace spes::cli {

void add_config_options(CLI::App& cmd, ConfigOptions& options) {
  cmd.add_option("-c,--config", options.config, "YAML configuration file")->required();
  cmd.add_option("--set", options.overrides, "override a config value: section.key=value (repeatable)");
  cmd.add_option("--log-level", options.log_level, "trace, debug, info, warn or error");
}

}  // namespace spes::cli

int main(int argc, char** argv) {
  spes::keep_freed_memory_for_reuse();
  CLI::App app{"spes: pretrain mixture-of-experts language models on standalone machines (SPES)"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "spes 0.1.0");
  spes::cli::add_data_commands(app);
  spes::cli::add_train_command(app);
  spes::cli::add_node_command(app);
  spes::cli::add_coordinator_commands(app);
  spes::cli::add_ca_commands(app);
  spes::cli::add_launch_command(app);
  spes::cli::add_model_commands(app);
  spes::cli::add_ckpt_commands(app);
  spes::cli::add_eval_commands(app);
  spes::cli::add_bench_commands(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const spes::Error& e) {
    std::fprintf(stderr, "spes: %s: %s\n", spes::kind_name(e.kind()), e.what());
    return spes::exit_code(e.kind());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "spes: internal error: %s\n", e.what());
    return spes::exit_code(spes::ErrorKind::Internal);
  }
  return 0;
}
