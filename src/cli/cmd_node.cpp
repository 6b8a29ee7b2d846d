// spes node: one node of a SPES cluster — the trainer and the sync service in one process,
// with the peers listed in the config (sync.peers).
#include <spdlog/spdlog.h>

#include <filesystem>
#include <nlohmann/json.hpp>

#include "commands.h"
#include "spes/config/config.h"
#include "spes/data/prepare.h"
#include "spes/sync/engine.h"
#include "spes/sync/model_params.h"
#include "spes/train/trainer.h"
#include "spes/util/error.h"
#include "spes/util/fs.h"
#include "spes/util/log.h"
#include "spes/util/progress.h"
#include "spes/util/safetensors.h"

namespace spes::cli {
namespace {

void dump_params(const ParamSet& params, const std::string& path) {
  std::vector<TensorView> views;
  for (const auto& p : params.params()) views.push_back({p.name, p.shape, p.data});
  write_safetensors(path, views);
}

std::string skipped_text(const SyncRoundReport& r) {
  if (r.skipped.empty()) return "none";
  std::string out;
  for (const auto& s : r.skipped) out += (out.empty() ? "" : ",") + std::to_string(s.peer);
  return out;
}

void run_node(const ConfigOptions& options) {
  Config config = load_config(options.config, options.overrides);
  if (!config.sync.enabled())
    raise(ErrorKind::Config, "{}: `spes node` needs sync.every > 0 and sync.peers (for one machine use `spes train`)",
          config.where("sync.every"));
  ensure_directory(config.run.out_dir);
  init_logging(options.log_level == "info" ? config.run.log_level : options.log_level, config.run.out_dir + "/node.log");
  spdlog::info("spes node {}: config {} → {}", config.run.node_id, config.source, config.run.out_dir);
  prepare_data(config);
  spdlog::info("libtorch intra-op threads: {}", configure_threads(config.run));

  Trainer trainer(config);
  ParamSet params = model_param_set(trainer.model());
  SyncEngine engine(config, params);
  const std::string dump_dir =
      config.sync.dump_dir.empty() ? "" : config.sync.dump_dir + "/node" + std::to_string(config.run.node_id);
  if (!dump_dir.empty()) ensure_directory(dump_dir);

  std::uint64_t round = 0;
  trainer.set_after_step([&](const StepStats& s) {
    if (s.step % config.sync.every != 0 && s.step != config.train.steps) return;
    ++round;
    if (!dump_dir.empty()) dump_params(params, fmt::format("{}/round{}_pre.safetensors", dump_dir, round));
    SyncRoundReport r = engine.run_round(round, s.step);
    if (!dump_dir.empty()) dump_params(params, fmt::format("{}/round{}_post.safetensors", dump_dir, round));
    spdlog::info("sync  round {:>3} at step {:>5} | in {} | out {} (total) | {:.2f} s | skipped: {}{}", r.round, r.step,
                 format_bytes(static_cast<double>(r.bytes_in)), format_bytes(static_cast<double>(r.bytes_out)),
                 r.seconds, skipped_text(r), r.merged ? fmt::format(" | merged experts, alpha {:.4f}", r.merge_alpha) : "");
    if (MetricsLog* m = trainer.metrics()) {
      nlohmann::json skipped = nlohmann::json::array();
      for (const auto& k : r.skipped) skipped.push_back({{"peer", k.peer}, {"reason", k.reason}});
      m->write_line(nlohmann::json{{"type", "sync"}, {"round", r.round}, {"step", r.step}, {"seconds", r.seconds},
                                   {"bytes_in", r.bytes_in}, {"bytes_out_total", r.bytes_out}, {"skipped", skipped},
                                   {"merged", r.merged}, {"merge_alpha", r.merge_alpha}}
                        .dump());
    }
  });
  EvalStats final_eval = trainer.run();
  engine.finish(config.sync.round_timeout_s);
  std::uint64_t skips = 0;
  for (auto k : engine.skip_counts()) skips += k;
  spdlog::info("node {} done: {} rounds, {} in, {} out, {} peer skips; final validation loss {:.4f} (ppl {:.2f})",
               config.run.node_id, round, format_bytes(static_cast<double>(engine.bytes_received())),
               format_bytes(static_cast<double>(engine.bytes_sent())), skips, final_eval.loss, final_eval.perplexity);
}

}  // namespace

void add_node_command(CLI::App& app) {
  auto* node = app.add_subcommand("node", "run one node of a SPES cluster: trainer + sync service (peers from the config)");
  auto options = std::make_shared<ConfigOptions>();
  add_config_options(*node, *options);
  node->callback([options] { run_node(*options); });
}

}  // namespace spes::cli
