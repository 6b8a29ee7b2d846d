#include "spes/coord/metrics.h"

#include <string>

namespace spes {

void write_cluster_metrics(const ClusterStatus& s, MetricsSink& sink) {
  sink.gauge("spes_coordinator_round", "Highest round any node has asked a plan for", static_cast<double>(s.round));
  sink.gauge("spes_coordinator_plan_version", "Version of the newest membership plan", static_cast<double>(s.plan.version));
  int alive = 0, dead = 0, done = 0;
  for (const auto& n : s.nodes) {
    if (n.progress.done) ++done;
    else if (n.alive) ++alive;
    else ++dead;
    const MetricLabels node{{"node", std::to_string(n.id)}};
    const NodeProgress& p = n.progress;
    sink.gauge("spes_node_up", "1 while the node sends heartbeats (or has finished), else 0",
               n.alive || p.done ? 1.0 : 0.0, node);
    sink.gauge("spes_node_member", "1 when the newest plan has the node as a member", n.member ? 1.0 : 0.0, node);
    sink.gauge("spes_node_silent_seconds", "Seconds since the node's last heartbeat (-1: never joined)", n.silent_s, node);
    sink.gauge("spes_node_step", "Last optimizer step the node reported", static_cast<double>(p.step), node);
    sink.gauge("spes_node_round", "Last sync round the node completed", static_cast<double>(p.round), node);
    sink.gauge("spes_node_loss", "Training loss of the node's last step", p.loss, node);
    sink.gauge("spes_node_tokens_per_second", "Training tokens per second of the node's last step", p.tokens_per_s, node);
    sink.gauge("spes_node_experts", "Experts per layer the node trains", static_cast<double>(p.experts.size()), node);
    sink.gauge("spes_node_resident_memory_peak_bytes", "Peak resident memory of the node's process", static_cast<double>(p.peak_rss_bytes), node);
    sink.counter("spes_node_sync_received_bytes_total", "Sync payload bytes the node received", static_cast<double>(p.bytes_in_total), node);
    sink.counter("spes_node_sync_sent_bytes_total", "Sync payload bytes the node's service sent", static_cast<double>(p.bytes_out_total), node);
    sink.counter("spes_node_rejected_payloads_total", "Peer payloads the node refused (failed validation)",
                 static_cast<double>(p.rejected_payloads), node);
    sink.counter("spes_node_refused_calls_total", "Calls to the node's sync service refused for token, run or arguments",
                 static_cast<double>(p.refused_calls), node);
  }
  sink.counter("spes_coordinator_refused_calls_total", "Calls the coordinator refused (token, run, node, address)",
               static_cast<double>(s.refused_calls));
  sink.gauge("spes_coordinator_nodes", "Nodes by state", alive, {{"state", "alive"}});
  sink.gauge("spes_coordinator_nodes", "Nodes by state", dead, {{"state", "dead"}});
  sink.gauge("spes_coordinator_nodes", "Nodes by state", done, {{"state", "done"}});
}

}  // namespace spes
