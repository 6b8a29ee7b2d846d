#include "spes/node/metrics.h"

#include <spdlog/spdlog.h>

#include <chrono>

#include "spes/util/log.h"

namespace spes {

std::string skip_reason_class(const std::string& reason) {
  auto has = [&](const char* s) { return reason.find(s) != std::string::npos; };
  if (has("rejected payload")) {
    if (has("finite") || has("NaN") || has("Inf")) return "nonfinite";
    if (has("shape") || has("size")) return "shape";
    if (has("change")) return "too_large_change";
    if (has("checksum") || has("crc")) return "checksum";
    return "rejected";
  }
  if (has("Deadline") || has("deadline") || has("(4)")) return "deadline";
  if (has("(14)") || has("unavailable") || has("Unavailable")) return "unavailable";
  if (has("(16)") || has("(7)") || has("token") || has("refused")) return "refused";
  return "other";
}

namespace {
double steady_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}
}  // namespace

void Goodput::step(double seconds) {
  last_end_ = steady_seconds();
  if (first_start_ < 0) first_start_ = last_end_ - seconds;
  in_steps_ += seconds;
}
void Goodput::waited(double seconds) { waited_ += seconds; }
double Goodput::wall_seconds() const { return first_start_ < 0 ? 0 : last_end_ - first_start_; }
double Goodput::ratio() const {
  const double wall = wall_seconds();
  return wall > 0 ? std::min(1.0, in_steps_ / wall) : 0;
}

NodeMetrics::NodeMetrics(const Config& c) {
  if (c.metrics.listen.empty()) return;
  server_ = std::make_unique<MetricsServer>(
      c.metrics.listen, MetricLabels{{"run", c.sync.effective_run_id(c.run)}, {"node", std::to_string(c.run.node_id)}});
  spdlog::info("metrics: Prometheus on http://{}/metrics", server_->address());
}

void NodeMetrics::step(const StepStats& s) {
  if (!server_) return;
  tokens_ += static_cast<double>(s.tokens);
  server_->set_gauge("spes_train_step", "Optimizer steps done", static_cast<double>(s.step));
  server_->set_counter("spes_train_tokens_total", "Training tokens processed by the node", tokens_);
  server_->set_gauge("spes_train_tokens_per_second", "Training tokens per second in the last step", s.tokens_per_s);
  server_->set_gauge("spes_train_step_seconds", "Wall time of the last step", s.seconds);
  server_->set_gauge("spes_train_loss", "Training loss of the last step (with the auxiliary terms)", s.loss);
  server_->set_gauge("spes_train_cross_entropy", "Cross-entropy of the last step", s.ce);
  server_->set_gauge("spes_train_learning_rate", "Learning rate of the last step", s.lr);
  server_->set_gauge("spes_train_grad_norm", "Gradient norm of the last step, before clipping", s.grad_norm);
  server_->set_gauge("spes_train_mfu_ratio", "Model FLOPs utilisation of the last step (0-1) against the measured matmul peak", s.mfu);
  server_->set_gauge("spes_process_resident_memory_peak_bytes", "Peak resident memory of the process", static_cast<double>(s.peak_rss));
  server_->set_gauge("spes_device_memory_peak_bytes", "Peak GPU memory in live tensors (0 on the CPU)", static_cast<double>(s.peak_device_bytes));
}

std::uint64_t EngineTotal::update(std::uint64_t engine_figure) {
  if (engine_figure < last_) before_ += last_;  // a new engine counts from zero
  last_ = engine_figure;
  return before_ + last_;
}

void NodeMetrics::round(const SyncRoundReport& r, std::size_t members, const SyncEngine& engine, std::int64_t delay) {
  const std::uint64_t calls_refused = refused_calls_.update(engine.calls_refused());
  if (const std::uint64_t calls = suspicious_calls_.update(engine.suspicious_calls()); calls > refusals_.calls) {
    refusals_.calls = calls;
    refusals_.last = engine.last_suspicious_call();
  }
  for (const auto& k : r.skipped)
    if (k.reason.find("rejected payload") != std::string::npos) {
      ++refusals_.payloads;
      refusals_.last = printable(fmt::format("round {}: refused node {}'s payload: {}", r.round, k.peer, k.reason), 300);
    }
  if (!server_) return;
  ++rounds_;
  round_seconds_ += r.seconds;
  server_->set_gauge("spes_sync_round", "Last sync round completed", static_cast<double>(r.round));
  server_->set_gauge("spes_sync_round_duration_seconds", "Wall time of the last round (without sync.overlap training waits for it)", r.seconds);
  server_->set_gauge("spes_sync_round_delay_steps", "Steps between the last round's snapshot and its landing (sync.overlap)",
                     static_cast<double>(delay));
  server_->set_counter("spes_sync_rounds_total", "Sync rounds completed", static_cast<double>(rounds_));
  server_->set_counter("spes_sync_round_seconds_total", "Wall time spent in sync rounds", round_seconds_);
  server_->set_gauge("spes_sync_round_deadline_seconds",
                     "Deadline of the last round (adaptive: sync.deadline_factor x the slowest recent clean round)",
                     r.deadline_s);
  resumed_ += static_cast<double>(r.resumed_streams);
  server_->set_counter("spes_sync_resumed_streams_total",
                       "Transfers that broke off mid-stream and resumed at the chunk they had reached", resumed_);
  for (const auto& b : r.by_peer) {
    const MetricLabels peer{{"peer", std::to_string(b.peer)}};
    received_[b.peer] += static_cast<double>(b.in);
    server_->set_counter("spes_sync_received_bytes_total", "Sync payload bytes received, by peer", received_[b.peer], peer);
    server_->set_counter("spes_sync_sent_bytes_total", "Sync payload bytes this node's service sent, by peer",
                         static_cast<double>(sent_[b.peer].update(b.out_total)), peer);
  }
  for (const auto& k : r.skipped) {
    const std::string why = skip_reason_class(k.reason);
    server_->set_counter("spes_sync_peer_skips_total", "Rounds in which a peer was skipped, by peer and reason",
                         ++skips_[{k.peer, why}], {{"peer", std::to_string(k.peer)}, {"reason", why}});
    if (k.reason.find("rejected payload") != std::string::npos)
      server_->set_counter("spes_sync_rejected_payloads_total", "Payloads refused by validation, by reason",
                           ++rejected_[why], {{"reason", why}});
  }
  auto add_by_encoding = [&](const std::map<std::string, std::uint64_t>& engine_counts,
                             std::map<std::string, EngineTotal>& totals, const std::string& name, const std::string& help) {
    for (const auto& [encoding, bytes] : engine_counts)
      server_->set_counter(name, help, static_cast<double>(totals[encoding].update(bytes)), {{"encoding", encoding}});
  };
  add_by_encoding(engine.bytes_received_by_encoding(), received_by_encoding_,
                  "spes_sync_received_bytes_by_encoding_total", "Sync payload bytes received, by wire encoding");
  add_by_encoding(engine.bytes_sent_by_encoding(), sent_by_encoding_,
                  "spes_sync_sent_bytes_by_encoding_total", "Sync payload bytes this node's service sent, by wire encoding");
  const double alive = static_cast<double>(members > 0 ? members - 1 : 0) - static_cast<double>(r.skipped.size());
  server_->set_gauge("spes_sync_peers_alive", "Other members that took part in the last round", std::max(0.0, alive));
  server_->set_counter("spes_sync_calls_refused_total", "Calls to the sync service refused (token, run, plan)",
                       static_cast<double>(calls_refused));
  server_->set_counter("spes_sync_suspicious_calls_total",
                       "Refused calls that only a hostile or misconfigured caller provokes (token, run, arguments)",
                       static_cast<double>(refusals_.calls));
}

void NodeMetrics::round_in_flight(std::uint64_t round) {
  if (!server_) return;
  server_->set_gauge("spes_sync_round_in_flight", "sync.overlap: the round running behind training (0 = none)",
                     static_cast<double>(round));
}

void NodeMetrics::goodput(const Goodput& g) {
  if (!server_) return;
  server_->set_gauge("spes_node_goodput_ratio", "Time in training steps / wall time since the first step (0-1)", g.ratio());
  server_->set_counter("spes_sync_wait_seconds_total", "Seconds training held for sync rounds (blocking rounds, late "
                       "overlapped rounds, applying results)", g.waited_seconds());
}

void NodeMetrics::checkpoint_written(double seconds) {
  if (!server_) return;
  server_->set_gauge("spes_checkpoint_write_seconds", "Wall time of the last checkpoint shard write", seconds);
  server_->set_counter("spes_checkpoints_written_total", "Checkpoint shards written", static_cast<double>(++checkpoints_));
}

}  // namespace spes
