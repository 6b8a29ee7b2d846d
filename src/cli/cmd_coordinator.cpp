// spes coordinator plan | serve | status | remove | readmit
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <cstdio>

#include "commands.h"
#include "spes/coord/cluster.h"
#include "spes/coord/coordinator.h"
#include "spes/coord/dashboard.h"
#include "spes/coord/metrics.h"
#include "spes/util/metrics_server.h"
#include "spes/util/error.h"
#include "spes/util/fs.h"
#include "spes/util/log.h"
#include "spes/util/progress.h"
#include "spes/util/signals.h"

namespace spes::cli {
namespace {

void run_plan(const std::string& cluster_path, const std::string& out) {
  ClusterConfig cluster = load_cluster(cluster_path);
  PlanFiles files = write_plan(cluster, out);
  std::printf("%s", read_file(files.assignment_table).c_str());
  for (const auto& f : files.node_configs) std::printf("wrote %s\n", f.c_str());
  std::printf("wrote %s\n", files.assignment_table.c_str());
}

void run_serve(const std::string& cluster_path, bool exit_when_done, const std::string& log_level,
               const std::string& metrics_listen, const std::string& http_listen) {
  ClusterConfig cluster = load_cluster(cluster_path);
  if (!metrics_listen.empty()) cluster.coordinator.metrics = metrics_listen;
  if (!http_listen.empty()) cluster.coordinator.http = http_listen;
  if (cluster.coordinator.address.empty())
    raise(ErrorKind::Config, "{}: coordinator.address is required to serve", cluster.where("coordinator"));
  ensure_directory(cluster.out_dir + "/coordinator");
  init_logging(log_level, cluster.out_dir + "/coordinator/coordinator.log");
  install_stop_signals();
  CoordinatorServer server(cluster);
  server.start();
  std::unique_ptr<MetricsServer> metrics;
  if (!cluster.coordinator.metrics.empty()) {
    metrics = std::make_unique<MetricsServer>(cluster.coordinator.metrics, MetricLabels{{"run", cluster.run}});
    metrics->add_collector([&server](MetricsSink& sink) { write_cluster_metrics(server.status(), sink); });
    spdlog::info("coordinator: Prometheus metrics on http://{}/metrics", metrics->address());
  }
  std::unique_ptr<DashboardServer> dashboard;
  if (!cluster.coordinator.http.empty()) {
    dashboard = std::make_unique<DashboardServer>(cluster, server, cluster.coordinator.http);
    spdlog::info("coordinator: live page on http://{}/?token=<the run token>", dashboard->address());
  }
  server.wait(exit_when_done);
  server.stop();
  spdlog::info("coordinator: stopped");
}

// spes coordinator remove|readmit: the operator's call, then the plan it leaves.
void run_remove(const std::string& cluster_path, int node, const std::string& reason, bool readmit) {
  ClusterConfig cluster = load_cluster(cluster_path);
  if (std::none_of(cluster.nodes.begin(), cluster.nodes.end(), [&](const auto& n) { return n.id == node; }))
    raise(ErrorKind::Usage, "--node {}: {} has no such node", node, cluster_path);
  CoordinatorClient client(cluster);
  const MembershipPlan plan = client.remove(node, reason, readmit, 10.0);
  std::string table;
  for (const auto& m : plan.members) table += fmt::format(" node {}: {};", m.id, format_list(m.experts));
  std::printf("node %d %s run '%s'; plan %llu from round %llu:%s\n", node,
              readmit ? "may join again (it catches up when it does):" : "removed from", cluster.run.c_str(),
              static_cast<unsigned long long>(plan.version), static_cast<unsigned long long>(plan.effective_round),
              table.c_str());
}

}  // namespace

void print_cluster_status(const ClusterStatus& s) {
  const double now = std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  std::printf("run '%s' | round %llu | plan %llu (from round %llu)\n", s.run_id.c_str(),
              static_cast<unsigned long long>(s.round), static_cast<unsigned long long>(s.plan.version),
              static_cast<unsigned long long>(s.plan.effective_round));
  std::printf("%-4s %-21s %-7s %-12s %7s %5s %9s %8s %10s %10s %9s %9s %8s\n", "node", "address", "state", "experts", "step",
              "round", "in flight", "loss", "last sync", "last in", "tok/s", "rss", "refused");
  for (const auto& n : s.nodes) {
    const auto& p = n.progress;
    const char* state = !n.removed.empty() ? "removed" : !n.member ? "out" : p.done ? "done" : n.alive ? "alive" : n.silent_s < 0 ? "wait" : "dead";
    const std::string ago = p.last_sync_unix_s > 0 ? format_duration(now - p.last_sync_unix_s) + " ago" : "-";
    // "in flight": the round running behind training, else the delay the last one landed at.
    const std::string flight = p.round_in_flight > 0 ? fmt::format("round {}", p.round_in_flight)
                               : p.round > 0        ? fmt::format("+{} steps", p.round_delay)
                                                    : std::string("-");
    // "refused": peer payloads that failed validation / calls with a wrong token, run or arguments.
    const std::string refused = fmt::format("{}/{}", p.rejected_payloads, p.refused_calls);
    std::printf("%-4d %-21s %-7s %-12s %7lld %5llu %9s %8.4f %10s %10s %9s %9s %8s\n", n.id, n.address.c_str(), state,
                format_list(p.experts, "-").c_str(), static_cast<long long>(p.step), static_cast<unsigned long long>(p.round),
                flight.c_str(), p.loss, ago.c_str(), format_bytes(static_cast<double>(p.last_sync_bytes_in)).c_str(),
                format_count(p.tokens_per_s).c_str(), format_bytes(static_cast<double>(p.peak_rss_bytes)).c_str(),
                refused.c_str());
  }
  for (const auto& n : s.nodes)
    if (!n.removed.empty()) std::printf("node %d removed by an operator: %s\n", n.id, n.removed.c_str());
  bool any_refusal = s.refused_calls > 0;
  for (const auto& n : s.nodes) any_refusal = any_refusal || !n.progress.last_refusal.empty();
  if (!any_refusal) return;
  std::printf("refused (payloads/calls), the last of each:\n");
  if (s.refused_calls > 0)
    std::printf("  coordinator: %llu call(s); %s\n", static_cast<unsigned long long>(s.refused_calls), s.last_refusal.c_str());
  for (const auto& n : s.nodes)
    if (!n.progress.last_refusal.empty()) std::printf("  node %d: %s\n", n.id, n.progress.last_refusal.c_str());
}


void add_coordinator_commands(CLI::App& app) {
  auto* coord = app.add_subcommand("coordinator", "plan a cluster, run its coordinator, show its status");
  coord->require_subcommand(1);

  auto cluster = std::make_shared<std::string>();
  auto out = std::make_shared<std::string>();
  auto* plan = coord->add_subcommand("plan", "write one node config per node and the expert assignment table");
  plan->add_option("--cluster", *cluster, "cluster file (YAML)")->required();
  plan->add_option("--out", *out, "folder for node{i}.yaml and assignment.txt")->required();
  plan->callback([cluster, out] { run_plan(*cluster, *out); });

  auto exit_when_done = std::make_shared<bool>(false);
  auto log_level = std::make_shared<std::string>("info");
  auto* serve = coord->add_subcommand("serve", "run the coordinator: membership, heartbeats, reassignment");
  serve->add_option("--cluster", *cluster, "cluster file (YAML)")->required();
  serve->add_flag("--exit-when-done", *exit_when_done, "exit once every member node reported it finished");
  serve->add_option("--log-level", *log_level, "trace, debug, info, warn or error");
  auto metrics = std::make_shared<std::string>();
  serve->add_option("--metrics", *metrics, "serve Prometheus metrics on host:port (cluster file: coordinator.metrics)");
  auto http = std::make_shared<std::string>();
  serve->add_option("--http", *http, "serve the run's live page on host:port (cluster file: coordinator.http)");
  serve->callback([cluster, exit_when_done, log_level, metrics, http] {
    run_serve(*cluster, *exit_when_done, *log_level, *metrics, *http);
  });

  auto as_json = std::make_shared<bool>(false);
  auto* status = coord->add_subcommand("status", "show the nodes of a running cluster");
  status->add_option("--cluster", *cluster, "cluster file (YAML)")->required();
  status->add_flag("--json", *as_json, "print JSON instead of a table");
  status->callback([cluster, as_json] {
    CoordinatorClient client(load_cluster(*cluster));
    ClusterStatus s = client.status(5.0);
    if (*as_json) std::printf("%s\n", cluster_status_json(s, /*curves=*/false, 2).c_str());
    else print_cluster_status(s);
  });

  auto node = std::make_shared<int>(-1);
  auto reason = std::make_shared<std::string>();
  auto* remove = coord->add_subcommand("remove", "take a node out of a running cluster for good (e.g. a leaked key): "
                                                 "its experts go to the others, its calls are refused from then on");
  remove->add_option("--cluster", *cluster, "cluster file (YAML); with per-node certificates, tls: the admin's")->required();
  remove->add_option("--node", *node, "the node's id")->required();
  remove->add_option("--reason", *reason, "why (shown in the status and in the node's refusal)");
  remove->callback([cluster, node, reason] { run_remove(*cluster, *node, *reason, false); });
  auto* readmit = coord->add_subcommand("readmit", "lift a node's removal: it may join again and catches up");
  readmit->add_option("--cluster", *cluster, "cluster file (YAML); with per-node certificates, tls: the admin's")->required();
  readmit->add_option("--node", *node, "the node's id")->required();
  readmit->callback([cluster, node] { run_remove(*cluster, *node, "", true); });
}

}  // namespace spes::cli
