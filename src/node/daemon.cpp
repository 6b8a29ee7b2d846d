// spes node: one node of a SPES cluster — the trainer, the sync service and (when
// coordinator.address is set) the coordinator client. Without a coordinator the peers come
// from sync.peers. With node.ranks = K > 1 the node is K processes (spes/node/ranks.h): rank 0
// is the daemon below, the others train the same experts data-parallel and take rank 0's
// weights after every round.
#include "spes/node/daemon.h"

#include <spdlog/spdlog.h>
#include <torch/torch.h>

#include <chrono>
#include <cmath>
#include <condition_variable>
#include <mutex>
#include <nlohmann/json.hpp>
#include <thread>

#include "spes/coord/coordinator.h"
#include "spes/dist/node_group.h"
#include "spes/node/metrics.h"
#include "spes/node/overlap.h"
#include "spes/sync/engine.h"
#include "spes/sync/model_params.h"
#include "spes/train/checkpoint.h"
#include "spes/train/trainer.h"
#include "spes/util/error.h"
#include "spes/util/fs.h"
#include "spes/util/progress.h"
#include "spes/util/safetensors.h"
#include "spes/util/signals.h"

namespace spes {
namespace {

// Steps after which the node runs a sync round (and its ranks re-share rank 0's state): every
// sync.every / sync.fragments steps (one fragment each), and the last.
bool is_round_step(const Config& c, std::int64_t step) { return step % c.sync.period() == 0 || step == c.train.steps; }

// Steps after which a round lands (and the ranks re-share rank 0's state): the round's own step,
// or with sync.overlap sync.max_delay steps later (< the steps between rounds); the last step's
// round at once.
bool is_landing_step(const Config& c, std::int64_t step) {
  if (step == c.train.steps) return true;
  const std::int64_t snapshot = step - c.sync.delay();
  return snapshot > 0 && snapshot % c.sync.period() == 0;
}

// Every rank stops after the same step: a stop requested on any of them stops all — once rank 0
// has no round in flight (`hold`), so that the shard it writes has nothing in flight either.
bool stop_agreed(NodeGroup* group, bool hold = false) {
  const int here = (stop_requested() ? 1 : 0) + (hold ? 2 : 0);
  const int all = group ? static_cast<int>(group->max(here)) : here;
  return all == 1;
}

// Rank 0's step counter, round, owned experts and weights into every rank of the node (in
// place); returns the round. The optimizer state needs no copy: every rank started from the same
// shard (or from zero) and has applied the same averaged gradients since.
std::uint64_t share_from_leader(NodeGroup& group, Trainer& trainer, std::uint64_t round) {
  const Config& c = trainer.config();
  const auto device = trainer.device_plan().device;
  auto header = torch::full({c.model.n_experts + 3}, -1, torch::TensorOptions().dtype(torch::kInt64));
  if (group.rank() == 0) {
    const auto owned = c.owned_expert_list();
    header[0] = trainer.step_count();
    header[1] = static_cast<std::int64_t>(round);
    header[2] = static_cast<std::int64_t>(owned.size());
    for (std::size_t i = 0; i < owned.size(); ++i) header[static_cast<std::int64_t>(i) + 3] = owned[i];
  }
  header = header.to(device);
  group.broadcast({header});
  header = header.cpu();
  const auto* h = header.data_ptr<std::int64_t>();
  if (group.rank() != 0) {
    std::vector<int> owned(static_cast<std::size_t>(h[2]));
    for (std::size_t i = 0; i < owned.size(); ++i) owned[i] = static_cast<int>(h[i + 3]);
    if (owned != c.owned_expert_list()) {
      trainer.set_owned_experts(owned);
      spdlog::warn("rank {}: now trains experts {} (rank 0's plan)", group.rank(), format_list(owned));
    }
    trainer.set_step(h[0]);
  }
  group.broadcast(trainer.model()->parameters());
  return static_cast<std::uint64_t>(h[1]);
}

// The model's weights as fp32 (sync.dump_dir: what an overlapped round landed on and left).
void dump_model(Trainer& trainer, const std::string& path) {
  std::vector<torch::Tensor> keep;
  std::vector<TensorView> views;
  for (const auto& p : trainer.model()->named_parameters()) {
    keep.push_back(p.value().detach().to(torch::kCPU, torch::kFloat32).contiguous());
    views.push_back({p.key(), keep.back().sizes().vec(), keep.back().data_ptr<float>()});
  }
  write_safetensors(path, views);
}

// sync.dump_dir: every rank's weights after a round's share, to check that the ranks agree.
void dump_rank_weights(Trainer& trainer, int rank, std::uint64_t round) {
  const Config& c = trainer.config();
  if (c.sync.dump_dir.empty()) return;
  const std::string dir = fmt::format("{}/node{}", c.sync.dump_dir, c.run.node_id);
  ensure_directory(dir);
  dump_model(trainer, fmt::format("{}/rank{}_round{}.safetensors", dir, rank, round));
}

// The sync buffers a round reads and writes (those of its fragment, `tensors`) as safetensors.
void dump_params(const ParamSet& params, const std::vector<std::size_t>& tensors, const std::string& path) {
  std::vector<TensorView> views;
  for (std::size_t i : tensors) views.push_back({params[i].name, params[i].shape, params[i].data});
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

// A node's rank 0 (its only process unless node.ranks > 1): trainer, sync rounds, coordinator,
// checkpoints. With several ranks it hands its state to the others after every round.
class NodeDaemon {
 public:
  NodeDaemon(Config config, NodeGroup* group, GradientSync* grad_sync)
      : config_(std::move(config)),
        group_(group),
        trainer_(config_, TrainerOptions{.grad_sync = grad_sync}),
        mirror_(trainer_.model(), config_.sync.overlap),
        metrics_(config_) {
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
      auto [plan, round] = join(round_);
      spdlog::info("coordinator {}: joined run '{}' as node {}{}", config_.coordinator.address,
                   config_.sync.effective_run_id(config_.run), me,
                   round > 0 ? fmt::format(" (run in progress: catching up at round {})", round) : "");
      heartbeat_ = std::make_unique<Heartbeat>(*coordinator_, me, config_.coordinator.heartbeat_s);
      if (round > 0) {
        plan_ = plan;
        catch_up_round = round;
      } else {
        plan_ = plan_for(round_ + 1).value_or(plan);  // the next round's plan (round_ > 0 when resumed)
      }
    } else {
      plan_ = static_plan(config_);
    }
    engine_ = make_engine();
    if (catch_up_round > 0) catch_up_with_retries(catch_up_round);
    else adopt(plan_, /*log_changes=*/false);
    if (carry && catch_up_round == 0) restore_carry(*carry);

    if (group_) share_from_leader(*group_, trainer_, round_);

    trainer_.set_after_step([this](const StepStats& s) { after_step(s); });
    trainer_.set_should_stop([this] { return stop_agreed(group_, in_flight_ != nullptr); });
    EvalStats final_eval = trainer_.run();
    log_goodput();
    engine_->finish(config_.sync.round_timeout_s);
    std::uint64_t skips = 0;
    for (auto k : engine_->skip_counts()) skips += k;
    if (heartbeat_) {
      NodeProgress last = heartbeat_->snapshot();
      last.done = !trainer_.stopped_early();
      last.stopped = trainer_.stopped_early();
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
  // Joins the run at this node's configured address, saying which round its resumed shard holds
  // (0: none): the latest plan and the round to catch up at (0: none).
  std::pair<MembershipPlan, std::uint64_t> join(std::uint64_t resumed_round) {
    const MembershipPlan configured = static_plan(config_);
    return coordinator_->join(config_.run.node_id, configured.find(config_.run.node_id)->address,
                              config_.coordinator.wait_s, resumed_round);
  }

  // The plan for `round`, or nullopt (keep the current one) when the coordinator stays unreachable
  // for coordinator.wait_s — for at most 1 s once a stop signal came: the node leaves after this
  // step, and `launch-local` stops its coordinator before its nodes.
  std::optional<MembershipPlan> plan_for(std::uint64_t round) {
    const double wait_s = stop_requested() ? std::min(1.0, config_.coordinator.wait_s) : config_.coordinator.wait_s;
    auto plan = coordinator_->plan_for(config_.run.node_id, round, wait_s);
    if (!plan)
      spdlog::warn("coordinator {} unreachable for {:.0f} s: keeping plan {} for round {}", config_.coordinator.address,
                   wait_s, plan_.version, round);
    return plan;
  }

  // The sync engine for plan_: its members as peers, its observers waited for in finish().
  std::unique_ptr<SyncEngine> make_engine() {
    return std::make_unique<SyncEngine>(engine_config(config_, plan_), mirror_.params(),
                                        SyncMembership{plan_.version, std::max(plan_.effective_round, round_ + 1),
                                                       plan_.observers, plan_.effective_round});
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
    const std::int64_t step =
        std::min<std::int64_t>(static_cast<std::int64_t>(round) * config_.sync.period(), config_.train.steps);
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

  // A member of the catch-up plan may itself be gone (killed, not yet found silent) or be
  // restarting: the round fails. Joining again gets a plan without the nodes the coordinator has
  // since found dead or stopped, at a later round.
  void catch_up_with_retries(std::uint64_t round) {
    constexpr int kAttempts = 3;
    for (int attempt = 1;; ++attempt) {
      try {
        catch_up(round);
        return;
      } catch (const Error& err) {
        if (err.kind() != ErrorKind::Peer || attempt == kAttempts) throw;
        spdlog::warn("catching up at round {} failed (attempt {} of {}): {}; joining again for a newer plan", round,
                     attempt, kAttempts, err.what());
      }
      engine_.reset();
      auto [plan, next_round] = join(round_);
      if (next_round == 0)
        raise(ErrorKind::Peer, "the coordinator of run '{}' says node {} has nothing to catch up, yet it was catching "
              "up at round {}", config_.sync.effective_run_id(config_.run), config_.run.node_id, round);
      plan_ = plan;
      round = next_round;
      engine_ = make_engine();
    }
  }

  void after_step(const StepStats& s) {
    if (heartbeat_)
      heartbeat_->update([&](NodeProgress& p) {
        p.step = s.step;
        p.loss = s.loss;
        p.tokens_per_s = s.tokens_per_s;
        p.peak_rss_bytes = s.peak_rss;
      });
    metrics_.step(s);
    goodput_.step(s.seconds);
    step_seconds_ = step_seconds_ <= 0 ? s.seconds : 0.8 * step_seconds_ + 0.2 * s.seconds;
    bool landed = false;
    if (in_flight_ && s.step == in_flight_->land_step()) {
      land_round(s.step);
      landed = true;
    }
    if (is_round_step(config_, s.step)) {
      if (overlap()) {
        start_round(s.step);  // lands at once when max_delay is 0 and at the last step
      } else {
        ++round_;
        const auto t0 = std::chrono::steady_clock::now();
        SyncRoundReport r = run_round(round_, s.step);
        held_for_round(s.step, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
        log_round(r, 0);
        round_step_ = s.step;
      }
      landed = landed || !in_flight_;
    }
    metrics_.goodput(goodput_);
    // Landing steps and round steps never meet (max_delay < every) but at the last step, whose
    // round lands at once: at most one after_round per step, as the other ranks expect.
    if (in_flight_) defer_checkpoint();
    else if (landed) after_round(s.step);
    else checkpoint(nullptr);
  }

  bool overlap() const { return config_.sync.overlap; }

  // Training held for a round after `step`; the last step's round is outside the goodput window.
  void held_for_round(std::int64_t step, double seconds) {
    if (step != config_.train.steps) goodput_.waited(seconds);
  }

  // Round round_ + 1 from the weights of step `step`, landing sync.max_delay steps later (at
  // once at the last step: nothing is left to overlap with).
  void start_round(std::int64_t step) {
    const std::int64_t land = step == config_.train.steps ? step : std::min(step + config_.sync.delay(), config_.train.steps);
    const std::uint64_t round = round_ + 1;
    in_flight_ = std::make_unique<RoundInFlight>(*engine_, mirror_, round, step, land, round_timeout(land - step),
                                                 engine_->fragment_of(round, step == config_.train.steps));
    metrics_.round_in_flight(round);
    if (heartbeat_) heartbeat_->update([&](NodeProgress& p) { p.round_in_flight = round; });
    if (!dump_dir_.empty())
      dump_params(mirror_.params(), engine_->tensors_of(in_flight_->fragment()),
                  fmt::format("{}/round{}_pre.safetensors", dump_dir_, round));
    if (land == step) land_round(step);
  }

  // sync.late: skip — a round's deadline is the time its steps in flight take (from the recent
  // step time), so training never waits for the network; otherwise sync.round_timeout_s.
  double round_timeout(std::int64_t steps_in_flight) const {
    if (config_.sync.late != "skip" || steps_in_flight == 0 || step_seconds_ <= 0) return 0;
    const double budget = 0.95 * static_cast<double>(steps_in_flight) * step_seconds_;
    return std::min(config_.sync.round_timeout_s, std::max(budget, 0.1));
  }

  // The round in flight lands at this step boundary (waiting for it if it has not finished).
  void land_round(std::int64_t step) {
    const std::uint64_t round = in_flight_->round();
    const int fragment = in_flight_->fragment();
    if (!dump_dir_.empty())
      dump_model(trainer_, fmt::format("{}/round{}_landing.safetensors", dump_dir_, round));
    RoundInFlight::Landed l = in_flight_->land(step);
    in_flight_.reset();
    if (!dump_dir_.empty()) {
      dump_params(mirror_.params(), engine_->tensors_of(fragment),
                  fmt::format("{}/round{}_post.safetensors", dump_dir_, round));
      dump_model(trainer_, fmt::format("{}/round{}_landed.safetensors", dump_dir_, round));
    }
    round_ = round;
    // The engine's error-feedback state goes with the weights of right after a round: only a
    // round that landed at its own step leaves the model there.
    if (l.delay == 0) round_step_ = step;
    held_for_round(step, l.wait_seconds + l.apply_seconds);
    if (l.wait_seconds > 0.05 && l.delay > 0)
      spdlog::warn("sync: round {} was not done {} steps after its snapshot: training waited {:.2f} s for it (rounds "
                   "take {:.1f} s, steps {:.2f} s here: sync.max_delay {} would hide it)", round, l.delay, l.wait_seconds,
                   l.report.seconds, step_seconds_, static_cast<std::int64_t>(std::ceil(l.report.seconds / step_seconds_)));
    // With sync.late: skip a peer that misses the deadline (slow, behind or gone) is left out of
    // the round, whatever the last error it gave.
    if (config_.sync.late == "skip" && l.delay > 0 && !l.report.skipped.empty())
      spdlog::warn("sync: round {} ended at its deadline ({} steps of training, {:.2f} s; sync.late: skip) without "
                   "node(s) {}; raise sync.max_delay or use int8 deltas if this repeats", round, l.delay,
                   l.report.seconds, skipped_text(l.report));
    metrics_.round_in_flight(0);
    if (heartbeat_) heartbeat_->update([&](NodeProgress& p) {
      p.round_in_flight = 0;
      p.round_delay = l.delay;
    });
    log_round(l.report, l.delay);
  }

  // After a round has landed at `step`: the shard (with the engine's residuals when the weights
  // are those of right after the round), the coordinator's next plan, the node's other ranks.
  void after_round(std::int64_t step) {
    if (checkpoint_due(trainer_) || checkpoint_deferred_) {
      const auto carry = round_step_ == step ? engine_->carry() : std::nullopt;
      checkpoint(carry ? &*carry : nullptr, /*force=*/checkpoint_deferred_);
      checkpoint_deferred_ = false;
    }
    if (coordinator_ && step != config_.train.steps) {
      auto next = plan_for(round_ + 1);
      if (next && next->version != plan_.version) switch_plan(*next);
    }
    if (group_) {
      const auto t0 = std::chrono::steady_clock::now();
      share_from_leader(*group_, trainer_, round_);
      std::int64_t bytes = 0;
      for (const auto& p : trainer_.model()->parameters()) bytes += static_cast<std::int64_t>(p.nbytes());
      spdlog::info("ranks round {:>3}: weights to the node's {} other rank(s): {} in {:.3f} s", round_,
                   group_->ranks() - 1, format_bytes(static_cast<double>(bytes)),
                   std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
      dump_rank_weights(trainer_, 0, round_);
    }
  }

  // A shard falls due while a round is in flight: it is written when the round lands, so that a
  // resumed run has nothing in flight and continues exactly as this one does.
  void defer_checkpoint() {
    if (!checkpoint_due(trainer_) || checkpoint_deferred_) return;
    checkpoint_deferred_ = true;
    spdlog::info("checkpoint: the shard due at step {} is written when round {} lands (step {})", trainer_.step_count(),
                 in_flight_->round(), in_flight_->land_step());
  }

  // A shard when checkpoint.every says so, timed for the metrics.
  void checkpoint(const SyncCarry* carry, bool force = false) {
    if (!force && !checkpoint_due(trainer_)) return;
    const auto t0 = std::chrono::steady_clock::now();
    spdlog::info("checkpoint: wrote {}", write_shard(trainer_, round_, carry));
    metrics_.checkpoint_written(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }

  // One round on the sync buffers: the model's weights go to them before (one device-to-host
  // copy on a GPU) and come back after.
  SyncRoundReport run_round(std::uint64_t round, std::int64_t step) {
    const int fragment = engine_->fragment_of(round, step == config_.train.steps);
    const auto& tensors = engine_->tensors_of(fragment);
    const auto* only = fragment == kWholeModel ? nullptr : &tensors;
    mirror_.to_host(only);
    if (!dump_dir_.empty())
      dump_params(mirror_.params(), tensors, fmt::format("{}/round{}_pre.safetensors", dump_dir_, round));
    SyncRoundReport r = engine_->run_round(round, step, 0, fragment);
    if (!dump_dir_.empty())
      dump_params(mirror_.params(), tensors, fmt::format("{}/round{}_post.safetensors", dump_dir_, round));
    mirror_.to_model(only);
    return r;
  }

  void log_goodput() {
    if (goodput_.wall_seconds() <= 0) return;
    spdlog::info("goodput {:.1f}%: {:.1f} s in training steps of {:.1f} s from the first step to the last; {:.1f} s "
                 "of it held for sync rounds{}", 100 * goodput_.ratio(), goodput_.step_seconds(), goodput_.wall_seconds(),
                 goodput_.waited_seconds(), overlap() ? fmt::format(" (overlap on, max_delay {})", config_.sync.delay()) : "");
    if (MetricsLog* m = trainer_.metrics())
      m->write_line(nlohmann::json{{"type", "goodput"}, {"ratio", goodput_.ratio()}, {"step_seconds", goodput_.step_seconds()},
                                   {"wall_seconds", goodput_.wall_seconds()}, {"waited_seconds", goodput_.waited_seconds()},
                                   {"overlap", overlap()}, {"max_delay", config_.sync.delay()}}
                        .dump());
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

  // `delay`: the steps trained between the round's snapshot and its landing (sync.overlap).
  void log_round(const SyncRoundReport& r, std::int64_t delay) {
    metrics_.round(r, plan_.members.size(), *engine_, delay);
    spdlog::info("sync  round {:>3} at step {:>5}{}{} | in {} | out {} (total) | {:.2f} s (encode {:.2f}) | skipped: {}{}", r.round,
                 r.step, overlap() ? fmt::format(" landed at {:>5}", r.step + delay) : "",
                 engine_->fragments() == 1 ? ""
                 : r.fragment == kWholeModel ? " (whole model)"
                                             : fmt::format(" (fragment {}/{})", r.fragment + 1, engine_->fragments()),
                 format_bytes(static_cast<double>(r.bytes_in)), format_bytes(static_cast<double>(bytes_out_ + r.bytes_out)),
                 r.seconds, r.encode_s, skipped_text(r), r.merged ? fmt::format(" | merged experts, alpha {:.4f}", r.merge_alpha) : "");
    if (MetricsLog* m = trainer_.metrics()) {
      nlohmann::json skipped = nlohmann::json::array();
      for (const auto& k : r.skipped) skipped.push_back({{"peer", k.peer}, {"reason", k.reason}});
      nlohmann::json by_peer = nlohmann::json::object();
      for (const auto& b : r.by_peer)
        by_peer[std::to_string(b.peer)] = {{"in", b.in}, {"out_total", b.out_total}};
      m->write_line(nlohmann::json{{"type", "sync"}, {"round", r.round}, {"step", r.step}, {"seconds", r.seconds},
                                   {"bytes_in", r.bytes_in}, {"bytes_out_total", bytes_out_ + r.bytes_out},
                                   {"skipped", skipped}, {"by_peer", by_peer}, {"merged", r.merged}, {"merge_alpha", r.merge_alpha},
                                   {"plan", plan_.version}, {"members", plan_.members.size()},
                                   {"landed_step", r.step + delay}, {"delay", delay}, {"fragment", r.fragment},
                                   {"deadline_s", r.deadline_s}, {"resumed_streams", r.resumed_streams},
                                   {"encode_s", r.encode_s}}
                        .dump());
    }
    if (heartbeat_)
      heartbeat_->update([&](NodeProgress& p) {
        p.round = r.round;
        p.last_sync_unix_s = unix_now();
        p.last_sync_bytes_in = r.bytes_in;
        p.bytes_in_total = bytes_in_ + engine_->bytes_received();
        p.bytes_out_total = bytes_out_ + engine_->bytes_sent();
        const NodeRefusals& refused = metrics_.refusals();
        p.rejected_payloads = refused.payloads;
        p.refused_calls = refused.calls;
        p.last_refusal = refused.last;
      });
  }

  Config config_;
  NodeGroup* group_;  // the node's other ranks (null: this process is the whole node)
  Trainer trainer_;
  ModelParamMirror mirror_;  // the sync engine's view of the weights
  NodeMetrics metrics_;
  std::string dump_dir_;
  std::unique_ptr<CoordinatorClient> coordinator_;
  std::unique_ptr<Heartbeat> heartbeat_;
  std::unique_ptr<SyncEngine> engine_;
  std::unique_ptr<RoundInFlight> in_flight_;  // sync.overlap; uses engine_ and mirror_
  bool checkpoint_deferred_ = false;          // a shard fell due while a round was in flight
  double step_seconds_ = 0;                   // moving average of the step time (sync.late: skip)
  Goodput goodput_;
  MembershipPlan plan_;
  std::uint64_t round_ = 0;
  std::int64_t round_step_ = -1;  // the step of the last completed round (a shard at it can carry sync state)
  std::uint64_t bytes_in_ = 0, bytes_out_ = 0;  // of engines replaced by plan changes
};

// Ranks 1..K-1 of a node: the same trainer on their slice of each batch; rank 0's state after
// every round; no sync service, coordinator, checkpoints or evaluation of their own.
void run_follower(const Config& config, NodeGroup& group, GradientSync* grad_sync) {
  Trainer trainer(config, TrainerOptions{.write_outputs = false, .progress = false, .evaluate = false,
                                         .grad_sync = grad_sync});
  resume_from_config(trainer);  // the shard rank 0 resumes from (no shard is written before the first share)
  share_from_leader(group, trainer, 0);
  trainer.set_after_step([&](const StepStats& s) {
    if (!is_landing_step(config, s.step)) return;
    const std::uint64_t round = share_from_leader(group, trainer, 0);
    dump_rank_weights(trainer, group.rank(), round);
  });
  trainer.set_should_stop([&] { return stop_agreed(&group); });
  trainer.run();
}

}  // namespace

void run_node_process(const Config& config, const RankContext& context) {
  if (context.ranks == 1) {
    NodeDaemon(config, nullptr, nullptr).run();
    return;
  }
  const DevicePlan plan = resolve_device_plan(config, context.rank);
  const std::string backend = resolve_backend(config, plan.device);
  NodeGroup group(context, backend, plan.device, config.node.timeout_s);
  if (context.leader())
    spdlog::info("node {}: {} ranks, {} process group on {}, gradient buckets of {} MiB", config.run.node_id,
                 context.ranks, backend, plan.device.is_cuda() ? "cuda:0.." : "the CPU", config.node.bucket_mb);
  auto grad_sync = group.make_gradient_sync(config.node.bucket_mb);
  if (context.leader()) NodeDaemon(config, &group, grad_sync.get()).run();
  else run_follower(config, group, grad_sync.get());
}

}  // namespace spes
