// CoordinatorServer: membership, plans and the round counter behind a small gRPC service.
#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>
#include <spdlog/spdlog.h>

#include <chrono>
#include <cmath>
#include <condition_variable>
#include <filesystem>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <thread>

#include "proto_convert.h"
#include "spes/coord/coordinator.h"
#include "spes/util/error.h"
#include "spes/util/progress.h"
#include "spes/util/fs.h"
#include "spes/util/log.h"
#include "spes/util/signals.h"
#include "spes/v1/coordinator.grpc.pb.h"

namespace spes {
using namespace coord_detail;
namespace {

using Clock = std::chrono::steady_clock;
constexpr double kStartupAllowanceS = 120;
using json = nlohmann::json;

json plan_json(const MembershipPlan& p) {
  json members = json::array();
  for (const auto& m : p.members) members.push_back({{"id", m.id}, {"address", m.address}, {"experts", m.experts}});
  return {{"version", p.version}, {"effective_round", p.effective_round}, {"members", members},
          {"observers", p.observers}};
}

MembershipPlan plan_from_json(const json& j) {
  MembershipPlan p;
  p.version = j.at("version").get<std::uint64_t>();
  p.effective_round = j.at("effective_round").get<std::uint64_t>();
  for (const auto& m : j.at("members"))
    p.members.push_back({m.at("id").get<int>(), m.at("address").get<std::string>(), m.at("experts").get<std::vector<int>>()});
  p.observers = j.value("observers", std::vector<int>{});
  return p;
}

struct NodeState {
  bool alive = true;
  bool joined = false;
  Clock::time_point last_seen;
  Clock::time_point dead_since;
  NodeProgress progress;
  std::vector<std::pair<std::int64_t, double>> loss_curve;  // (step, loss) from heartbeats

  // Keeps one point per reported step; past kMaxPoints every other point goes (older ones thinner).
  void record_loss() {
    constexpr std::size_t kMaxPoints = 4000;
    if (progress.step <= 0 || (!loss_curve.empty() && loss_curve.back().first >= progress.step)) return;
    loss_curve.emplace_back(progress.step, progress.loss);
    if (loss_curve.size() < kMaxPoints) return;
    std::vector<std::pair<std::int64_t, double>> thinned;
    for (std::size_t i = 0; i < loss_curve.size(); i += 2) thinned.push_back(loss_curve[i]);
    thinned.push_back(loss_curve.back());
    loss_curve = std::move(thinned);
  }
};

// Why a heartbeat's report cannot be true, or "" (docs/security.md): numbers finite and in range,
// step, round and byte counters never going back since the node joined, rounds no further than
// one past the highest round any node asked a plan for, experts that exist.
std::string implausible_report(const NodeProgress& now, const NodeProgress& before, std::uint64_t max_round,
                               std::int64_t n_experts) {
  if (now.step < 0) return "step " + std::to_string(now.step) + " is negative";
  if (!std::isfinite(now.loss) || now.loss < 0) return "loss " + std::to_string(now.loss) + " is not a finite cross-entropy";
  if (!std::isfinite(now.tokens_per_s) || now.tokens_per_s < 0) return "tokens_per_s is not a finite rate";
  if (!std::isfinite(now.last_sync_unix_s)) return "last_sync_unix_s is not finite";
  if (now.step < before.step)
    return "step went back from " + std::to_string(before.step) + " to " + std::to_string(now.step);
  if (now.round < before.round)
    return "round went back from " + std::to_string(before.round) + " to " + std::to_string(now.round);
  const std::uint64_t highest = std::max(now.round, now.round_in_flight);
  if (highest > max_round + 1)
    return "round " + std::to_string(highest) + " is beyond the run's round " + std::to_string(max_round);
  if (now.bytes_in_total < before.bytes_in_total || now.bytes_out_total < before.bytes_out_total)
    return "byte counters went back";
  for (int e : now.experts)
    if (e < 0 || e >= n_experts) return "expert " + std::to_string(e) + " does not exist";
  return {};
}

}  // namespace

struct CoordinatorServer::Impl final : spes::v1::CoordinatorService::Service {
  ClusterConfig cluster;
  sync_detail::TransportSettings transport;
  std::int64_t n_experts = 0;
  std::map<int, std::vector<int>> planned;  // the cluster file's assignment
  std::mutex mutex;
  RefusalLog refusals;  // calls refused (token, run, node, address), for the status
  std::condition_variable changed;
  std::vector<MembershipPlan> plans;        // every plan so far, oldest first
  std::uint64_t max_round = 0;              // highest round any node asked a plan for
  std::uint64_t rounds_done = 0;            // highest round any node reported finished
  std::map<int, NodeState> nodes;
  std::map<int, std::string> removed;       // node -> reason: removed by an operator (persisted)
  std::unique_ptr<grpc::Server> server;
  std::thread monitor;
  bool stopping = false;
  int port = 0;

  explicit Impl(const ClusterConfig& c) : cluster(c), transport(cluster_transport(c)) {
    if (!transport.identity.empty() && transport.identity.name != kCoordinatorHolder)
      raise(ErrorKind::Config, "{}: '{}' is the certificate of {}; the coordinator serves with the coordinator's "
            "(`spes ca issue --coordinator`)", c.where("tls.cert"), c.tls_cert, transport.identity.describe());
    n_experts = load_base_config(c).model.n_experts;
    const auto owned = assign_experts(c, n_experts);
    MembershipPlan first{1, 1, {}, {}};
    for (std::size_t i = 0; i < c.nodes.size(); ++i) {
      planned[c.nodes[i].id] = owned[i];
      first.members.push_back({c.nodes[i].id, c.nodes[i].address, owned[i]});
    }
    const auto now = Clock::now();
    for (const auto& n : c.nodes) nodes[n.id].last_seen = now;  // everyone gets dead_after_s to show up
    if (std::filesystem::exists(c.state_path())) load_state(first);
    else {
      plans.push_back(first);
      save_state();
    }
  }

  void load_state(const MembershipPlan& first) {
    const std::string path = cluster.state_path();
    try {
      json j = json::parse(read_file(path));
      if (j.at("run").get<std::string>() != cluster.run)
        raise(ErrorKind::Config, "coordinator state '{}' belongs to run '{}', not '{}': remove it or use another "
              "coordinator.state", path, j.at("run").get<std::string>(), cluster.run);
      max_round = j.at("max_round").get<std::uint64_t>();
      rounds_done = j.value("rounds_done", std::uint64_t{0});
      for (const auto& p : j.at("plans")) plans.push_back(plan_from_json(p));
      for (const auto& r : j.value("removed", json::array())) {
        const int id = r.at("node").get<int>();
        if (!nodes.count(id))
          raise(ErrorKind::Config, "coordinator state '{}' removed node {}, which the cluster file does not have", path, id);
        removed[id] = r.value("reason", std::string{});
      }
      if (plans.empty() || plans.front().members.size() != first.members.size())
        raise(ErrorKind::Config, "coordinator state '{}' does not match the cluster file's nodes", path);
      for (const auto& m : plans.back().members)
        if (!nodes.count(m.id)) raise(ErrorKind::Config, "coordinator state '{}' names node {}, which the cluster file "
                                      "does not have", path, m.id);
    } catch (const json::exception& e) {
      raise(ErrorKind::Config, "coordinator state '{}' is not readable: {}", path, e.what());
    }
    spdlog::info("coordinator: resumed from {}: plan {} (from round {}), round {}", path, plans.back().version,
                 plans.back().effective_round, max_round);
  }

  // Called with the mutex held.
  void save_state() {
    json p = json::array();
    for (const auto& plan : plans) p.push_back(plan_json(plan));
    json r = json::array();
    for (const auto& [id, reason] : removed) r.push_back({{"node", id}, {"reason", reason}});
    json j{{"run", cluster.run}, {"max_round", max_round}, {"rounds_done", rounds_done}, {"plans", p}, {"removed", r}};
    const std::filesystem::path path = cluster.state_path();
    if (path.has_parent_path()) ensure_directory(path.parent_path());
    write_file_atomic(path, j.dump(1));
  }

  const MembershipPlan& latest() const { return plans.back(); }

  // A new plan over `live` nodes, effective at the first round no node has started (and after
  // the latest plan, which may itself lie in the future).
  void replan(const std::vector<int>& live, const std::vector<int>& observers, const std::string& why) {
    std::map<int, std::vector<int>> current;
    for (const auto& m : latest().members) current[m.id] = m.experts;
    auto owned = reassign_experts(planned, current, live, n_experts);
    MembershipPlan next{latest().version + 1, std::max(max_round + 1, latest().effective_round + 1), {}, observers};
    for (int id : live) {
      const auto& node = *std::find_if(cluster.nodes.begin(), cluster.nodes.end(), [&](const auto& n) { return n.id == id; });
      next.members.push_back({id, node.address, owned[id]});
    }
    plans.push_back(next);
    save_state();
    std::string table;
    for (const auto& m : next.members) table += fmt::format(" node {}: {};", m.id, format_list(m.experts));
    if (!observers.empty()) table += fmt::format(" catching up: {}", format_list(observers));
    spdlog::warn("coordinator: plan {} from round {} ({}):{}", next.version, next.effective_round, why, table);
    changed.notify_all();
  }

  std::vector<int> member_ids(int without = -1) const {
    std::vector<int> ids;
    for (const auto& m : latest().members)
      if (m.id != without) ids.push_back(m.id);
    return ids;
  }

  // Members a rejoining node can fetch a round from: not silent past dead_after_s, not stopped.
  std::vector<int> live_member_ids(int without) {
    std::vector<int> ids;
    for (int id : member_ids(without))
      if (nodes[id].alive) ids.push_back(id);
    return ids;
  }

  grpc::Status check(const grpc::ServerContext* context, const std::string& run_id, int node_id, bool needs_node) {
    if (!sync_detail::has_token(*context, transport.token))
      return {grpc::StatusCode::UNAUTHENTICATED, "missing or wrong run token"};
    if (run_id != cluster.run)
      return {grpc::StatusCode::FAILED_PRECONDITION, "this coordinator serves run '" + cluster.run + "', not '" + run_id + "'"};
    // With per-node certificates a node speaks only for itself; status is for any holder of the run.
    if (needs_node) {
      if (auto why = sync_detail::identity_mismatch(transport, *context, node_holder_name(node_id)); !why.empty())
        return {grpc::StatusCode::UNAUTHENTICATED, why};
    } else if (!transport.identity.empty() && sync_detail::caller_identity(*context).run != cluster.run) {
      return {grpc::StatusCode::UNAUTHENTICATED, "the caller's certificate names no holder of run '" + cluster.run + "'"};
    }
    if (needs_node && !nodes.count(node_id))
      return {grpc::StatusCode::NOT_FOUND, "node " + std::to_string(node_id) + " is not in the cluster file"};
    if (needs_node && removed.count(node_id))
      return {grpc::StatusCode::PERMISSION_DENIED, removed_text(node_id) + " (`spes coordinator readmit --node " +
                                                       std::to_string(node_id) + "` lets it back)"};
    return grpc::Status::OK;
  }

  std::string removed_text(int id) const {
    const std::string& why = removed.at(id);
    return "node " + std::to_string(id) + " was removed from run '" + cluster.run + "' by an operator" +
           (why.empty() ? "" : ": " + why);
  }

  // Operators only: with per-node certificates the admin's or the coordinator's; else the token.
  grpc::Status check_operator(const grpc::ServerContext* context, const std::string& run_id) {
    if (auto s = check(context, run_id, 0, false); !s.ok()) return s;
    if (transport.identity.empty()) return grpc::Status::OK;
    const CertIdentity caller = sync_detail::caller_identity(*context);
    if (caller.name == kAdminHolder || caller.name == kCoordinatorHolder) return grpc::Status::OK;
    return {grpc::StatusCode::PERMISSION_DENIED, "only an operator may remove or readmit nodes (`spes ca issue --admin`); "
                                                 "the caller holds the certificate of " + caller.describe()};
  }

  grpc::Status Remove(grpc::ServerContext* context, const spes::v1::RemoveRequest* request,
                      spes::v1::RemoveReply* reply) override {
    const int id = static_cast<int>(request->node_id());
    std::lock_guard lock(mutex);
    if (auto s = check_operator(context, request->run_id()); !s.ok()) return refuse(context, s);
    if (!nodes.count(id))
      return refuse(context, {grpc::StatusCode::NOT_FOUND, "node " + std::to_string(id) + " is not in the cluster file"});
    const std::string reason = printable(request->reason(), 200);
    if (request->readmit()) {
      if (removed.erase(id)) {
        save_state();
        spdlog::warn("coordinator: node {} readmitted by an operator: it may join again", id);
      }
    } else if (!removed.count(id)) {
      const bool member = latest().find(id) != nullptr;
      const auto rest = member_ids(id);
      if (member && rest.empty())
        return refuse(context, {grpc::StatusCode::FAILED_PRECONDITION,
                                "node " + std::to_string(id) + " is the last member: removing it would end the run"});
      removed[id] = reason;
      if (member) replan(rest, {}, "node " + std::to_string(id) + " removed by an operator");  // saves the state
      else save_state();
      nodes[id].alive = false;
      spdlog::warn("coordinator: {}; its joins, heartbeats and plan requests are refused from now on", removed_text(id));
    }
    to_proto(latest(), *reply->mutable_plan());
    return grpc::Status::OK;
  }

  grpc::Status Join(grpc::ServerContext* context, const spes::v1::JoinRequest* request,
                    spes::v1::JoinReply* reply) override {
    const int id = static_cast<int>(request->node_id());
    std::lock_guard lock(mutex);
    if (auto s = check(context, request->run_id(), id, true); !s.ok()) return refuse(context, s);
    const auto& node = *std::find_if(cluster.nodes.begin(), cluster.nodes.end(), [&](const auto& n) { return n.id == id; });
    if (request->address() != node.address)
      return refuse(context, {grpc::StatusCode::INVALID_ARGUMENT, "node " + std::to_string(id) + " is at " + node.address +
                                                                      " in the cluster file, not " + request->address()});
    NodeState& st = nodes[id];
    st.joined = true;
    st.alive = true;
    st.last_seen = Clock::now();
    st.progress = NodeProgress{};
    const std::uint64_t resumed = request->resumed_round();
    // (Not for a node that has left the plan meanwhile, e.g. its experts moved after grace_s: the
    // others trained them on, so it catches up below.)
    if (rounds_done == 0 || (resumed >= rounds_done && latest().find(id))) {
      // No round has finished: every member still holds the initial weights (same seed), so
      // the node starts from step 0 with everyone else; peers wait for it (sync.peer_wait_s).
      // Or the node resumed from a shard holding the run's latest round (a whole cluster
      // restarted from its shards, `launch-local --resume`): its weights are current as well.
      if (resumed > max_round) {
        max_round = resumed;  // its heartbeats report that round; plans take effect after it
        save_state();
      }
      if (!latest().find(id)) {
        auto live = member_ids();
        live.push_back(id);
        std::sort(live.begin(), live.end());
        replan(live, {}, "node " + std::to_string(id) + " admitted");
      } else {
        spdlog::info("coordinator: node {} joined from {}{}", id, context->peer(),
                     resumed > 0 ? fmt::format(" (resumed at round {})", resumed) : "");
      }
      to_proto(latest(), *reply->mutable_plan());
      reply->set_round(0);
      return grpc::Status::OK;
    }
    // A run in progress: the node's weights are stale. It first observes one round (its experts,
    // if it had any, go to live members for that round), then the next plan makes it a member
    // again with its planned experts.
    // Members marked dead or stopped are left out of both plans: a round they would never serve
    // fails the catch-up; they rejoin (and catch up) themselves when they come back.
    auto others = live_member_ids(id);
    if (others.empty())
      return refuse(context, {grpc::StatusCode::FAILED_PRECONDITION,
                              "no live member to catch up from: restart the run (or resume from a checkpoint)"});
    replan(others, {id}, "node " + std::to_string(id) + " rejoining");
    const std::uint64_t catch_up = latest().effective_round;
    to_proto(latest(), *reply->mutable_plan());
    auto with = others;
    with.push_back(id);
    std::sort(with.begin(), with.end());
    replan(with, {}, "node " + std::to_string(id) + " re-admitted");
    reply->set_round(catch_up);
    return grpc::Status::OK;
  }

  grpc::Status Heartbeat(grpc::ServerContext* context, const spes::v1::HeartbeatRequest* request,
                         spes::v1::HeartbeatReply* reply) override {
    const int id = static_cast<int>(request->node_id());
    std::lock_guard lock(mutex);
    if (auto s = check(context, request->run_id(), id, true); !s.ok()) return refuse(context, s);
    NodeState& st = nodes[id];
    NodeProgress report = from_proto(request->report());
    if (const auto why = implausible_report(report, st.progress, max_round, n_experts); !why.empty())
      return refuse(context, {grpc::StatusCode::INVALID_ARGUMENT, "node " + std::to_string(id) + "'s report: " + why});
    if (!st.alive && latest().find(id)) spdlog::info("coordinator: node {} is answering again", id);
    st.alive = true;
    st.last_seen = Clock::now();
    st.progress = std::move(report);
    st.record_loss();
    if (st.progress.stopped) {
      st.alive = false;
      st.dead_since = st.last_seen;
      spdlog::warn("coordinator: node {} stopped at step {} (signal): experts {} go to live members after {:.0f} s "
                   "unless it rejoins", id, st.progress.step, format_list(st.progress.experts), cluster.coordinator.grace_s);
    }
    if (st.progress.round > rounds_done) {
      rounds_done = st.progress.round;
      save_state();
    }
    reply->set_plan_version(latest().version);
    if (st.progress.done) changed.notify_all();
    return grpc::Status::OK;
  }

  grpc::Status GetPlan(grpc::ServerContext* context, const spes::v1::PlanRequest* request,
                       spes::v1::PlanReply* reply) override {
    const int id = static_cast<int>(request->node_id());
    std::lock_guard lock(mutex);
    if (auto s = check(context, request->run_id(), id, true); !s.ok()) return refuse(context, s);
    if (request->round() > max_round) {
      max_round = request->round();
      save_state();
    }
    // Plans only ever take effect after max_round, so every node asking for round r gets the same one.
    const MembershipPlan* chosen = &plans.front();
    for (const auto& p : plans)
      if (p.effective_round <= request->round()) chosen = &p;
    to_proto(*chosen, *reply->mutable_plan());
    return grpc::Status::OK;
  }

  // The run as `spes coordinator status` shows it (the caller holds the mutex).
  ClusterStatus snapshot() {
    ClusterStatus out;
    out.run_id = cluster.run;
    out.round = max_round;
    out.plan = latest();
    out.refused_calls = refusals.count();
    out.last_refusal = refusals.last();
    const auto now = Clock::now();
    for (const auto& n : cluster.nodes) {
      const NodeState& st = nodes[n.id];
      NodeStatusRow row;
      row.id = n.id;
      row.address = n.address;
      row.alive = st.alive && st.joined;
      row.member = latest().find(n.id) != nullptr;
      row.silent_s = st.joined ? std::chrono::duration<double>(now - st.last_seen).count() : -1.0;
      row.progress = st.progress;
      if (auto r = removed.find(n.id); r != removed.end()) row.removed = r->second.empty() ? "removed" : r->second;
      out.nodes.push_back(std::move(row));
    }
    return out;
  }

  grpc::Status Status(grpc::ServerContext* context, const spes::v1::StatusRequest* request,
                      spes::v1::StatusReply* reply) override {
    std::lock_guard lock(mutex);
    if (auto s = check(context, request->run_id(), 0, false); !s.ok()) return refuse(context, s);
    const ClusterStatus status = snapshot();
    reply->set_run_id(status.run_id);
    reply->set_refused_calls(status.refused_calls);
    reply->set_last_refusal(status.last_refusal);
    reply->set_round(status.round);
    to_proto(status.plan, *reply->mutable_plan());
    for (const auto& r : status.nodes) {
      auto* row = reply->add_nodes();
      row->set_id(static_cast<std::uint32_t>(r.id));
      row->set_address(r.address);
      row->set_alive(r.alive);
      row->set_member(r.member);
      row->set_silent_s(r.silent_s);
      row->set_removed(r.removed);
      to_proto(r.progress, *row->mutable_report());
    }
    return grpc::Status::OK;
  }

  grpc::Status refuse(const grpc::ServerContext* context, const grpc::Status& s) {
    refusals.record("coordinator: refused a call from " + context->peer(), s.error_message());
    return s;
  }

  // Marks silent nodes dead and, past the grace period, hands their experts to live members.
  void check_heartbeats() {
    std::lock_guard lock(mutex);
    const auto now = Clock::now();
    const auto dead_after = std::chrono::duration<double>(cluster.coordinator.dead_after_s);
    const auto grace = std::chrono::duration<double>(cluster.coordinator.grace_s);
    std::vector<int> live, removed;
    for (const auto& m : latest().members) {
      NodeState& st = nodes[m.id];
      // A node that never joined gets a start-up allowance (data preparation, model build).
      const auto allowed = st.joined ? dead_after : std::max(dead_after, std::chrono::duration<double>(kStartupAllowanceS));
      if (st.alive && !st.progress.done && now - st.last_seen > allowed) {
        st.alive = false;
        st.dead_since = now;
        spdlog::warn("coordinator: node {} silent for {:.0f} s: marked dead (experts {} reassigned after {:.0f} s more)",
                     m.id, cluster.coordinator.dead_after_s, format_list(m.experts), cluster.coordinator.grace_s);
      }
      if (!st.alive && now - st.dead_since >= grace) removed.push_back(m.id);
      else live.push_back(m.id);
    }
    if (removed.empty() || live.empty()) return;
    std::string who;
    for (int id : removed) who += (who.empty() ? "" : ", ") + std::to_string(id);
    replan(live, {}, "node(s) " + who + " dead past the grace period");
  }

  bool all_done() {
    for (const auto& m : latest().members)
      if (!nodes[m.id].progress.done) return false;
    return true;
  }
};

CoordinatorServer::CoordinatorServer(const ClusterConfig& cluster) : impl_(std::make_unique<Impl>(cluster)) {}
CoordinatorServer::~CoordinatorServer() { stop(); }

void CoordinatorServer::start() {
  Impl& m = *impl_;
  grpc::EnableDefaultHealthCheckService(true);
  grpc::ServerBuilder builder;
  builder.AddListeningPort(m.cluster.coordinator.address, sync_detail::server_credentials(m.transport), &m.port);
  builder.SetMaxReceiveMessageSize(sync_detail::kMaxRequestBytes);
  builder.RegisterService(&m);
  m.server = builder.BuildAndStart();
  if (!m.server || m.port == 0)
    raise(ErrorKind::Io, "cannot listen on {} for the coordinator (address in use or not local?)",
          m.cluster.coordinator.address);
  m.monitor = std::thread([&m] {
    std::unique_lock lock(m.mutex);
    while (!m.stopping) {
      m.changed.wait_for(lock, std::chrono::milliseconds(250));
      if (m.stopping) break;
      lock.unlock();
      m.check_heartbeats();
      lock.lock();
    }
  });
  spdlog::info("coordinator: run '{}', {} nodes, serving on port {} ({}); state {}", m.cluster.run,
               m.cluster.nodes.size(), m.port, sync_detail::security_name(m.transport), m.cluster.state_path());
}

void CoordinatorServer::wait(bool exit_when_done) {
  Impl& m = *impl_;
  std::unique_lock lock(m.mutex);
  while (!m.stopping && !stop_requested()) {
    if (exit_when_done && m.all_done()) {
      spdlog::info("coordinator: every member finished; leaving");
      return;
    }
    m.changed.wait_for(lock, std::chrono::milliseconds(200));
  }
  if (stop_requested()) spdlog::info("coordinator: stopping (signal {})", stop_signal());
}

void CoordinatorServer::stop() {
  Impl& m = *impl_;
  {
    std::lock_guard lock(m.mutex);
    if (m.stopping && !m.server) return;
    m.stopping = true;
    m.changed.notify_all();
  }
  if (m.monitor.joinable()) m.monitor.join();
  if (m.server) {
    m.server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
    m.server->Wait();
    m.server.reset();
  }
}

int CoordinatorServer::port() const { return impl_->port; }

ClusterStatus CoordinatorServer::status() {
  std::lock_guard lock(impl_->mutex);
  ClusterStatus s = impl_->snapshot();
  for (auto& row : s.nodes) row.loss_curve = impl_->nodes[row.id].loss_curve;
  return s;
}

}  // namespace spes
