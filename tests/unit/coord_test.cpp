// Cluster files, expert assignment strategies and refusals, reassignment after deaths and
// returns, and the coordinator service (token, heartbeat loss → reassignment, restart).
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <thread>

#include "spes/coord/cluster.h"
#include "spes/coord/coordinator.h"
#include "../../src/sync/transport.h"
#include "spes/sync/identity.h"
#include "spes/util/error.h"
#include "spes/util/fs.h"
#include "spes/v1/coordinator.grpc.pb.h"

namespace spes {
namespace {

std::string cluster_text(const std::string& extra, int n = 4, const std::string& assignment = "contiguous") {
  std::string text = "run: t\nconfig: " SPES_SOURCE_DIR "/configs/tiny.yaml\nout_dir: /tmp/x\ntoken: secret\n"
                     "insecure: true\nassignment: " + assignment + "\n" + extra + "nodes:\n";
  for (int i = 0; i < n; ++i) text += "  - {id: " + std::to_string(i) + ", address: '127.0.0.1:" + std::to_string(9100 + i) + "'}\n";
  return text;
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(Cluster, ContiguousAndRoundRobin) {
  auto c = parse_cluster(cluster_text(""), "c.yaml");
  EXPECT_EQ(assign_experts(c, 8), (std::vector<std::vector<int>>{{0, 1}, {2, 3}, {4, 5}, {6, 7}}));
  auto r = parse_cluster(cluster_text("", 3, "round_robin"), "c.yaml");
  EXPECT_EQ(assign_experts(r, 8), (std::vector<std::vector<int>>{{0, 3, 6}, {1, 4, 7}, {2, 5}}));
}

TEST(Cluster, ExplicitAndRefusals) {
  std::string text = "run: t\nconfig: x.yaml\nout_dir: o\ntoken: s\ninsecure: true\nassignment: explicit\nnodes:\n"
                     "  - {id: 0, address: 'h:1', experts: [0-2]}\n  - {id: 1, address: 'h:2', experts: [3]}\n";
  auto c = parse_cluster(text, "c.yaml");
  EXPECT_EQ(assign_experts(c, 4), (std::vector<std::vector<int>>{{0, 1, 2}, {3}}));
  EXPECT_NE(error_of([&] { assign_experts(c, 5); }).find("expert 4 is owned by no node"), std::string::npos);
  std::string twice = text;
  twice.replace(twice.find("[3]"), 3, "[2, 3]");
  EXPECT_NE(error_of([&] { assign_experts(parse_cluster(twice, "c.yaml"), 4); }).find("owned by nodes 0 and 1"),
            std::string::npos);
  EXPECT_NE(error_of([&] { assign_experts(parse_cluster(cluster_text("", 3), "c.yaml"), 8); }).find("cannot be split"),
            std::string::npos);
  EXPECT_NE(error_of([&] { parse_cluster(cluster_text("replication: 2\n"), "c.yaml"); }).find("replication"),
            std::string::npos);
  std::string dup = cluster_text("");
  dup.replace(dup.find("9101"), 4, "9100");
  EXPECT_NE(error_of([&] { parse_cluster(dup, "c.yaml"); }).find("used by two nodes"), std::string::npos);
  EXPECT_NE(error_of([&] { parse_cluster(cluster_text("", 4, "random"), "c.yaml"); }).find("c.yaml:6"),
            std::string::npos);
  EXPECT_NE(error_of([&] { parse_cluster("run: t\nconfig: [", "bad.yaml"); }).find("bad.yaml"), std::string::npos);
}

TEST(Cluster, ReassignmentGivesDeadExpertsToTheLeastLoadedAndReturnsThem) {
  std::map<int, std::vector<int>> planned{{0, {0, 1}}, {1, {2, 3}}, {2, {4, 5}}};
  auto without2 = reassign_experts(planned, planned, {0, 1}, 6);
  EXPECT_EQ(without2, (std::map<int, std::vector<int>>{{0, {0, 1, 4}}, {1, {2, 3, 5}}}));
  // Node 2 back: its planned experts return; the others keep theirs.
  EXPECT_EQ(reassign_experts(planned, without2, {0, 1, 2}, 6), planned);
}

TEST(Coordinator, TokenHeartbeatLossRestart) {
  const std::string dir = ::testing::TempDir() + "/coord_test";
  std::filesystem::remove_all(dir);
  auto cluster = parse_cluster(
      "run: t\nconfig: " SPES_SOURCE_DIR "/configs/tiny.yaml\nout_dir: " + dir + "\ntoken: secret\ninsecure: true\n"
      "set: {data.dir: " SPES_TEST_DATA_DIR "/tiny}\n"
      "coordinator: {address: '127.0.0.1:0', heartbeat_s: 0.1, dead_after_s: 0.5, grace_s: 0.3}\nnodes:\n"
      "  - {id: 0, address: '127.0.0.1:9200'}\n  - {id: 1, address: '127.0.0.1:9201'}\n", "c.yaml");
  auto server = std::make_unique<CoordinatorServer>(cluster);
  server->start();
  cluster.coordinator.address = "127.0.0.1:" + std::to_string(server->port());
  auto bad = cluster;
  bad.token = "wrong";
  CoordinatorClient intruder(bad);
  EXPECT_NE(error_of([&] { intruder.join(0, "127.0.0.1:9200", 1.0); }).find("token"), std::string::npos);

  CoordinatorClient client(cluster);
  EXPECT_NE(error_of([&] { client.join(0, "127.0.0.1:9999", 1.0); }).find("in the cluster file"), std::string::npos);
  EXPECT_NE(error_of([&] { client.join(7, "127.0.0.1:9200", 1.0); }).find("node 7"), std::string::npos);
  auto [plan, round] = client.join(0, "127.0.0.1:9200", 1.0);
  EXPECT_EQ(round, 0u);
  EXPECT_EQ(plan.members.size(), 2u);
  client.join(1, "127.0.0.1:9201", 1.0);
  ASSERT_TRUE(client.plan_for(0, 1, 1.0));
  NodeProgress p;
  p.round = 1;
  p.round_in_flight = 2;  // sync.overlap: what the status shows for the round behind training
  p.round_delay = 5;
  p.rejected_payloads = 2;  // what the node refused, with a last reason carrying a terminal escape
  p.refused_calls = 1;
  p.last_refusal = "round 1: refused node 1's payload: \x1b[31mwrong shape";
  // Node 0 keeps reporting; node 1 falls silent: dead after 0.5 s, its experts move after 0.3 s more.
  for (int i = 0; i < 15; ++i) {
    client.heartbeat(0, p);
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  const ClusterStatus seen = client.status(5.0);
  for (const auto& row : seen.nodes)
    if (row.id == 0) {
      EXPECT_EQ(row.progress.round_in_flight, 2u);
      EXPECT_EQ(row.progress.round_delay, 5);
      EXPECT_EQ(row.progress.rejected_payloads, 2u);
      EXPECT_EQ(row.progress.refused_calls, 1u);
      EXPECT_EQ(row.progress.last_refusal, "round 1: refused node 1's payload: ?[31mwrong shape");
    }
  // The coordinator's own refusals: the wrong token, the wrong address, the unknown node.
  EXPECT_EQ(seen.refused_calls, 3u);
  EXPECT_NE(seen.last_refusal.find("node 7 is not in the cluster file"), std::string::npos) << seen.last_refusal;
  auto later = client.plan_for(0, 3, 1.0);
  ASSERT_TRUE(later);
  ASSERT_EQ(later->members.size(), 1u);
  EXPECT_EQ(later->members[0].experts, (std::vector<int>{0, 1, 2, 3, 4, 5, 6, 7}));
  EXPECT_GE(later->effective_round, 2u);
  const auto version = later->version;

  // Killing the coordinator loses nothing: same plan and round after a restart.
  server->stop();
  server.reset();
  auto again = parse_cluster("run: t\nconfig: " SPES_SOURCE_DIR "/configs/tiny.yaml\nout_dir: " + dir +
                                 "\ntoken: secret\ninsecure: true\ncoordinator: {address: '" + cluster.coordinator.address +
                                 "'}\nnodes:\n  - {id: 0, address: '127.0.0.1:9200'}\n  - {id: 1, address: '127.0.0.1:9201'}\n",
                             "c.yaml");
  CoordinatorServer restarted(again);
  restarted.start();
  ClusterStatus s = client.status(5.0);
  EXPECT_EQ(s.plan.version, version);
  EXPECT_EQ(s.round, 3u);
  // Node 1 comes back mid-run: it observes one round, then gets its experts back.
  auto [back, catch_up] = client.join(1, "127.0.0.1:9201", 1.0);
  EXPECT_GT(catch_up, 1u);
  EXPECT_EQ(back.observers, std::vector<int>{1});
  auto member_again = client.plan_for(0, catch_up + 1, 1.0);
  ASSERT_TRUE(member_again && member_again->find(1));
  EXPECT_EQ(member_again->find(1)->experts, (std::vector<int>{4, 5, 6, 7}));
  restarted.stop();
}

// A 3-node cluster of the tiny config (round-robin experts, token "secret", no TLS) with its state
// in a fresh TempDir()/NAME, node i at 127.0.0.1:BASE_PORT+i, the coordinator on a free port.
ClusterConfig three_node_cluster(const std::string& name, int base_port, double dead_after_s) {
  const std::string dir = ::testing::TempDir() + "/" + name;
  std::filesystem::remove_all(dir);
  std::string text = "run: t\nconfig: " SPES_SOURCE_DIR "/configs/tiny.yaml\nout_dir: " + dir +
                     "\ntoken: secret\ninsecure: true\nassignment: round_robin\ncoordinator: {address: '127.0.0.1:0', "
                     "heartbeat_s: 0.1, dead_after_s: " + std::to_string(dead_after_s) + ", grace_s: 60}\nnodes:\n";
  for (int i = 0; i < 3; ++i)
    text += "  - {id: " + std::to_string(i) + ", address: '127.0.0.1:" + std::to_string(base_port + i) + "'}\n";
  return parse_cluster(text, "c.yaml");
}

// A node rejoining a run in progress catches up only from members that can serve the round: not
// one found silent (dead, still in its grace period) nor one that reported it stopped on a signal.
TEST(Coordinator, RejoiningNodeCatchesUpOnlyFromLiveMembers) {
  auto cluster = three_node_cluster("coord_live_test", 9300, 0.5);
  CoordinatorServer server(cluster);
  server.start();
  cluster.coordinator.address = "127.0.0.1:" + std::to_string(server.port());
  CoordinatorClient client(cluster);
  for (int i = 0; i < 3; ++i) client.join(i, "127.0.0.1:930" + std::to_string(i), 1.0);
  NodeProgress p;
  p.round = 1;
  p.step = 10;
  for (int i = 0; i < 3; ++i) client.heartbeat(i, p);
  // Node 2 falls silent (dead after 0.5 s; the long grace keeps it in the plan); node 1 stops.
  for (int i = 0; i < 10; ++i) {
    client.heartbeat(0, p);
    client.heartbeat(1, p);
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  NodeProgress stopped = p;
  stopped.stopped = true;
  client.heartbeat(1, stopped);
  const ClusterStatus seen = client.status(5.0);
  ASSERT_EQ(seen.nodes.size(), 3u);
  EXPECT_TRUE(seen.nodes[0].alive);
  EXPECT_FALSE(seen.nodes[1].alive);
  EXPECT_FALSE(seen.nodes[2].alive);
  EXPECT_EQ(seen.plan.members.size(), 3u);  // both still members: the grace period has not passed

  // Node 1 restarts first: node 2 (dead) is no source for its round and leaves the plan.
  auto [plan1, round1] = client.join(1, "127.0.0.1:9301", 1.0);
  EXPECT_GT(round1, 1u);
  ASSERT_EQ(plan1.members.size(), 1u);
  EXPECT_EQ(plan1.members[0].id, 0);
  EXPECT_EQ(plan1.observers, std::vector<int>{1});
  auto after1 = client.plan_for(0, round1 + 1, 1.0);
  ASSERT_TRUE(after1);
  EXPECT_TRUE(after1->find(0) && after1->find(1) && !after1->find(2));
  // Node 2 comes back: node 1, rejoined, is live again and a source.
  auto [plan2, round2] = client.join(2, "127.0.0.1:9302", 1.0);
  EXPECT_GT(round2, round1);
  EXPECT_EQ(plan2.members.size(), 2u);
  EXPECT_TRUE(plan2.find(0) && plan2.find(1));
  auto all = client.plan_for(0, round2 + 1, 1.0);
  ASSERT_TRUE(all);
  EXPECT_EQ(all->members.size(), 3u);
  server.stop();
}

// A whole cluster restarted from its shards (launch-local --resume): a node whose shard holds the
// run's latest round rejoins as a member at once; one a round behind catches up. A coordinator
// started without state takes a resumed node's round as the run's, so its heartbeats are accepted.
TEST(Coordinator, NodeResumedAtTheLatestRoundRejoinsWithoutCatchingUp) {
  auto cluster = three_node_cluster("coord_resume_test", 9400, 30);
  auto server = std::make_unique<CoordinatorServer>(cluster);
  server->start();
  cluster.coordinator.address = "127.0.0.1:" + std::to_string(server->port());
  CoordinatorClient client(cluster);
  for (int i = 0; i < 3; ++i) client.join(i, "127.0.0.1:940" + std::to_string(i), 1.0);
  ASSERT_TRUE(client.plan_for(0, 2, 1.0));
  NodeProgress p;
  p.round = 2;
  p.step = 20;
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(client.heartbeat(i, p));
  const auto version = client.status(5.0).plan.version;

  auto [plan0, round0] = client.join(0, "127.0.0.1:9400", 1.0, 2);
  EXPECT_EQ(round0, 0u);  // no catching up
  EXPECT_EQ(plan0.version, version);
  EXPECT_TRUE(plan0.observers.empty());
  auto [plan1, round1] = client.join(1, "127.0.0.1:9401", 1.0, 1);  // a round behind
  EXPECT_GT(round1, 2u);
  EXPECT_EQ(plan1.observers, std::vector<int>{1});
  server->stop();
  server.reset();

  // No state: a resumed node's round becomes the run's; its heartbeats at that round pass.
  std::filesystem::remove(cluster.state_path());
  CoordinatorServer fresh(cluster);
  fresh.start();
  auto [plan_fresh, round_fresh] = client.join(2, "127.0.0.1:9402", 1.0, 7);
  EXPECT_EQ(round_fresh, 0u);
  EXPECT_EQ(plan_fresh.version, 1u);
  p.round = 7;
  p.step = 70;
  EXPECT_TRUE(client.heartbeat(2, p));
  p.round = 9;  // two past any round a node asked for: refused
  EXPECT_FALSE(client.heartbeat(2, p));
  fresh.stop();
}

// An operator removes a node (e.g. its key leaked): it leaves the plan, and its joins, heartbeats
// and plan requests are refused with the reason, also after a coordinator restart, until readmitted.
TEST(Coordinator, RemovedNodeIsRefusedUntilReadmitted) {
  auto cluster = three_node_cluster("coord_remove_test", 9310, 30);
  auto server = std::make_unique<CoordinatorServer>(cluster);
  server->start();
  const int port = server->port();
  cluster.coordinator.address = "127.0.0.1:" + std::to_string(port);
  CoordinatorClient client(cluster);
  for (int i = 0; i < 3; ++i) client.join(i, "127.0.0.1:931" + std::to_string(i), 1.0);
  NodeProgress p;
  p.round = 1;
  p.step = 10;
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(client.heartbeat(i, p));

  EXPECT_NE(error_of([&] { client.remove(7, "", false, 1.0); }).find("node 7 is not in the cluster file"), std::string::npos);
  const MembershipPlan without = client.remove(2, "key leaked", false, 1.0);
  ASSERT_EQ(without.members.size(), 2u);
  EXPECT_TRUE(without.find(0) && without.find(1) && !without.find(2));
  EXPECT_EQ(without.find(0)->experts.size() + without.find(1)->experts.size(), 8u);  // node 2's experts handed on
  const std::string refused = error_of([&] { client.join(2, "127.0.0.1:9312", 1.0); });
  EXPECT_NE(refused.find("node 2 was removed from run 't' by an operator: key leaked"), std::string::npos) << refused;
  EXPECT_NE(refused.find("spes coordinator readmit --node 2"), std::string::npos) << refused;
  EXPECT_FALSE(client.heartbeat(2, p));
  EXPECT_NE(error_of([&] { client.plan_for(2, 3, 1.0); }).find("removed"), std::string::npos);
  ASSERT_TRUE(client.heartbeat(0, p));  // the others carry on
  // The last member cannot be removed.
  client.remove(1, "", false, 1.0);
  EXPECT_NE(error_of([&] { client.remove(0, "", false, 1.0); }).find("last member"), std::string::npos);
  client.remove(1, "", true, 1.0);

  // A restarted coordinator still refuses node 2; readmitted, it catches up and becomes a member.
  server->stop();
  server = std::make_unique<CoordinatorServer>(cluster);  // same address
  server->start();
  const ClusterStatus seen = client.status(5.0);
  ASSERT_EQ(seen.nodes.size(), 3u);
  EXPECT_EQ(seen.nodes[2].removed, "key leaked");
  EXPECT_FALSE(seen.nodes[2].member);
  EXPECT_TRUE(seen.nodes[1].removed.empty());
  EXPECT_NE(error_of([&] { client.join(2, "127.0.0.1:9312", 1.0); }).find("removed"), std::string::npos);
  client.remove(2, "", true, 1.0);
  auto [plan, round] = client.join(2, "127.0.0.1:9312", 1.0);
  EXPECT_GT(round, 1u);
  EXPECT_EQ(plan.observers, std::vector<int>{2});
  auto member_again = client.plan_for(0, round + 1, 1.0);
  ASSERT_TRUE(member_again && member_again->find(2));
  server->stop();
}

// Per-node certificates at the coordinator: a node speaks only for itself; the plan writes each
// node its own certificate; the coordinator refuses to serve with a node's certificate.
TEST(Coordinator, PerNodeCertificatesBindNodeIds) {
  const std::string dir = ::testing::TempDir() + "/coord_identity";
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  const PemPair ca = make_run_ca("t", 1);
  auto write = [&](const std::string& holder, const PemPair& p) {
    write_file_atomic(dir + "/" + holder + ".pem", p.cert_pem);
    write_file_atomic(dir + "/" + holder + ".key", p.key_pem);
  };
  write("ca", ca);
  for (const std::string h : {"coordinator", "node-0", "node-1"}) write(h, issue_certificate(ca, h, {"127.0.0.1"}, 1));
  auto cluster_with = [&](const std::string& holder) {
    return parse_cluster("run: t\nconfig: " SPES_SOURCE_DIR "/configs/tiny.yaml\nout_dir: " + dir + "\ntoken: secret\n"
                         "tls: {ca: " + dir + "/ca.pem, cert: " + dir + "/" + holder + ".pem, key: " + dir + "/" + holder +
                         ".key, node_dir: " + dir + "}\nset: {data.dir: " SPES_TEST_DATA_DIR "/tiny}\n"
                         "coordinator: {address: '127.0.0.1:0'}\nnodes:\n"
                         "  - {id: 0, address: '127.0.0.1:9300'}\n  - {id: 1, address: '127.0.0.1:9301'}\n", "c.yaml");
  };
  EXPECT_NE(error_of([&] { CoordinatorServer bad(cluster_with("node-1")); }).find("certificate of node 1 of run 't'"),
            std::string::npos);
  write("admin", issue_certificate(ca, "admin", {}, 1));
  EXPECT_NE(error_of([&] { CoordinatorServer bad(cluster_with("admin")); }).find("serves with the coordinator's"),
            std::string::npos);
  auto cluster = cluster_with("coordinator");
  EXPECT_EQ(cluster.node_cert(1), dir + "/node-1.pem");
  EXPECT_EQ(cluster.node_key(0), dir + "/node-0.key");
  CoordinatorServer server(cluster);
  server.start();
  // Heartbeats over node 0's certificate: for node 0 accepted, for node 1 refused.
  sync_detail::TransportSettings s;
  s.ca_pem = ca.cert_pem;
  s.cert_pem = read_file(dir + "/node-0.pem");
  s.key_pem = read_file(dir + "/node-0.key");
  s.identity = certificate_identity(s.cert_pem);
  grpc::ChannelArguments args;
  args.SetSslTargetNameOverride(holder_dns_name(kCoordinatorHolder));
  auto stub = spes::v1::CoordinatorService::NewStub(grpc::CreateCustomChannel(
      "127.0.0.1:" + std::to_string(server.port()), sync_detail::channel_credentials(s), args));
  auto heartbeat_for = [&](int node, std::int64_t step = 7, std::uint64_t round = 0, double loss = 3.5) {
    grpc::ClientContext ctx;
    ctx.AddMetadata(sync_detail::kTokenHeader, "secret");
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    spes::v1::HeartbeatRequest req;
    req.set_run_id("t");
    req.set_node_id(static_cast<std::uint32_t>(node));
    req.mutable_report()->set_step(step);
    req.mutable_report()->set_round(round);
    req.mutable_report()->set_loss(loss);
    spes::v1::HeartbeatReply reply;
    return stub->Heartbeat(&ctx, req, &reply).error_code();
  };
  EXPECT_EQ(heartbeat_for(0), grpc::StatusCode::OK);
  EXPECT_EQ(heartbeat_for(1), grpc::StatusCode::UNAUTHENTICATED);
  // Reports that cannot be true are refused with the reason and change nothing (nothing persisted).
  const std::string state_before = read_file(cluster.state_path());
  EXPECT_EQ(heartbeat_for(0, 7, 40), grpc::StatusCode::INVALID_ARGUMENT);  // no node asked beyond round 0
  EXPECT_EQ(heartbeat_for(0, 5), grpc::StatusCode::INVALID_ARGUMENT);      // the step goes back
  EXPECT_EQ(heartbeat_for(0, 8, 0, std::nan("")), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(read_file(cluster.state_path()), state_before);
  // The operator (here with the coordinator's own certificate) reads the status; node 1 was never heard from.
  cluster.coordinator.address = "127.0.0.1:" + std::to_string(server.port());
  CoordinatorClient admin(cluster);
  const ClusterStatus st = admin.status(5.0);
  EXPECT_EQ(st.refused_calls, 4u);
  EXPECT_NE(st.last_refusal.find("node 0's report: loss nan is not a finite cross-entropy"), std::string::npos)
      << st.last_refusal;
  for (const auto& row : st.nodes) EXPECT_EQ(row.progress.step, row.id == 0 ? 7 : 0);
  // Removing a node takes an operator's certificate: node 0's is refused, the operator's works.
  {
    grpc::ClientContext ctx;
    ctx.AddMetadata(sync_detail::kTokenHeader, "secret");
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    spes::v1::RemoveRequest req;
    req.set_run_id("t");
    req.set_node_id(1);
    spes::v1::RemoveReply reply;
    const grpc::Status s = stub->Remove(&ctx, req, &reply);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED);
    EXPECT_NE(s.error_message().find("only an operator"), std::string::npos) << s.error_message();
  }
  const MembershipPlan after = admin.remove(1, "test", false, 5.0);
  EXPECT_TRUE(after.find(0) && !after.find(1));
  server.stop();
}

}  // namespace
}  // namespace spes
