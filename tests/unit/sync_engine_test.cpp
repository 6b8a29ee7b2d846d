// SPES rounds between in-process nodes on loopback: the result equals the method's (shared =
// fp32 mean in node-id order, expert = owner's), bit-identical everywhere; dead and hostile
// peers are skipped; hostile clients are refused.
#include <gtest/gtest.h>
#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <functional>
#include <future>
#include <map>
#include <memory>
#include <thread>

#include <unistd.h>

#include "../../src/sync/robust.h"
#include "../../src/sync/round_deadline.h"
#include "../../src/sync/transport.h"
#include "cut_proxy.h"
#include "spes/sync/engine.h"
#include "spes/sync/identity.h"
#include "spes/train/schedule.h"
#include "spes/util/error.h"
#include "spes/util/fs.h"
#include "spes/v1/sync.grpc.pb.h"
#include "sync_fixture.h"
#include "test_paths.h"

namespace spes {
namespace {
using test::FakeModel;

constexpr const char* kInsecure = "  insecure: true\n";

struct Cluster {
  std::vector<int> ports;
  std::vector<std::unique_ptr<FakeModel>> models;
  std::vector<std::unique_ptr<SyncEngine>> engines;  // null for nodes not started
  std::vector<std::vector<std::vector<float>>> before;

  // fragments > 1: sync.every = sync.fragments = fragments (a round every step, one fragment each).
  // `adjust` changes each node's parsed config before its engine starts.
  Cluster(int n, const std::string& extra = kInsecure, std::vector<bool> started = {}, double round_timeout_s = 20,
          int fragments = 1, const std::function<void(Config&)>& adjust = {}) {
    for (int i = 0; i < n; ++i) ports.push_back(test::free_port());
    for (int i = 0; i < n; ++i) {
      models.push_back(std::make_unique<FakeModel>(test::kLayers, test::kExperts, test::kDim, test::kFf, test::kVocab,
                                                   100 + i));
      const bool start = started.empty() || started[i];
      Config cfg = config(i, extra);
      cfg.sync.round_timeout_s = round_timeout_s;
      cfg.sync.every = cfg.sync.fragments = fragments;
      if (adjust) adjust(cfg);
      engines.push_back(start ? std::make_unique<SyncEngine>(cfg, models[i]->params) : nullptr);
    }
  }
  // "{id}" in `extra` stands for the node's id (per-node certificate paths).
  Config config(int i, std::string extra) const {
    for (std::size_t at; (at = extra.find("{id}")) != std::string::npos;) extra.replace(at, 4, std::to_string(i));
    return parse_config(test::node_yaml(i, ports, extra), fmt::format("node{}.yaml", i));
  }
  // Runs round r on every started node, or only on those in `only` (the others miss it).
  std::vector<SyncRoundReport> round(std::uint64_t r, std::int64_t step = 1, std::vector<int> only = {},
                                     int fragment = kWholeModel) {
    before.clear();
    for (auto& m : models) before.push_back(m->values());
    std::vector<std::future<SyncRoundReport>> calls;
    for (std::size_t i = 0; i < engines.size(); ++i) {
      auto& e = engines[i];
      if (!only.empty() && std::find(only.begin(), only.end(), static_cast<int>(i)) == only.end()) continue;
      if (e)
        calls.push_back(std::async(std::launch::async,
                                   [&e, r, step, fragment] { return e->run_round(r, step, 0, fragment); }));
    }
    std::vector<SyncRoundReport> out;
    for (auto& c : calls) out.push_back(c.get());
    return out;
  }
  // Expected SPES result from the pre-round copies of `nodes` (ascending ids).
  std::vector<std::vector<float>> expected(const std::vector<int>& nodes, int n_total) const {
    const ParamSet& P = models[0]->params;
    std::vector<std::vector<float>> want(P.size());
    const int m = test::kExperts / n_total;
    for (std::size_t t = 0; t < P.size(); ++t) {
      if (P[t].is_expert()) {
        want[t] = before[static_cast<std::size_t>(P[t].expert / m)][t];
        continue;
      }
      want[t] = before[nodes[0]][t];
      for (std::size_t k = 1; k < nodes.size(); ++k)
        for (std::size_t x = 0; x < want[t].size(); ++x) want[t][x] += before[nodes[k]][t][x];
      for (auto& v : want[t]) v /= static_cast<float>(nodes.size());
    }
    return want;
  }
  void perturb(float amount) {  // stands in for H steps of local training
    for (std::size_t i = 0; i < models.size(); ++i)
      for (auto& t : models[i]->storage)
        for (std::size_t x = 0; x < t.size(); ++x) t[x] += amount * static_cast<float>((x * 7 + i * 13) % 11) / 11.0f;
  }
};

TEST(SyncEngine, FourNodesHoldTheSpesResultBitForBit) {
  Cluster c(4, std::string(kInsecure) + "  compression: none\n");  // bytes checked against the fp32 count below
  for (std::uint64_t r = 1; r <= 2; ++r) {
    auto reports = c.round(r);
    const auto want = c.expected({0, 1, 2, 3}, 4);
    for (int i = 0; i < 4; ++i) {
      EXPECT_TRUE(reports[i].skipped.empty());
      EXPECT_EQ(c.models[i]->values(), want) << "node " << i << " round " << r;
      // Per-peer bytes: one entry per other node, summing to the round's total, none empty.
      ASSERT_EQ(reports[i].by_peer.size(), 3u);
      std::uint64_t sum = 0;
      for (const auto& b : reports[i].by_peer) {
        EXPECT_NE(b.peer, i);
        EXPECT_GT(b.in, 0u);
        sum += b.in;
      }
      EXPECT_EQ(sum, reports[i].bytes_in);
    }
    c.perturb(0.01f);
  }
  // Bytes: what the nodes received is what their services sent, and about 2·S·(N−1)/N + 3 experts.
  std::uint64_t in = 0, out = 0;
  for (auto& e : c.engines) in += e->bytes_received(), out += e->bytes_sent();
  EXPECT_EQ(in, out);
  const ParamSet& P = c.models[0]->params;
  const double per_node_per_round = (2.0 * P.shared_numel() * 3 / 4 + 3.0 * P.expert_numel(0)) * 4;
  // Chunk headers are a few % on this toy model with many small tensors.
  EXPECT_NEAR(static_cast<double>(in) / (4 * 2), per_node_per_round, 0.1 * per_node_per_round);
}

TEST(SyncEngine, LossyEncodingsStayBitIdenticalAcrossNodes) {
  for (const char* enc : {"bf16", "int8_delta", "sparse"}) {
    const bool sparse = std::string(enc) == "sparse";
    // Sparse remainders in buffers: every node holds the synced weights (in the weights, the
    // default, each node keeps its own: SparseRemaindersReachTheLastRound… below).
    Cluster c(4, fmt::format("{}  encoding: {{shared: {}, experts: {}}}\n"
                             "  sparse: {{chunk: 256, density: 0.05, bits: 2, local_experts: false, local_shared: off, dense_below: 100}}\n",
                             kInsecure, enc, enc));
    for (std::uint64_t r = 1; r <= 3; ++r) {
      c.perturb(0.01f);
      for (const auto& rep : c.round(r)) {  // encoding is part of the round's time
        EXPECT_GT(rep.encode_s, 0.0) << enc;
        EXPECT_LE(rep.encode_s, rep.seconds) << enc;
      }
      const auto want = c.expected({0, 1, 2, 3}, 4);
      for (int i = 1; i < 4; ++i) EXPECT_EQ(c.models[i]->values(), c.models[0]->values()) << enc << " node " << i;
      double worst = 0;
      for (std::size_t t = 0; t < want.size(); ++t)
        for (std::size_t x = 0; x < want[t].size(); ++x)
          worst = std::max(worst, std::fabs(double(want[t][x]) - c.models[0]->storage[t][x]));
      // values ~1: a bf16 ulp is 2^-7. Sparse sends 5% of each delta a round, the rest waits in
      // the senders' buffers (Codec.SparseErrorFeedbackCarriesEveryUnsentValue): only identity here.
      if (!sparse) {
        EXPECT_LT(worst, 0.02) << enc << " round " << r;
      }
    }
    // Every byte a service sent was received, in the encoding it went out in: round 1 of int8 and
    // sparse in fp32 (no baseline yet), then int8 / sparse; bf16 throughout.
    std::map<std::string, std::uint64_t> sent, received;
    for (const auto& e : c.engines) {
      for (const auto& [name, b] : e->bytes_sent_by_encoding()) sent[name] += b;
      for (const auto& [name, b] : e->bytes_received_by_encoding()) received[name] += b;
    }
    EXPECT_EQ(sent, received) << enc;
    EXPECT_GT(sent[enc], 0u) << enc;
    EXPECT_EQ(sent.count("fp32"), std::string(enc) == "bf16" ? 0u : 1u) << enc;
    if (sparse) {
      EXPECT_GT(sent["int8_delta"], 0u);  // norms and routers (under sync.sparse.dense_below)
    }
  }
}

// Sparse rounds lose no update, whatever share of the unsent remainder the weights hold: after
// the run's last round (dense) every node holds the sum of all updates — the first round's mean
// plus, per round, the mean of the nodes' shared updates and each owner's expert updates. With
// sync.sparse.local_experts each owner keeps its experts' whole update between rounds (a round
// leaves them as they were) while every other node holds one identical copy.
TEST(SyncEngine, SparseRemaindersReachTheLastRoundInBuffersOrInTheWeights) {
  // "whole1": the shared contributions and averages sent whole (sync.sparse.shared_density 1);
  // "whole1a4": the same with the averages at 4 bits (sync.sparse.average_bits).
  std::map<std::string, std::uint64_t> sparse_bytes;
  for (const std::string shared : {"off", "mean", "whole", "whole1", "whole1a4"}) {
    const bool local = shared != "off";
    const bool whole1 = shared.rfind("whole1", 0) == 0;
    const std::string yaml = fmt::format(
        "{}  encoding: {{shared: sparse, experts: sparse}}\n"
        "  sparse: {{chunk: 256, density: 0.05, bits: 2, local_experts: {}, local_shared: {}, shared_density: {}, "
        "dense_below: 100, average_bits: {}}}\n  compression: none\n",  // bytes compared below; the perturbations repeat
        kInsecure, local, shared.substr(0, 5), whole1 ? 1 : 0, shared == "whole1a4" ? 4 : 0);
    constexpr std::uint64_t kRounds = 4;
    Cluster c(4, yaml, {}, 20, 1, [](Config& cfg) { cfg.train.steps = kRounds; });
    const ParamSet& P = c.models[0]->params;
    const int per_node = test::kExperts / 4;
    std::vector<std::vector<float>> ideal;
    for (std::uint64_t r = 1; r <= kRounds; ++r) {
      std::vector<std::vector<std::vector<float>>> pre;
      for (auto& m : c.models) pre.push_back(m->values());
      c.perturb(0.01f);
      if (r > 1) {  // this round's updates: the shared mean and each owner's
        for (std::size_t t = 0; t < P.size(); ++t)
          for (std::size_t x = 0; x < ideal[t].size(); ++x) {
            double u = 0;
            if (P[t].is_expert()) {
              const auto o = static_cast<std::size_t>(P[t].expert / per_node);
              u = c.models[o]->storage[t][x] - pre[o][t][x];
            } else {
              for (std::size_t i = 0; i < 4; ++i) u += (c.models[i]->storage[t][x] - pre[i][t][x]) / 4.0;
            }
            ideal[t][x] += static_cast<float>(u);
          }
      }
      for (const auto& rep : c.round(r)) {  // every payload accepted (the averages' bits included)
        EXPECT_TRUE(rep.skipped.empty()) << shared << " round " << r << ": " << rep.skipped[0].reason;
      }
      if (r == 1) ideal = c.models[0]->values();  // fp32 (no baseline yet): the SPES result everywhere
      if (r == 1 || r == kRounds) {
        for (int i = 1; i < 4; ++i) EXPECT_EQ(c.models[i]->values(), c.models[0]->values()) << "round " << r << " node " << i;
        continue;
      }
      double kept = 0, unsent = 0;  // owner: |after - before|; owner vs the others' copy: largest difference
      for (std::size_t t = 0; t < P.size(); ++t) {
        if (!P[t].is_expert()) continue;
        const auto o = static_cast<std::size_t>(P[t].expert / per_node);
        const std::size_t other = (o + 1) % 4;
        for (std::size_t i = 0; i < 4; ++i)
          if (i != o && i != other) EXPECT_EQ(c.models[i]->storage[t], c.models[other]->storage[t]) << "tensor " << t;
        for (std::size_t x = 0; x < c.before[o][t].size(); ++x) {
          kept = std::max(kept, std::fabs(double(c.models[o]->storage[t][x]) - c.before[o][t][x]));
          unsent = std::max(unsent, std::fabs(double(c.models[o]->storage[t][x]) - c.models[other]->storage[t][x]));
        }
      }
      if (local) {
        EXPECT_LT(kept, 1e-6) << "round " << r;  // the owner's weights are its own
        EXPECT_GT(unsent, 1e-3) << "round " << r;  // and the others have only part of the update
      } else {
        for (int i = 1; i < 4; ++i) EXPECT_EQ(c.models[i]->values(), c.models[0]->values()) << "round " << r << " node " << i;
      }
    }
    double worst = 0;
    for (std::size_t t = 0; t < P.size(); ++t)
      for (std::size_t x = 0; x < ideal[t].size(); ++x)
        worst = std::max(worst, std::fabs(double(ideal[t][x]) - c.models[0]->storage[t][x]));
    EXPECT_LT(worst, 1e-5) << "local_shared " << shared;
    for (const auto& e : c.engines) sparse_bytes[shared] += e->bytes_sent_by_encoding().at("sparse");
  }
  // Averages at 4 bits: 2 more bits for every averaged value a node receives — each slice goes
  // to the 3 nodes that do not aggregate it, in the 2 sparse rounds (the first and last are
  // fp32); only the shared tensors of dense_below (100) values or more are sparse.
  std::int64_t sparse_shared = 0;
  const FakeModel shapes(test::kLayers, test::kExperts, test::kDim, test::kFf, test::kVocab, 1);
  for (std::size_t t = 0; t < shapes.params.size(); ++t)
    if (!shapes.params[t].is_expert() && shapes.params[t].numel >= 100) sparse_shared += shapes.params[t].numel;
  const double extra = 2.0 * 3 * static_cast<double>(sparse_shared) * 2 / 8;
  const double got = static_cast<double>(sparse_bytes["whole1a4"]) - static_cast<double>(sparse_bytes["whole1"]);
  EXPECT_GE(got, extra);
  EXPECT_LE(got, 1.03 * extra);  // a chunk's last byte rounds up
}

// int8 deltas are against the last round's weights; a node that missed a round holds other
// ones. Its next round travels in fp32 (both ways, only where the copies differ) and every node
// ends it bit-identical with the SPES result again — nothing is rejected, nobody skipped.
TEST(SyncEngine, NodeThatMissedARoundCatchesUpUnderInt8Deltas) {
  Cluster c(4, fmt::format("{}  encoding: {{shared: int8_delta, experts: int8_delta}}\n", kInsecure), {}, 2.0);
  for (std::uint64_t r = 1; r <= 2; ++r) {
    c.perturb(0.01f);
    for (const auto& rep : c.round(r)) EXPECT_TRUE(rep.skipped.empty()) << "round " << r;
  }
  c.perturb(0.01f);
  auto missed = c.round(3, 1, {0, 1, 2});  // node 3 misses round 3
  for (const auto& rep : missed) ASSERT_EQ(rep.skipped.size(), 1u);
  c.perturb(0.01f);
  auto back = c.round(4);
  for (int i = 0; i < 4; ++i) EXPECT_TRUE(back[i].skipped.empty()) << "node " << i << ": " << back[i].skipped[0].reason;
  for (int i = 1; i < 4; ++i) EXPECT_EQ(c.models[i]->values(), c.models[0]->values()) << "node " << i;
  // Node 3 got fp32 from everyone (4 bytes a value instead of ~1): far more bytes than node 0,
  // which only got node 3's raw copy of its slice in fp32.
  EXPECT_GT(back[3].bytes_in, 2 * back[0].bytes_in);
  // And the round after is int8 everywhere again.
  c.perturb(0.01f);
  auto next = c.round(5);
  for (int i = 0; i < 4; ++i) EXPECT_TRUE(next[i].skipped.empty());
  EXPECT_LT(next[3].bytes_in, back[3].bytes_in / 2);
  for (int i = 1; i < 4; ++i) EXPECT_EQ(c.models[i]->values(), c.models[0]->values()) << "node " << i;
}

// sync.fragments: round r carries fragment (r - 1) % F only — the SPES result on its tensors,
// the others untouched — so F rounds cover every tensor exactly once; the last round of a run
// carries the whole model and leaves every node bit-identical. Lossy encodings keep their
// baselines per fragment.
TEST(SyncEngine, FragmentsSyncOnePartPerRoundAndTheWholeModelLast) {
  constexpr int F = 3;
  for (const char* enc : {"fp32", "int8_delta"}) {
    Cluster c(4, fmt::format("{}  encoding: {{shared: {}, experts: {}}}\n", kInsecure, enc, enc), {}, 20, F);
    const std::size_t n_tensors = c.models[0]->params.size();
    std::vector<int> covered(n_tensors, 0);
    for (std::uint64_t r = 1; r <= 2 * F; ++r) {
      const int f = c.engines[0]->fragment_of(r, /*last=*/false);
      ASSERT_EQ(f, static_cast<int>((r - 1) % F));
      const auto& mine = c.engines[0]->tensors_of(f);
      c.perturb(0.01f);
      for (const auto& rep : c.round(r, static_cast<std::int64_t>(r), {}, f)) {
        EXPECT_TRUE(rep.skipped.empty()) << enc << " round " << r;
        EXPECT_EQ(rep.fragment, f);
      }
      const auto want = c.expected({0, 1, 2, 3}, 4);
      for (std::size_t t = 0; t < n_tensors; ++t) {
        const bool in_round = std::find(mine.begin(), mine.end(), t) != mine.end();
        if (r <= F) covered[t] += in_round ? 1 : 0;
        for (int i = 0; i < 4; ++i) {
          const auto& got = c.models[i]->storage[t];
          if (!in_round) {
            EXPECT_TRUE(got == c.before[i][t]) << enc << " round " << r << " touched tensor " << t << " on node " << i;
          } else if (std::string(enc) == "fp32") {
            EXPECT_TRUE(got == want[t]) << "round " << r << " tensor " << t << " node " << i;
          } else {
            EXPECT_TRUE(got == c.models[0]->storage[t]) << "int8 round " << r << " tensor " << t << " node " << i;
            for (std::size_t x = 0; x < got.size(); ++x) ASSERT_NEAR(got[x], want[t][x], 0.02);
          }
        }
      }
    }
    for (std::size_t t = 0; t < n_tensors; ++t) EXPECT_EQ(covered[t], 1) << "tensor " << t;
    // The last round: the whole model, the SPES result everywhere.
    const std::uint64_t last = 2 * F + 1;
    ASSERT_EQ(c.engines[0]->fragment_of(last, /*last=*/true), kWholeModel);
    c.perturb(0.01f);
    c.round(last, static_cast<std::int64_t>(last), {}, kWholeModel);
    const auto want = c.expected({0, 1, 2, 3}, 4);
    for (int i = 0; i < 4; ++i) {
      EXPECT_TRUE(c.models[i]->values() == c.models[0]->values()) << enc << " node " << i;
      if (std::string(enc) == "fp32") {
        EXPECT_TRUE(c.models[i]->values() == want) << "node " << i;
      }
    }
    // And a fragment's round after it agrees everywhere again (int8: baselines from the whole
    // round, no payload rejected).
    c.perturb(0.01f);
    const int f = c.engines[0]->fragment_of(last + 1, false);
    for (const auto& rep : c.round(last + 1, static_cast<std::int64_t>(last + 1), {}, f))
      EXPECT_TRUE(rep.skipped.empty()) << enc;
    for (std::size_t t : c.engines[0]->tensors_of(f))
      for (int i = 1; i < 4; ++i)
        EXPECT_TRUE(c.models[i]->storage[t] == c.models[0]->storage[t]) << enc << " node " << i << " tensor " << t;
  }
}

// Sparse payloads in fragments: each fragment keeps its own buffers; the run's last (whole-model)
// round sends what every fragment's buffers still hold, so the run ends where fp32 fragments end
// (the same updates), bit-identical on every node, whatever the weights kept of the remainders.
TEST(SyncEngine, SparseFragmentsSendEveryRemainderInTheWholeModelRound) {
  constexpr int F = 3;
  constexpr std::uint64_t kLast = 2 * F + 1;
  auto run = [&](const std::string& encoding_yaml) {
    Cluster c(4, std::string(kInsecure) + encoding_yaml, {}, 20, F, [](Config& cfg) { cfg.train.steps = kLast; });
    for (std::uint64_t r = 1; r <= kLast; ++r) {
      c.perturb(0.01f);
      const int f = c.engines[0]->fragment_of(r, /*last=*/r == kLast);
      for (const auto& rep : c.round(r, static_cast<std::int64_t>(r), {}, f))
        EXPECT_TRUE(rep.skipped.empty()) << encoding_yaml << " round " << r << ": " << rep.skipped[0].reason;
    }
    for (int i = 1; i < 4; ++i) EXPECT_TRUE(c.models[i]->values() == c.models[0]->values()) << encoding_yaml << " node " << i;
    return c.models[0]->values();
  };
  const auto fp32 = run("");
  // The remainders kept in the weights, all, a quarter or none; the shared part at 5% (its
  // averages then hold back whole values) or whole (the default: quantization error).
  for (const auto& [local_shared, shared_density] :
       std::vector<std::pair<std::string, int>>{{"whole", 0}, {"mean", 0}, {"off", 0}, {"whole", 1}}) {
    const auto sparse = run(fmt::format(
        "  encoding: {{shared: sparse, experts: sparse}}\n"
        "  sparse: {{chunk: 256, density: 0.05, local_experts: {}, local_shared: {}, shared_density: {}, dense_below: 100}}\n",
        local_shared != "off", local_shared, shared_density));
    double worst = 0;
    for (std::size_t t = 0; t < fp32.size(); ++t)
      for (std::size_t x = 0; x < fp32[t].size(); ++x) worst = std::max(worst, std::fabs(double(fp32[t][x]) - sparse[t][x]));
    EXPECT_LT(worst, 1e-5) << "local_shared " << local_shared << ", shared_density " << shared_density;
  }
}

TEST(SyncEngine, OneNodeChangesNothing) {
  Cluster c(1);
  const auto before = c.models[0]->values();
  auto reports = c.round(1);
  EXPECT_EQ(c.models[0]->values(), before);
  EXPECT_EQ(reports[0].bytes_in, 0u);
}

TEST(SyncEngine, DeadPeerIsSkippedAndTheOthersFinish) {
  Cluster c(4, kInsecure, {true, true, false, true});  // node 2 never comes up
  auto reports = c.round(1);
  const auto want = c.expected({0, 1, 3}, 4);
  const ParamSet& P = c.models[0]->params;
  for (int i : {0, 1, 3}) {
    const auto& rep = reports[i == 3 ? 2 : i];
    ASSERT_EQ(rep.skipped.size(), 1u);
    EXPECT_EQ(rep.skipped[0].peer, 2);
    for (std::size_t t = 0; t < P.size(); ++t) {
      if (P[t].expert == 2) EXPECT_EQ(c.models[i]->storage[t], c.before[i][t]) << "dead owner's expert kept";
      else EXPECT_EQ(c.models[i]->storage[t], want[t]) << P[t].name << " on node " << i;
    }
  }
  // Next round: the suspect is tried once without retries, and skipped again.
  auto again = c.round(2);
  for (const auto& rep : again) ASSERT_EQ(rep.skipped.size(), 1u);
  EXPECT_EQ(c.engines[0]->skip_counts()[2], 2u);
}

TEST(SyncEngine, AStreamCutMidwayResumesAtTheChunkItReached) {
  const std::string extra = std::string(kInsecure) + "  chunk_bytes: 4096\n  compression: none\n";  // many chunks per stream
  // The reference: the same two nodes over a direct link.
  Cluster direct(2, extra);
  const auto want = direct.round(1);
  ASSERT_TRUE(want[0].skipped.empty());
  ASSERT_GT(want[0].bytes_in, 8u * 4096u);
  // Again, with node 0 pulling from node 1 through a proxy that cuts the link once, halfway (a
  // third or two thirds of the way when the cut fell between two streams: nothing to resume).
  std::uint64_t resumed = 0;
  for (const double at : {0.5, 1.0 / 3, 2.0 / 3}) {
    const int p0 = test::free_port(), p1 = test::free_port();
    test::CutProxy proxy(p1, static_cast<std::size_t>(static_cast<double>(want[0].bytes_in) * at));
    FakeModel m0(test::kLayers, test::kExperts, test::kDim, test::kFf, test::kVocab, 100);
    FakeModel m1(test::kLayers, test::kExperts, test::kDim, test::kFf, test::kVocab, 101);
    SyncEngine e0(parse_config(test::node_yaml(0, {p0, proxy.port()}, extra), "node0.yaml"), m0.params);
    SyncEngine e1(parse_config(test::node_yaml(1, {p0, p1}, extra), "node1.yaml"), m1.params);
    auto r1 = std::async(std::launch::async, [&] { return e1.run_round(1, 1); });
    const SyncRoundReport r0 = e0.run_round(1, 1);
    r1.get();
    EXPECT_TRUE(proxy.cut());
    EXPECT_GE(proxy.connections(), 2);
    EXPECT_TRUE(r0.skipped.empty()) << r0.skipped[0].reason;
    // Resumed, not restarted: not one chunk came twice, and the result is the direct one.
    EXPECT_EQ(r0.bytes_in, want[0].bytes_in) << "cut at " << at;
    EXPECT_EQ(m0.values(), direct.models[0]->values());
    EXPECT_EQ(m1.values(), direct.models[1]->values());
    resumed = r0.resumed_streams;
    if (resumed > 0) break;
  }
  EXPECT_GE(resumed, 1u);
}

TEST(RoundDeadline, FollowsTheSlowestRecentCleanRoundWithinItsBounds) {
  sync_detail::RoundDeadline d(4, 2, 100, 3);
  EXPECT_EQ(d.next(), 100);  // nothing measured yet: the ceiling
  d.record(0.1, true, false);
  EXPECT_EQ(d.next(), 2);  // 4 x 0.1 is under the floor
  d.record(5, true, false);
  d.record(1, true, false);
  EXPECT_EQ(d.next(), 20);  // 4 x the slowest of the window
  d.record(30, false, false);  // a silent peer skipped: unchanged, not measured
  EXPECT_EQ(d.next(), 20);
  d.record(30, false, true);  // a slow link: doubles
  EXPECT_EQ(d.next(), 40);
  d.record(30, false, true);
  d.record(30, false, true);
  EXPECT_EQ(d.next(), 100);  // capped by the ceiling
  d.record(1, true, false);  // clean again: the back-off is gone; the window holds 5, 1, 1
  EXPECT_EQ(d.next(), 20);
  d.record(1, true, false);  // 5 s leaves the window of 3
  EXPECT_EQ(d.next(), 4);
  sync_detail::RoundDeadline fixed(0, 2, 100);
  fixed.record(0.1, true, false);
  EXPECT_EQ(fixed.next(), 100);
  EXPECT_EQ(sync_detail::RoundDeadline(4, 300, 100).next(), 100);
}

TEST(SyncEngine, DeadlineAdaptsToMeasuredRoundTimes) {
  // round_timeout_s 20, floor 2 s: once rounds are measured, a peer that misses a round costs
  // the others max(2 s, 4 x their slowest clean round), not 20 s.
  Cluster c(4, std::string(kInsecure) + "  min_round_timeout_s: 2\n");
  const auto r1 = c.round(1);
  const auto r2 = c.round(2, 2);
  for (int i = 0; i < 4; ++i) {
    ASSERT_TRUE(r1[i].skipped.empty() && r2[i].skipped.empty());
    EXPECT_EQ(r1[i].deadline_s, 20);
  }
  const auto t0 = std::chrono::steady_clock::now();
  const auto r3 = c.round(3, 3, {0, 1, 2});  // node 3 misses round 3
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  for (int i = 0; i < 3; ++i) {
    const double want = std::clamp(4 * std::max(r1[i].seconds, r2[i].seconds), 2.0, 20.0);
    EXPECT_DOUBLE_EQ(r3[i].deadline_s, want) << "node " << i;
    ASSERT_EQ(r3[i].skipped.size(), 1u);
    EXPECT_EQ(r3[i].skipped[0].peer, 3);
  }
  EXPECT_LT(took, 15);
  // Everyone back at round 4: no one is left out for good.
  const auto r4 = c.round(4, 4);
  for (int i = 0; i < 4; ++i) EXPECT_TRUE(r4[i].skipped.empty()) << "node " << i;
}

TEST(SyncEngine, PoisonedPayloadIsRejectedAndLeavesWeights) {
  Cluster c(4);
  // Node 3 turns hostile: NaN experts and absurd shared weights.
  FakeModel& evil = *c.models[3];
  for (std::size_t t = 0; t < evil.params.size(); ++t)
    for (auto& v : evil.storage[t]) v = evil.params[t].is_expert() ? NAN : 1e9f;
  auto reports = c.round(1);
  const auto want = c.expected({0, 1, 2}, 4);
  const ParamSet& P = c.models[0]->params;
  for (int i = 0; i < 3; ++i) {
    ASSERT_EQ(reports[i].skipped.size(), 1u) << i;
    EXPECT_EQ(reports[i].skipped[0].peer, 3);
    EXPECT_NE(reports[i].skipped[0].reason.find("rejected payload"), std::string::npos) << reports[i].skipped[0].reason;
    for (std::size_t t = 0; t < P.size(); ++t) {
      if (P[t].expert == 3) EXPECT_EQ(c.models[i]->storage[t], c.before[i][t]);
      else EXPECT_EQ(c.models[i]->storage[t], want[t]) << P[t].name << " on node " << i;
    }
  }
}

// A client that is not a node of the run gets refused with the proper status, and nothing changes.
TEST(SyncEngine, HostileClientsAreRefused) {
  Cluster c(1);
  const auto before = c.models[0]->values();
  c.round(1);
  auto channel = grpc::CreateChannel(fmt::format("127.0.0.1:{}", c.ports[0]), grpc::InsecureChannelCredentials());
  auto stub = spes::v1::SyncService::NewStub(channel);
  auto call = [&](const std::string& token, std::function<void(spes::v1::FetchRequest&)> edit) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    if (!token.empty()) ctx.AddMetadata(sync_detail::kTokenHeader, token);
    spes::v1::FetchRequest req;
    req.set_run_id("synctest");
    req.set_round(1);
    req.set_part(spes::v1::EXPERTS);
    edit(req);
    auto reader = stub->Fetch(&ctx, req);
    spes::v1::TensorChunk chunk;
    int n = 0;
    while (reader->Read(&chunk)) ++n;
    auto st = reader->Finish();
    return std::pair{st.error_code(), n};
  };
  auto nothing = [](spes::v1::FetchRequest&) {};
  EXPECT_EQ(call("sesame", nothing).first, grpc::StatusCode::OK);
  EXPECT_GT(call("sesame", nothing).second, 0);
  EXPECT_EQ(call("", nothing).first, grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(call("sesamf", nothing), std::pair(grpc::StatusCode::UNAUTHENTICATED, 0));
  EXPECT_EQ(call("sesame", [](auto& r) { r.set_run_id("another-run"); }).first, grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_EQ(call("sesame", [](auto& r) { r.set_round(99); }).first, grpc::StatusCode::OUT_OF_RANGE);
  EXPECT_EQ(call("sesame", [](auto& r) { r.set_part(spes::v1::SHARED_RAW); r.set_slice(7); }).first,
            grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(call("sesame", [](auto& r) { r.set_run_id(std::string(1 << 20, 'x')); }).first,
            grpc::StatusCode::RESOURCE_EXHAUSTED);
  // Resuming a broken-off stream: from its chunk k on, and no chunk past its end.
  const int chunks = call("sesame", nothing).second;
  EXPECT_EQ(call("sesame", [&](auto& r) { r.set_first_chunk(chunks - 1); }), std::pair(grpc::StatusCode::OK, 1));
  EXPECT_EQ(call("sesame", [&](auto& r) { r.set_first_chunk(chunks); }),
            std::pair(grpc::StatusCode::INVALID_ARGUMENT, 0));
  EXPECT_GE(c.engines[0]->calls_refused(), 6u);
  // No token, a wrong token, another run, a bad slice, a resume past the end: what only a hostile
  // or misconfigured caller does (the round it is not at yet is not among them), for the status.
  EXPECT_EQ(c.engines[0]->suspicious_calls(), 5u);
  EXPECT_NE(c.engines[0]->last_suspicious_call().find("first chunk"), std::string::npos)
      << c.engines[0]->last_suspicious_call();
  EXPECT_EQ(c.models[0]->values(), before);
}

class SyncTls : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = std::string(SPES_TEST_DATA_DIR) + "/tls";
    const std::string cmd = fmt::format("bash {}/scripts/make_test_ca.sh {} >/dev/null", SPES_SOURCE_DIR, dir_);
    ASSERT_EQ(std::system(cmd.c_str()), 0);
  }
  static std::string tls_yaml() {
    return fmt::format("  tls: {{ca: {0}/ca.pem, cert: {0}/node.pem, key: {0}/node.key}}\n", dir_);
  }
  static inline std::string dir_;
};

TEST_F(SyncTls, NodesSyncOverTlsAndPlaintextClientsCannotConnect) {
  Cluster c(2, tls_yaml());
  auto reports = c.round(1);
  const auto want = c.expected({0, 1}, 2);
  for (int i = 0; i < 2; ++i) {
    EXPECT_TRUE(reports[i].skipped.empty());
    EXPECT_EQ(c.models[i]->values(), want);
  }
  auto channel = grpc::CreateChannel(fmt::format("127.0.0.1:{}", c.ports[0]), grpc::InsecureChannelCredentials());
  auto stub = spes::v1::SyncService::NewStub(channel);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(3));
  ctx.AddMetadata(sync_detail::kTokenHeader, "sesame");
  spes::v1::FetchRequest req;
  req.set_run_id("synctest");
  req.set_round(1);
  req.set_part(spes::v1::EXPERTS);
  auto reader = stub->Fetch(&ctx, req);
  spes::v1::TensorChunk chunk;
  EXPECT_FALSE(reader->Read(&chunk));
  EXPECT_NE(reader->Finish().error_code(), grpc::StatusCode::OK);
}

TEST(RobustMerge, TrimmedMeanAndUpdateHistory) {
  const std::vector<float> a{1, 5, -2}, b{2, 5, 0}, c{3, 5, 1}, d{1000, 5, 2}, e{-7, 5, 3};
  EXPECT_EQ(sync_detail::trimmed_mean({&a, &b, &c, &d, &e}, 1), (std::vector<float>{2, 5, 1}));
  EXPECT_EQ(sync_detail::trimmed_mean({&a, &b, &c, &d, &e}, 2), (std::vector<float>{2, 5, 1}));
  RobustConfig robust;
  robust.shared = "trimmed";
  // Too few contributors to drop one at each end and keep two: the plain mean.
  EXPECT_EQ(sync_detail::shared_average({&a, &b, &c}, robust), sync_detail::fp32_mean({&a, &b, &c}));
  EXPECT_EQ(sync_detail::shared_average({&a, &b, &c, &d}, robust), (std::vector<float>{2.5f, 5, 0.5f}));

  robust.expert_factor = 4;
  robust.window = 4;
  robust.min_history = 3;
  sync_detail::UpdateHistory h(robust);
  for (double u : {0.5, 0.01, 0.012}) {  // anything goes until min_history updates are known
    EXPECT_EQ(h.check(u), "");
    h.record(u);
  }
  EXPECT_DOUBLE_EQ(h.median(), 0.012);
  EXPECT_EQ(h.check(0.047), "");
  EXPECT_NE(h.check(0.049).find("more than sync.robust.expert_factor 4 x the median 0.012"), std::string::npos);
  for (double u : {0.02, 0.02, 0.02}) h.record(u);  // the window forgets the oldest
  EXPECT_EQ(h.size(), 4u);
  EXPECT_DOUBLE_EQ(h.median(), 0.02);
}

// A dishonest owner that scales its experts, a little or a lot, is refused by every honest node
// (each keeps its old copy); noise of its honest update's size gets through but is bounded by the
// history. Honest rounds before it see no refusal.
TEST(RobustMerge, AnOwnerScalingItsExpertsIsRefused) {
  Cluster c(4);
  const ParamSet& P = c.models[0]->params;
  auto scale_own_experts = [&](int node, float factor) {
    for (std::size_t t = 0; t < P.size(); ++t)
      if (P[t].expert == node)
        for (auto& v : c.models[node]->storage[t]) v *= factor;
  };
  auto expert3 = [&](int node) {
    std::vector<std::vector<float>> out;
    for (std::size_t t = 0; t < P.size(); ++t)
      if (P[t].expert == 3) out.push_back(c.models[node]->storage[t]);
    return out;
  };
  std::uint64_t r = 1;
  for (; r <= 4; ++r) {
    c.perturb(0.01f);
    for (const auto& report : c.round(r)) EXPECT_TRUE(report.skipped.empty()) << "honest round " << r;
  }
  for (const float factor : {1.5f, 1.05f}) {
    c.perturb(0.01f);
    scale_own_experts(3, factor);
    std::vector<std::vector<std::vector<float>>> kept;
    for (int i = 0; i < 3; ++i) kept.push_back(expert3(i));
    auto reports = c.round(r++);
    for (int i = 0; i < 3; ++i) {
      ASSERT_EQ(reports[i].skipped.size(), 1u) << "x" << factor;
      EXPECT_EQ(reports[i].skipped[0].peer, 3);
      EXPECT_NE(reports[i].skipped[0].reason.find("sync.robust.expert_factor"), std::string::npos)
          << reports[i].skipped[0].reason;
      EXPECT_EQ(expert3(i), kept[i]) << "node " << i << " took the scaled experts";
    }
  }
}

// An owner adding noise to its experts: noise the size of an honest round's update passes (it is
// no bigger than an honest update, which is all the bound promises); ten times that is refused.
TEST(RobustMerge, NoiseOnAnOwnersExpertsIsBoundedByItsHonestUpdates) {
  Cluster c(4);
  const ParamSet& P = c.models[0]->params;
  auto expert3 = [&](int node) {
    std::vector<float> out;
    for (std::size_t t = 0; t < P.size(); ++t)
      if (P[t].expert == 3) out.insert(out.end(), c.models[node]->storage[t].begin(), c.models[node]->storage[t].end());
    return out;
  };
  auto distance = [](const std::vector<float>& a, const std::vector<float>& b) {
    double d = 0, n = 0;
    for (std::size_t x = 0; x < a.size(); ++x) {
      d += (a[x] - b[x]) * static_cast<double>(a[x] - b[x]);
      n += a[x] * static_cast<double>(a[x]);
    }
    return std::sqrt(d / n);  // relative to a's norm
  };
  std::uint64_t r = 1;
  double honest = 0;
  for (; r <= 4; ++r) {
    c.perturb(0.01f);
    const auto before = expert3(0);
    for (const auto& report : c.round(r)) EXPECT_TRUE(report.skipped.empty()) << "honest round " << r;
    honest = std::max(honest, distance(before, expert3(0)));
  }
  ASSERT_GT(honest, 0);
  for (const float size : {1.0f, 10.0f}) {
    c.perturb(0.01f);
    for (std::size_t t = 0; t < P.size(); ++t)
      if (P[t].expert == 3)
        for (std::size_t x = 0; x < c.models[3]->storage[t].size(); ++x)  // zero-mean, +-0.01 * size
          c.models[3]->storage[t][x] += size * 0.01f * (static_cast<float>((x * 37 + t * 5) % 11) - 5.0f) / 5.0f;
    const auto before = expert3(0);
    auto reports = c.round(r++);
    const double moved = distance(before, expert3(0));
    if (size == 1.0f) {
      for (const auto& report : reports) EXPECT_TRUE(report.skipped.empty()) << "noise of an honest update's size";
      EXPECT_LE(moved, 4 * honest) << "accepted, but more than sync.robust.expert_factor x an honest update";
    } else {
      ASSERT_EQ(reports[0].skipped.size(), 1u);
      EXPECT_EQ(reports[0].skipped[0].peer, 3);
      EXPECT_EQ(moved, 0.0) << "node 0 took the noisy experts";
    }
  }
}

// Through a warm-up an honest owner's update grows with the learning rate: round 4's is 2.4 x the
// median of rounds 1-3. The bound compares updates per unit of the round's learning rate, so even
// a tight factor (1.5) refuses none of them, and still refuses a x1.5 scaling.
TEST(RobustMerge, AWarmupIsNoDrift) {
  ScheduleConfig schedule;
  Cluster c(4, kInsecure, {}, 20, 1, [&](Config& cfg) {
    cfg.train.steps = 100;
    cfg.schedule.warmup_steps = 100;
    cfg.schedule.warmup_start_ratio = 0;
    cfg.sync.every = 10;
    cfg.sync.robust.expert_factor = 1.5;
    schedule = cfg.schedule;
  });
  auto round_lr = [&](std::int64_t step) {  // mean over the round's 10 steps, over the peak
    double sum = 0;
    for (std::int64_t s = step - 10; s < step; ++s) sum += learning_rate(1.0, schedule, 100, s);
    return sum / 10;
  };
  std::uint64_t r = 1;
  for (; r <= 8; ++r) {
    c.perturb(0.01f * static_cast<float>(round_lr(10 * static_cast<std::int64_t>(r))));
    for (const auto& report : c.round(r, 10 * static_cast<std::int64_t>(r)))
      EXPECT_TRUE(report.skipped.empty()) << "honest round " << r << " in the warm-up: " << report.skipped[0].reason;
  }
  c.perturb(0.01f * static_cast<float>(round_lr(90)));
  const ParamSet& P = c.models[0]->params;
  for (std::size_t t = 0; t < P.size(); ++t)
    if (P[t].expert == 3)
      for (auto& v : c.models[3]->storage[t]) v *= 1.5f;
  auto reports = c.round(r, 90);
  ASSERT_EQ(reports[0].skipped.size(), 1u);
  EXPECT_EQ(reports[0].skipped[0].peer, 3);
}

// sync.robust.shared: trimmed — a node that pushes its shared values far off moves nothing: every
// node holds, bit for bit, the mean of the middle two contributions of four.
TEST(RobustMerge, TrimmedSharedMeanIgnoresAnOutlier) {
  Cluster c(4, std::string(kInsecure) + "  robust: {shared: trimmed}\n");
  const ParamSet& P = c.models[0]->params;
  c.perturb(0.01f);
  for (std::size_t t = 0; t < P.size(); ++t)
    if (P[t].expert < 0)
      for (auto& v : c.models[3]->storage[t]) v += 2.0f;  // within max_rel_change: only trimming stops it
  for (const auto& report : c.round(1)) EXPECT_TRUE(report.skipped.empty());
  for (std::size_t t = 0; t < P.size(); ++t) {
    if (P[t].expert >= 0) continue;
    for (std::size_t x = 0; x < c.before[0][t].size(); ++x) {
      std::vector<float> column;
      for (int i = 0; i < 4; ++i) column.push_back(c.before[i][t][x]);
      std::sort(column.begin(), column.end());
      const float want = (column[1] + column[2]) / 2.0f;
      for (int i = 0; i < 4; ++i) ASSERT_EQ(c.models[i]->storage[t][x], want) << P[t].name << " node " << i;
      ASSERT_LT(want, 1.5f);  // the +2 contribution is gone
    }
  }
}

// Per-node certificates from one run CA (`spes ca`): written once per test process, into a
// folder of its own (ctest runs each test of this suite as its own process, in parallel).
class SyncIdentity : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = std::string(SPES_TEST_DATA_DIR) + "/identity-" + std::to_string(::getpid());
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
    ca_ = make_run_ca("synctest", 1);
    write("ca", ca_);
    for (const std::string h : {"node-0", "node-1", "node-5"}) write(h, issue_certificate(ca_, h, {"127.0.0.1"}, 1));
  }
  static void TearDownTestSuite() { std::filesystem::remove_all(dir_); }
  static void write(const std::string& holder, const PemPair& pair) {
    write_file_atomic(dir_ + "/" + holder + ".pem", pair.cert_pem);
    write_file_atomic(dir_ + "/" + holder + ".key", pair.key_pem);
  }
  static std::string tls_yaml() {
    return fmt::format("  tls: {{ca: {0}/ca.pem, cert: {0}/node-{{id}}.pem, key: {0}/node-{{id}}.key}}\n", dir_);
  }
  // A Fetch of round 1's experts from `port` over `holder`'s certificate, asking as node
  // `requester` and expecting the server to be `server_holder`.
  static grpc::StatusCode fetch_as(int port, const std::string& holder, int requester, const std::string& server_holder) {
    sync_detail::TransportSettings s;
    s.ca_pem = ca_.cert_pem;
    s.cert_pem = read_file(dir_ + "/" + holder + ".pem");
    s.key_pem = read_file(dir_ + "/" + holder + ".key");
    s.identity = certificate_identity(s.cert_pem);
    auto channel = grpc::CreateCustomChannel(fmt::format("127.0.0.1:{}", port), sync_detail::channel_credentials(s),
                                             sync_detail::channel_arguments(s, server_holder));
    auto stub = spes::v1::SyncService::NewStub(channel);
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    ctx.AddMetadata(sync_detail::kTokenHeader, "sesame");
    spes::v1::FetchRequest req;
    req.set_run_id("synctest");
    req.set_round(1);
    req.set_part(spes::v1::EXPERTS);
    req.set_requester(static_cast<std::uint32_t>(requester));
    auto reader = stub->Fetch(&ctx, req);
    spes::v1::TensorChunk chunk;
    while (reader->Read(&chunk)) {
    }
    return reader->Finish().error_code();
  }
  static inline std::string dir_;
  static inline PemPair ca_;
};

TEST_F(SyncIdentity, CertificatesNameTheirHolderAndBadFilesAreRefused) {
  const PemPair n1{read_file(dir_ + "/node-1.pem"), read_file(dir_ + "/node-1.key")};
  const CertIdentity id = verify_credentials(ca_.cert_pem, n1.cert_pem, n1.key_pem, {"ca", "cert", "key"});
  EXPECT_EQ(id.run, "synctest");
  EXPECT_EQ(id.node, 1);
  EXPECT_EQ(id.describe(), "node 1 of run 'synctest'");
  const CertIdentity coord = certificate_identity(issue_certificate(ca_, kCoordinatorHolder, {}, 1).cert_pem);
  EXPECT_FALSE(coord.is_node());
  EXPECT_EQ(coord.name, "coordinator");
  auto refusal = [&](const std::string& ca, const std::string& cert, const std::string& key) {
    try {
      verify_credentials(ca, cert, key, {"the-ca", "the-cert", "the-key"});
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  const PemPair other_ca = make_run_ca("synctest", 1);
  const PemPair foreign = issue_certificate(other_ca, "node-1", {}, 1);
  const PemPair expired = issue_certificate(ca_, "node-1", {}, 1, -3 * 86400);
  const std::string n0_key = read_file(dir_ + "/node-0.key");
  EXPECT_NE(refusal(ca_.cert_pem, n1.cert_pem, n0_key).find("the-key is not the key of the certificate the-cert"),
            std::string::npos);
  EXPECT_NE(refusal(ca_.cert_pem, foreign.cert_pem, foreign.key_pem).find("the-cert does not verify against the CA the-ca"),
            std::string::npos);
  EXPECT_NE(refusal(ca_.cert_pem, expired.cert_pem, expired.key_pem).find("expired"), std::string::npos);
  EXPECT_NE(refusal(ca_.cert_pem, "junk", n1.key_pem).find("the-cert is not a PEM certificate"), std::string::npos);
  EXPECT_NE(refusal(ca_.cert_pem, n1.cert_pem, "junk").find("the-key is not a PEM private key"), std::string::npos);
  EXPECT_NE(refusal("junk", n1.cert_pem, n1.key_pem).find("the-ca is not a PEM certificate"), std::string::npos);
  // A node started with another node's certificate stops before it serves anything.
  Cluster c(2, tls_yaml());
  std::string wrong = tls_yaml();
  wrong.replace(wrong.find("node-{id}.pem"), 13, "node-1.pem");
  wrong.replace(wrong.find("node-{id}.key"), 13, "node-1.key");
  try {
    SyncEngine e(c.config(0, wrong), c.models[0]->params);
    ADD_FAILURE() << "node 0 started with node 1's certificate";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("certificate of node 1 of run 'synctest'; this is node 0"), std::string::npos)
        << e.what();
  }
}

TEST_F(SyncIdentity, CallsAreBoundToTheCallersCertificate) {
  Cluster c(2, tls_yaml());
  auto reports = c.round(1);
  const auto want = c.expected({0, 1}, 2);
  for (int i = 0; i < 2; ++i) {
    EXPECT_TRUE(reports[i].skipped.empty());
    EXPECT_EQ(c.models[i]->values(), want);
  }
  const auto suspicious_before = c.engines[0]->suspicious_calls();
  // Node 1's own certificate asking as node 1: served.
  EXPECT_EQ(fetch_as(c.ports[0], "node-1", 1, "node-0"), grpc::StatusCode::OK);
  // Node 1's certificate asking as node 0 (impersonation): refused and counted.
  EXPECT_EQ(fetch_as(c.ports[0], "node-1", 0, "node-0"), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_NE(c.engines[0]->last_suspicious_call().find("certificate is that of node 1"), std::string::npos)
      << c.engines[0]->last_suspicious_call();
  // A valid certificate of the run for a node outside the plan (removed, or never in it): refused.
  EXPECT_EQ(fetch_as(c.ports[0], "node-5", 5, "node-0"), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_NE(c.engines[0]->last_suspicious_call().find("node 5 is not in plan"), std::string::npos);
  EXPECT_EQ(c.engines[0]->suspicious_calls(), suspicious_before + 2);
  // The client checks the server too: node 0's port does not pass for node 1.
  EXPECT_EQ(fetch_as(c.ports[0], "node-1", 1, "node-1"), grpc::StatusCode::UNAVAILABLE);
  EXPECT_EQ(c.models[0]->values(), want);
}

TEST(SyncConfig, RefusesMissingSecurityAndBadPeers) {
  const std::vector<int> ports{5001, 5002};
  auto err = [&](const std::string& yaml) {
    try {
      parse_config(yaml, "n.yaml");
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  EXPECT_NE(err(test::node_yaml(0, ports)).find("sync.insecure: true"), std::string::npos);
  EXPECT_NE(err(test::node_yaml(0, ports, "  insecure: true\n  encoding: {shared: fp16}\n")).find("sync.encoding.shared"),
            std::string::npos);
  EXPECT_NE(err(test::node_yaml(5, ports, kInsecure)).find("run.node_id 5 is not among sync.peers"), std::string::npos);
  EXPECT_NE(err(test::node_yaml(0, {5001, 5002, 5003}, kInsecure)).find("cannot be split evenly"), std::string::npos);
  EXPECT_NE(err(test::node_yaml(0, {5001, 5001}, kInsecure)).find("used by two peers"), std::string::npos);
  auto ok = parse_config(test::node_yaml(1, ports, kInsecure), "n.yaml");
  EXPECT_EQ(ok.train.owned_experts, (std::vector<int>{2, 3}));
}

}  // namespace
}  // namespace spes
