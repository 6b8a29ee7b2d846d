// spes node: flags and config for one node of a SPES cluster. The daemon itself is
// spes/node/daemon.h; with node.ranks > 1 this process launches and watches the node's ranks
// (spes/node/ranks.h).
#include <spdlog/spdlog.h>

#include <unistd.h>

#include "commands.h"
#include "spes/config/config.h"
#include "spes/data/prepare.h"
#include "spes/dist/rank_context.h"
#include "spes/node/daemon.h"
#include "spes/node/ranks.h"
#include "spes/train/trainer.h"
#include "spes/util/error.h"
#include "spes/util/fs.h"
#include "spes/util/log.h"
#include "spes/util/process.h"
#include "spes/util/signals.h"

namespace spes::cli {
namespace {

// The command line that starts one rank of this node (the rank itself comes from the environment).
std::vector<std::string> rank_command_line(const ConfigOptions& options) {
  std::vector<std::string> argv{self_executable().string(), "node", "--config", options.config, "--log-level",
                                options.log_level};
  for (const auto& o : options.overrides) {
    argv.push_back("--set");
    argv.push_back(o);
  }
  return argv;
}

void run_node(const ConfigOptions& options) {
  Config config = load_config(options.config, options.overrides);
  if (!config.sync.enabled())
    raise(ErrorKind::Config, "{}: `spes node` needs sync.every > 0 and sync.peers (for one machine use `spes train`)",
          config.where("sync.every"));
  install_stop_signals();
  ensure_directory(config.run.out_dir);
  const auto rank = rank_context_from_environment();
  const std::string level = options.log_level == "info" ? config.run.log_level : options.log_level;
  if (config.node.ranks > 1 && !rank) {
    // The launcher: data first (once, not by K racing ranks), then the ranks.
    init_logging(level, config.run.out_dir + "/ranks.log");
    spdlog::info("spes node {} (pid {}): config {} → {}", config.run.node_id, static_cast<long>(::getpid()),
                 config.source, config.run.out_dir);
    prepare_data(config);
    run_node_ranks(rank_command_line(options), config);
    return;
  }
  const RankContext context = rank.value_or(RankContext{});
  if (context.ranks != config.node.ranks)
    raise(ErrorKind::Usage, "this process was started as {} (SPES_NODE_RANKS) but node.ranks is {}",
          context.describe(), config.node.ranks);
  if (context.leader()) {
    init_logging(level, config.run.out_dir + "/node.log");
    spdlog::info("spes node {} (pid {}{}): config {} → {}", config.run.node_id, static_cast<long>(::getpid()),
                 context.ranks > 1 ? ", " + context.describe() : "", config.source, config.run.out_dir);
  } else {
    init_logging(level == "info" ? "warn" : level, fmt::format("{}/rank{}.log", config.run.out_dir, context.rank));
  }
  if (context.ranks == 1) prepare_data(config);
  const int threads = configure_threads(config.run, context.ranks);
  if (context.leader()) spdlog::info("libtorch intra-op threads: {}{}", threads, context.ranks > 1 ? " per rank" : "");
  run_node_process(config, context);
}

}  // namespace

void add_node_command(CLI::App& app) {
  auto* node = app.add_subcommand("node", "run one node of a SPES cluster: trainer + sync service (+ coordinator client)");
  auto options = std::make_shared<ConfigOptions>();
  add_config_options(*node, *options);
  auto resume = std::make_shared<bool>(false);
  node->add_flag("--resume", *resume, "continue from the newest usable checkpoint shard (checkpoint.resume: auto)");
  auto nproc = std::make_shared<int>(0);
  node->add_option("--nproc-per-node", *nproc,
                   "local ranks (processes, one per GPU) training this node's experts data-parallel (node.ranks)")
      ->check(CLI::Range(1, 1024));
  node->callback([options, resume, nproc] {
    if (*resume) options->overrides.push_back("checkpoint.resume=auto");
    if (*nproc > 0) options->overrides.push_back("node.ranks=" + std::to_string(*nproc));
    run_node(*options);
  });
}

}  // namespace spes::cli
