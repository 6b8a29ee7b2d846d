// The cluster file: one run, its base training config, its nodes and how experts are assigned.
// `spes coordinator plan` turns it into one node config per node; `serve` reads it for the
// membership rules. Paths in it are relative to the directory spes runs in, like configs.
//
//   run: local-small                  # run id every node and the coordinator check
//   config: configs/small.yaml        # base training config
//   out_dir: runs/local-small         # node i writes to out_dir/node{i}
//   token_file: runs/token            # or token: ...; and tls: {ca, cert, key} or insecure: true
//   # per-node certificates (`spes ca`, docs/security.md): tls: {ca, cert, key, node_dir: tls}
//   assignment: contiguous            # contiguous | round_robin | explicit
//   set: {train.steps: 200, sync.every: 20}   # overrides for every node's config
//   coordinator: {address: 127.0.0.1:7000, heartbeat_s: 1, dead_after_s: 10, grace_s: 20}
//   nodes:
//     - {id: 0, address: 127.0.0.1:7100}    # experts: [..] only with assignment: explicit
#pragma once

#include <map>
#include <string>
#include <vector>

#include "spes/config/config.h"

namespace spes {

enum class AssignmentStrategy { Contiguous, RoundRobin, Explicit };
const char* assignment_strategy_name(AssignmentStrategy s);

struct ClusterNode {
  int id = 0;
  std::string address;       // host:port of its SyncService
  std::vector<int> experts;  // only with explicit assignment
  std::string metrics;       // host:port of its Prometheus metrics (metrics.listen); empty = off
};

struct CoordinatorSettings {
  std::string address;        // host:port the coordinator serves on; empty = no coordinator
  double heartbeat_s = 2;     // how often nodes report
  double dead_after_s = 15;   // silence after which a node is marked dead
  double grace_s = 30;        // dead this long → its experts go to live nodes
  std::string state;          // state file; empty = out_dir/coordinator/state.json
  std::string metrics;        // host:port of the coordinator's Prometheus metrics; empty = off
  std::string http;           // host:port of the run's live page (docs/operations.md); empty = off
};

struct ClusterConfig : Credentials {  // the run's token and TLS files, shared by every node
  std::string run;
  std::string config;  // base training config
  std::string out_dir;
  AssignmentStrategy assignment = AssignmentStrategy::Contiguous;
  int replication = 1;                      // owners per expert (only 1 is supported)
  std::int64_t experts_per_layer = 0;       // 0 = take model.n_experts from the base config
  std::vector<std::pair<std::string, std::string>> overrides;  // key, YAML value
  CoordinatorSettings coordinator;
  std::vector<ClusterNode> nodes;           // sorted by id
  // Folder of per-node certificates node-<id>.pem / node-<id>.key (`spes ca issue`); empty =
  // every node uses tls.cert / tls.key. tls.cert is then the coordinator's own.
  std::string tls_node_dir;
  std::string node_cert(int id) const;
  std::string node_key(int id) const;

  std::string source;
  std::map<std::string, int> key_lines;
  std::string where(const std::string& key) const;
  std::string state_path() const;
};

// Reads and validates a cluster file; Error(Config) naming file, key and line.
ClusterConfig load_cluster(const std::string& path);
ClusterConfig parse_cluster(const std::string& yaml_text, const std::string& source_name);

// expert owners: result[node position in cluster.nodes] = experts it trains. Refuses (Error(Config),
// saying why) experts not divisible by nodes for contiguous, an explicit list that leaves an expert
// unowned or owned twice, and replication other than 1.
std::vector<std::vector<int>> assign_experts(const ClusterConfig& cluster, std::int64_t n_experts);

// Ownership after membership changes: each expert goes to its planned owner when that node is
// live, else stays with its current owner when live, else to the live node with the fewest
// experts (lowest id on ties). `planned` and `current` map node id → experts; `live` is sorted.
std::map<int, std::vector<int>> reassign_experts(const std::map<int, std::vector<int>>& planned,
                                                 const std::map<int, std::vector<int>>& current,
                                                 const std::vector<int>& live, std::int64_t n_experts);

// The base config with the cluster's `set:` overrides, as a one-node config (sync off): the
// model, data and training settings every node shares.
struct Config;
Config load_base_config(const ClusterConfig& cluster);

struct PlanFiles {
  std::vector<std::string> node_configs;  // out/node{id}.yaml, in node order
  std::string assignment_table;           // out/assignment.txt
};
// Writes a ready node config per node (base config + overrides + run/sync/coordinator keys),
// each validated by loading it back, and the assignment table. Nothing is written on error.
PlanFiles write_plan(const ClusterConfig& cluster, const std::string& out_dir);

}  // namespace spes
