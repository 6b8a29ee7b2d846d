// The coordinator service and its client. The coordinator assigns experts, admits nodes, tracks
// heartbeats and hands out the peer list and round; it never carries weights. Its state (plans,
// membership, round) is a JSON file rewritten atomically on every change and reloaded on start,
// so a killed coordinator loses nothing. gRPC types stay in src/coord.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "spes/config/config.h"
#include "spes/coord/cluster.h"

namespace spes {

struct PlanMember {
  int id = 0;
  std::string address;
  std::vector<int> experts;
};

// The membership that trains from `effective_round` on.
struct MembershipPlan {
  std::uint64_t version = 0;
  std::uint64_t effective_round = 0;
  std::vector<PlanMember> members;  // sorted by id
  std::vector<int> observers;       // joining: fetch this plan's first round, contribute nothing

  const PlanMember* find(int id) const;
};

struct NodeProgress {
  std::int64_t step = 0;
  std::uint64_t round = 0;
  double loss = 0, tokens_per_s = 0;
  double last_sync_unix_s = 0;
  std::uint64_t last_sync_bytes_in = 0, bytes_in_total = 0, bytes_out_total = 0;
  std::int64_t peak_rss_bytes = 0;
  bool done = false;
  bool stopped = false;  // stopped early (signal), checkpoint written: gone until it rejoins
  std::vector<int> experts;
  std::uint64_t round_in_flight = 0;  // sync.overlap: the round running behind training (0 = none)
  std::int64_t round_delay = 0;       // steps from the last round's snapshot to its landing
  // What the node refused: peer payloads that failed validation, calls to its sync service with a
  // wrong token, run or arguments, and the last of either with its reason.
  std::uint64_t rejected_payloads = 0, refused_calls = 0;
  std::string last_refusal;
};

struct NodeStatusRow {
  int id = 0;
  std::string address;
  bool alive = false, member = false;
  double silent_s = -1;
  NodeProgress progress;
  std::string removed;  // removed by an operator: the reason (empty: not removed)
  // (step, loss) as the heartbeats reported them, thinned to at most a few thousand points;
  // filled by CoordinatorServer::status() for the dashboard (not sent by the Status call).
  std::vector<std::pair<std::int64_t, double>> loss_curve;
};

struct ClusterStatus {
  std::string run_id;
  std::uint64_t round = 0;
  MembershipPlan plan;
  std::vector<NodeStatusRow> nodes;
  std::uint64_t refused_calls = 0;  // calls the coordinator itself refused, and the last reason
  std::string last_refusal;
};

class CoordinatorServer {
 public:
  // Loads the cluster's base config (for the expert count) and the state file if there is one;
  // Error(Config) when the state file belongs to another run or cluster.
  explicit CoordinatorServer(const ClusterConfig& cluster);
  ~CoordinatorServer();
  // Binds cluster.coordinator.address (Error(Io) if taken) and starts the heartbeat monitor.
  void start();
  // Blocks until stop(), SIGINT/SIGTERM or, with exit_when_done, until every member reported done.
  void wait(bool exit_when_done);
  void stop();
  int port() const;
  // What `spes coordinator status` would show now (for the metrics endpoint).
  ClusterStatus status();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

class CoordinatorClient {
 public:
  // Same run token and TLS files as the node's sync service.
  explicit CoordinatorClient(const Config& node_config);
  // For `spes coordinator status`: token and TLS from the cluster file.
  explicit CoordinatorClient(const ClusterConfig& cluster);
  ~CoordinatorClient();

  // Joins (retrying for up to wait_s while the coordinator is unreachable); resumed_round is the
  // last round in the shard the node resumed from (0: none). Returns the latest plan and 0 when
  // the node needs no catching up (a run not started yet, or its shard holds the run's latest
  // round), else the round at which it catches up (it is an observer of that plan).
  // Error(Peer) when refused or unreachable.
  std::pair<MembershipPlan, std::uint64_t> join(int node_id, const std::string& address, double wait_s,
                                                std::uint64_t resumed_round = 0);
  // Sends a heartbeat; returns the latest plan version, or nullopt when the coordinator did not answer.
  std::optional<std::uint64_t> heartbeat(int node_id, const NodeProgress& progress);
  // The plan for `round` (the latest with effective_round <= round); nullopt when unreachable for wait_s.
  std::optional<MembershipPlan> plan_for(int node_id, std::uint64_t round, double wait_s);
  ClusterStatus status(double timeout_s);
  // An operator's removal of `node_id` (or, with readmit, lifting it); returns the latest plan.
  // Error(Peer) naming the coordinator's reason when refused (not the admin certificate, unknown
  // node, the last member).
  MembershipPlan remove(int node_id, const std::string& reason, bool readmit, double timeout_s);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace spes
