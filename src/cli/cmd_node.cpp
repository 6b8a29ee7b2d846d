// spes node: one node of a SPES cluster — the trainer, the sync service and (when
// coordinator.address is set) the coordinator client in one process. Without a coordinator the
// peers come from sync.peers.
#include <spdlog/spdlog.h>

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <filesystem>
#include <mutex>
#include <nlohmann/json.hpp>
#include <thread>

#include "commands.h"
#include "spes/config/config.h"
#include "spes/coord/coordinator.h"
#include "spes/data/prepare.h"
#include "spes/sync/engine.h"
#include "spes/sync/model_params.h"
#include "spes/train/checkpoint.h"
#include "spes/train/trainer.h"
#include "spes/util/error.h"
#include "spes/util/fs.h"
#include "spes/util/log.h"
#include "spes/util/process.h"
#include "spes/util/progress.h"
#include "spes/util/safetensors.h"
#include "spes/util/signals.h"

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

// The plan that static sync.peers describe (no coordinator).
MembershipPlan static_plan(const Config& c) {
  MembershipPlan plan;
  for (const auto& p : c.sync.peers) plan.members.push_back({p.id, p.address, p.experts});
  return plan;
}

// The node config with a plan's members as sync peers: what one SyncEngine runs with.
Config engine_config(const Config& base, const MembershipPlan& plan) {
  Config c = base;
  c.sync.peers.clear();
  for (const auto& m : plan.members) c.sync.peers.push_back({m.id, m.address, m.experts});
  return c;
}

double unix_now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// Reports progress to the coordinator every coordinator.heartbeat_s from its own thread.
class Heartbeat {
 public:
  Heartbeat(CoordinatorClient& client, int node_id, double every_s) : client_(client), node_id_(node_id) {
    thread_ = std::thread([this, every_s] {
      std::unique_lock lock(mutex_);
      while (!stopping_) {
        NodeProgress p = progress_;
        lock.unlock();
        client_.heartbeat(node_id_, p);
        lock.lock();
        changed_.wait_for(lock, std::chrono::milliseconds(static_cast<std::int64_t>(every_s * 1000)),
                          [this] { return stopping_; });
      }
    });
  }
  ~Heartbeat() { stop(NodeProgress{}, false); }
  template <typename Update>
  void update(Update f) {
    std::lock_guard lock(mutex_);
    f(progress_);
  }
  // Stops the thread; with `final_report`, sends `last` once more (e.g. done = true).
  void stop(const NodeProgress& last, bool final_report) {
    {
      std::lock_guard lock(mutex_);
      if (stopping_) return;
      stopping_ = true;
      changed_.notify_all();
    }
    thread_.join();
    if (final_report) client_.heartbeat(node_id_, last);
  }
  NodeProgress snapshot() {
    std::lock_guard lock(mutex_);
    return progress_;
  }

 private:
  CoordinatorClient& client_;
  int node_id_;
  std::mutex mutex_;
  std::condition_variable changed_;
  NodeProgress progress_;
  bool stopping_ = false;
  std::thread thread_;
};

class NodeDaemon {
 public:
  explicit NodeDaemon(Config config) : config_(std::move(config)), trainer_(config_), mirror_(trainer_.model()) {
    if (!config_.sync.dump_dir.empty()) {
      dump_dir_ = config_.sync.dump_dir + "/node" + std::to_string(config_.run.node_id);
      ensure_directory(dump_dir_);
    }
  }

  void run() {
    const int me = config_.run.node_id;
    std::optional<SyncCarry> carry;
    if (auto resumed = resume_from_config(trainer_)) {
      round_ = resumed->sync_round;
      round_step_ = resumed->step;
      carry = std::move(resumed->sync_carry);
    }
    std::uint64_t catch_up_round = 0;
    if (!config_.coordinator.address.empty()) {
      coordinator_ = std::make_unique<CoordinatorClient>(config_);
      const MembershipPlan configured = static_plan(config_);
      auto [plan, round] = coordinator_->join(me, configured.find(me)->address, config_.coordinator.wait_s);
      spdlog::info("coordinator {}: joined run '{}' as node {}{}", config_.coordinator.address,
                   config_.sync.effective_run_id(config_.run), me,
                   round > 0 ? fmt::format(" (run in progress: catching up at round {})", round) : "");
      heartbeat_ = std::make_unique<Heartbeat>(*coordinator_, me, config_.coordinator.heartbeat_s);
      if (round > 0) {
        plan_ = plan;
        catch_up_round = round;
      } else {
        plan_ = plan_for(1).value_or(plan);
      }
    } else {
      plan_ = static_plan(config_);
    }
    engine_ = make_engine();
    if (catch_up_round > 0) catch_up(catch_up_round);
    else adopt(plan_, /*log_changes=*/false);
    if (carry && catch_up_round == 0) restore_carry(*carry);

    trainer_.set_after_step([this](const StepStats& s) { after_step(s); });
    trainer_.set_should_stop([] { return stop_requested(); });
    EvalStats final_eval = trainer_.run();
    engine_->finish(config_.sync.round_timeout_s);
    std::uint64_t skips = 0;
    for (auto k : engine_->skip_counts()) skips += k;
    if (heartbeat_) {
      NodeProgress last = heartbeat_->snapshot();
      last.done = !trainer_.stopped_early();
      heartbeat_->stop(last, true);
    }
    if (trainer_.stopped_early()) {
      const auto carry_now = trainer_.step_count() == round_step_ ? engine_->carry() : std::nullopt;
      spdlog::warn("node {} stopped by signal {} at step {} after {} rounds; left the round cleanly; wrote {}", me,
                   stop_signal(), trainer_.step_count(), round_, write_shard(trainer_, round_, carry_now ? &*carry_now : nullptr));
      return;
    }
    spdlog::info("node {} done: {} rounds, {} in, {} out, {} peer skips; final validation loss {:.4f} (ppl {:.2f})", me,
                 round_, format_bytes(static_cast<double>(bytes_in_ + engine_->bytes_received())),
                 format_bytes(static_cast<double>(bytes_out_ + engine_->bytes_sent())), skips, final_eval.loss,
                 final_eval.perplexity);
  }

 private:
  std::optional<MembershipPlan> plan_for(std::uint64_t round) {
    auto plan = coordinator_->plan_for(config_.run.node_id, round, config_.coordinator.wait_s);
    if (!plan)
      spdlog::warn("coordinator {} unreachable for {:.0f} s: keeping plan {} for round {}", config_.coordinator.address,
                   config_.coordinator.wait_s, plan_.version, round);
    return plan;
  }

  // The sync engine for plan_: its members as peers, its observers waited for in finish().
  std::unique_ptr<SyncEngine> make_engine() {
    return std::make_unique<SyncEngine>(engine_config(config_, plan_), mirror_.params(),
                                        SyncMembership{plan_.version, std::max(plan_.effective_round, round_ + 1),
                                                       plan_.observers});
  }

  // Trains what `plan` gives this node; says which experts it takes over (zero moments).
  void adopt(const MembershipPlan& plan, bool log_changes) {
    const PlanMember* mine = plan.find(config_.run.node_id);
    if (!mine)
      raise(ErrorKind::Peer, "node {} is not a member of plan {} (the coordinator declared it dead?): restart it to "
            "rejoin", config_.run.node_id, plan.version);
    auto added = trainer_.set_owned_experts(mine->experts);
    if (log_changes && !added.empty())
      spdlog::warn("node {} now trains experts {} as well, from their last synced weights; their AdamW moments start "
                   "at zero", config_.run.node_id, format_list(added));
    if (heartbeat_) heartbeat_->update([&](NodeProgress& p) { p.experts = mine->experts; });
  }

  // Switches to a new plan between rounds: peers must first fetch our part of the last round.
  void switch_plan(const MembershipPlan& next) {
    engine_->finish(config_.sync.round_timeout_s);
    bytes_in_ += engine_->bytes_received();
    bytes_out_ += engine_->bytes_sent();
    engine_.reset();
    spdlog::info("plan {} from round {}: {} member(s)", next.version, next.effective_round, next.members.size());
    plan_ = next;
    engine_ = make_engine();
    adopt(plan_, true);
  }

  // A node joining a run in progress: take round `round`'s result, then become a member.
  void catch_up(std::uint64_t round) {
    const std::int64_t step = std::min<std::int64_t>(static_cast<std::int64_t>(round) * config_.sync.every, config_.train.steps);
    spdlog::info("catching up: waiting for round {} (step {}) from {} member(s)", round, step, plan_.members.size());
    SyncRoundReport r = run_round(round, step);
    trainer_.set_step(step);
    round_ = round;
    spdlog::info("caught up at round {} (step {}): {} received in {:.1f} s", round, step,
                 format_bytes(static_cast<double>(r.bytes_in)), r.seconds);
    auto next = plan_for(round + 1);
    if (!next || !next->find(config_.run.node_id))
      raise(ErrorKind::Peer, "caught up at round {} but the coordinator has no plan with node {} as a member", round,
            config_.run.node_id);
    switch_plan(*next);
  }

  void after_step(const StepStats& s) {
    if (heartbeat_)
      heartbeat_->update([&](NodeProgress& p) {
        p.step = s.step;
        p.loss = s.loss;
        p.tokens_per_s = s.tokens_per_s;
        p.peak_rss_bytes = s.peak_rss;
      });
    if (s.step % config_.sync.every != 0 && s.step != config_.train.steps) {
      checkpoint_if_due(trainer_, round_);
      return;
    }
    ++round_;
    SyncRoundReport r = run_round(round_, s.step);
    log_round(r);
    round_step_ = s.step;
    // After the round: a shard resumes at a round boundary, with the engine's residuals.
    if (checkpoint_due(trainer_)) {
      const auto carry = engine_->carry();
      checkpoint_if_due(trainer_, round_, carry ? &*carry : nullptr);
    }
    if (coordinator_ && s.step != config_.train.steps) {
      auto next = plan_for(round_ + 1);
      if (next && next->version != plan_.version) switch_plan(*next);
    }
  }

  // One round on the sync buffers: the model's weights go to them before (one device-to-host
  // copy on a GPU) and come back after.
  SyncRoundReport run_round(std::uint64_t round, std::int64_t step) {
    mirror_.to_host();
    if (!dump_dir_.empty()) dump_params(mirror_.params(), fmt::format("{}/round{}_pre.safetensors", dump_dir_, round));
    SyncRoundReport r = engine_->run_round(round, step);
    if (!dump_dir_.empty()) dump_params(mirror_.params(), fmt::format("{}/round{}_post.safetensors", dump_dir_, round));
    mirror_.to_model();
    return r;
  }

  // A lossy-encoded run resumed right after a round: the engine takes back its residuals and
  // baseline rounds, so the next rounds send what an uninterrupted run would have sent.
  void restore_carry(const SyncCarry& carry) {
    if (carry.round != round_ || !engine_->restore(carry)) {
      spdlog::warn("sync: the shard's error-feedback state (round {}) does not fit this run: the next round is sent "
                   "in fp32 and residuals start at zero", carry.round);
      return;
    }
    spdlog::info("sync: restored the error-feedback residuals and baselines of round {}", carry.round);
  }

  void log_round(const SyncRoundReport& r) {
    spdlog::info("sync  round {:>3} at step {:>5} | in {} | out {} (total) | {:.2f} s | skipped: {}{}", r.round, r.step,
                 format_bytes(static_cast<double>(r.bytes_in)), format_bytes(static_cast<double>(bytes_out_ + r.bytes_out)),
                 r.seconds, skipped_text(r), r.merged ? fmt::format(" | merged experts, alpha {:.4f}", r.merge_alpha) : "");
    if (MetricsLog* m = trainer_.metrics()) {
      nlohmann::json skipped = nlohmann::json::array();
      for (const auto& k : r.skipped) skipped.push_back({{"peer", k.peer}, {"reason", k.reason}});
      nlohmann::json by_peer = nlohmann::json::object();
      for (const auto& b : r.by_peer)
        by_peer[std::to_string(b.peer)] = {{"in", b.in}, {"out_total", b.out_total}};
      m->write_line(nlohmann::json{{"type", "sync"}, {"round", r.round}, {"step", r.step}, {"seconds", r.seconds},
                                   {"bytes_in", r.bytes_in}, {"bytes_out_total", bytes_out_ + r.bytes_out},
                                   {"skipped", skipped}, {"by_peer", by_peer}, {"merged", r.merged}, {"merge_alpha", r.merge_alpha},
                                   {"plan", plan_.version}, {"members", plan_.members.size()}}
                        .dump());
    }
    if (heartbeat_)
      heartbeat_->update([&](NodeProgress& p) {
        p.round = r.round;
        p.last_sync_unix_s = unix_now();
        p.last_sync_bytes_in = r.bytes_in;
        p.bytes_in_total = bytes_in_ + engine_->bytes_received();
        p.bytes_out_total = bytes_out_ + engine_->bytes_sent();
      });
  }

  Config config_;
  Trainer trainer_;
  ModelParamMirror mirror_;  // the sync engine's view of the weights
  std::string dump_dir_;
  std::unique_ptr<CoordinatorClient> coordinator_;
  std::unique_ptr<Heartbeat> heartbeat_;
  std::unique_ptr<SyncEngine> engine_;
  MembershipPlan plan_;
  std::uint64_t round_ = 0;
  std::int64_t round_step_ = -1;  // the step of the last completed round (a shard at it can carry sync state)
  std::uint64_t bytes_in_ = 0, bytes_out_ = 0;  // of engines replaced by plan changes
};

void run_node(const ConfigOptions& options) {
  Config config = load_config(options.config, options.overrides);
  if (!config.sync.enabled())
    raise(ErrorKind::Config, "{}: `spes node` needs sync.every > 0 and sync.peers (for one machine use `spes train`)",
          config.where("sync.every"));
  install_stop_signals();
  ensure_directory(config.run.out_dir);
  init_logging(options.log_level == "info" ? config.run.log_level : options.log_level, config.run.out_dir + "/node.log");
  spdlog::info("spes node {} (pid {}): config {} → {}", config.run.node_id, static_cast<long>(::getpid()), config.source,
               config.run.out_dir);
  prepare_data(config);
  spdlog::info("libtorch intra-op threads: {}", configure_threads(config.run));
  NodeDaemon daemon(std::move(config));
  daemon.run();
}

}  // namespace

void add_node_command(CLI::App& app) {
  auto* node = app.add_subcommand("node", "run one node of a SPES cluster: trainer + sync service (+ coordinator client)");
  auto options = std::make_shared<ConfigOptions>();
  add_config_options(*node, *options);
  auto resume = std::make_shared<bool>(false);
  node->add_flag("--resume", *resume, "continue from the newest usable checkpoint shard (checkpoint.resume: auto)");
  node->callback([options, resume] {
    if (*resume) options->overrides.push_back("checkpoint.resume=auto");
    run_node(*options);
  });
}

}  // namespace spes::cli
