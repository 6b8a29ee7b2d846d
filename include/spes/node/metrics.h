// A node's Prometheus metrics (metrics.listen; names and meanings in docs/operations.md): the
// trainer's step figures, each sync round's time, bytes per peer, skips and rejected payloads by
// reason, and checkpoint writes. Off (every call a no-op) when metrics.listen is empty.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "spes/config/config.h"
#include "spes/sync/engine.h"
#include "spes/train/metrics.h"
#include "spes/util/metrics_server.h"

namespace spes {

// Goodput: the share of wall time spent in training steps, from the start of the first step to
// the end of the last (the final round, after the last step, is outside it).
class Goodput {
 public:
  void step(double seconds);    // right after a step of `seconds`
  void waited(double seconds);  // training held for a round (waiting, applying its result)
  double ratio() const;         // 0 before the first step
  double step_seconds() const { return in_steps_; }
  double wall_seconds() const;
  double waited_seconds() const { return waited_; }

 private:
  double in_steps_ = 0, waited_ = 0;
  double first_start_ = -1, last_end_ = 0;  // steady-clock seconds
};

// A figure an engine counts from zero, summed across the node's engines (a new one per plan).
class EngineTotal {
 public:
  std::uint64_t update(std::uint64_t engine_figure);  // the running total
 private:
  std::uint64_t before_ = 0, last_ = 0;
};

// What this node refused, for `coordinator status`: payloads that failed validation, calls to its
// sync service that only a hostile or misconfigured caller provokes, and the last reason.
struct NodeRefusals {
  std::uint64_t payloads = 0, calls = 0;
  std::string last;
};

class NodeMetrics {
 public:
  explicit NodeMetrics(const Config& config);
  bool enabled() const { return server_ != nullptr; }
  void step(const StepStats& s);
  // After a round: its report, the members of the plan it ran under, the engine's running
  // figures (refused calls, bytes received by encoding) and the steps it landed after its snapshot.
  void round(const SyncRoundReport& r, std::size_t members, const SyncEngine& engine, std::int64_t delay = 0);
  // sync.overlap: the round now running behind training (0 = none), and the running goodput.
  void round_in_flight(std::uint64_t round);
  void goodput(const Goodput& g);
  void checkpoint_written(double seconds);
  // Kept whether or not metrics.listen is set (the coordinator's heartbeat carries them).
  const NodeRefusals& refusals() const { return refusals_; }

 private:
  std::unique_ptr<MetricsServer> server_;
  double tokens_ = 0, round_seconds_ = 0, resumed_ = 0;
  std::uint64_t rounds_ = 0, checkpoints_ = 0;
  EngineTotal refused_calls_, suspicious_calls_;
  NodeRefusals refusals_;
  std::map<int, double> received_;  // per peer
  std::map<int, EngineTotal> sent_;  // per peer (the engine's figure starts again at a plan change)
  std::map<std::pair<int, std::string>, double> skips_;
  std::map<std::string, double> rejected_;
  std::map<std::string, EngineTotal> received_by_encoding_, sent_by_encoding_;
};

// A short, bounded label for why a peer was skipped (Prometheus labels must not be free text):
// deadline, unavailable, refused, nonfinite, shape, too_large_change, checksum, rejected, other.
std::string skip_reason_class(const std::string& reason);

}  // namespace spes
