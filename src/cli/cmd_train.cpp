// spes train: one process, no peers.
#include <spdlog/spdlog.h>

#include "commands.h"
#include "spes/config/config.h"
#include "spes/data/prepare.h"
#include "spes/train/checkpoint.h"
#include "spes/train/trainer.h"
#include "spes/util/error.h"
#include "spes/util/fs.h"
#include "spes/util/log.h"
#include "spes/util/signals.h"

namespace spes::cli {

void add_train_command(CLI::App& app) {
  auto* train = app.add_subcommand("train", "train on this machine alone (all or some experts)");
  auto options = std::make_shared<ConfigOptions>();
  add_config_options(*train, *options);
  auto resume = std::make_shared<bool>(false);
  train->add_flag("--resume", *resume, "continue from the newest usable checkpoint shard (checkpoint.resume: auto)");
  train->callback([options, resume] {
    if (*resume) options->overrides.push_back("checkpoint.resume=auto");
    Config config = load_config(options->config, options->overrides);
    if (config.node.ranks > 1)
      raise(ErrorKind::Config, "{}: `spes train` runs one process; several ranks per node are a `spes node` "
            "feature (spes node --nproc-per-node {})", config.where("node.ranks"), config.node.ranks);
    install_stop_signals();
    ensure_directory(config.run.out_dir);
    init_logging(options->log_level == "info" ? config.run.log_level : options->log_level,
                 config.run.out_dir + "/train.log");
    spdlog::info("spes train: config {} → {}", config.source, config.run.out_dir);
    prepare_data(config);
    const int threads = configure_threads(config.run);
    spdlog::info("libtorch intra-op threads: {}", threads);
    Trainer trainer(config);
    resume_from_config(trainer);
    trainer.set_after_step([&trainer](const StepStats&) { checkpoint_if_due(trainer, 0); });
    trainer.set_should_stop([] { return stop_requested(); });
    EvalStats final_eval = trainer.run();
    if (trainer.stopped_early()) {
      spdlog::warn("stopped by signal {} at step {}: wrote {}; continue with --resume", stop_signal(),
                   trainer.step_count(), write_shard(trainer, 0));
      return;
    }
    spdlog::info("final validation loss {:.4f} (perplexity {:.2f}); metrics in {}/metrics.jsonl",
                 final_eval.loss, final_eval.perplexity, config.run.out_dir);
  });
}

}  // namespace spes::cli
