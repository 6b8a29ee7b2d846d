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

class NodeMetrics {
 public:
  explicit NodeMetrics(const Config& config);
  bool enabled() const { return server_ != nullptr; }
  void step(const StepStats& s);
  // After a round: its report, the members of the plan it ran under, and the engine's running
  // figures (refused calls, bytes received by encoding).
  void round(const SyncRoundReport& r, std::size_t members, const SyncEngine& engine);
  void checkpoint_written(double seconds);

 private:
  std::unique_ptr<MetricsServer> server_;
  double tokens_ = 0, round_seconds_ = 0;
  std::uint64_t rounds_ = 0, checkpoints_ = 0, refused_before_ = 0, refused_last_ = 0;
  std::map<int, double> received_, sent_, sent_last_;  // per peer: totals, and the engine's last figure
  std::map<std::pair<int, std::string>, double> skips_;
  std::map<std::string, double> rejected_;
  std::map<std::string, double> by_encoding_, by_encoding_last_;  // totals, and the engine's last figure
};

// A short, bounded label for why a peer was skipped (Prometheus labels must not be free text):
// deadline, unavailable, refused, nonfinite, shape, too_large_change, checksum, rejected, other.
std::string skip_reason_class(const std::string& reason);

}  // namespace spes
