// Cluster files, expert assignment strategies and refusals, reassignment after deaths and
// returns, and the coordinator service (token, heartbeat loss → reassignment, restart).
#include <gtest/gtest.h>

#include <filesystem>
#include <thread>

#include "spes/coord/cluster.h"
#include "spes/coord/coordinator.h"
#include "spes/util/error.h"
#include "spes/util/fs.h"

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

}  // namespace
}  // namespace spes
