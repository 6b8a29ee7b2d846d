// Data parallelism inside a node through c10d (Gloo on the CPU): the collectives give exact
// values (a guard against a Gloo header/library mismatch: Debian's libgloo-dev headers, torch's
// Gloo inside libtorch_cpu), and K ranks × batch b train like one rank × batch K·b.
// Ranks are threads of this process here; tests/integration/node_ranks.sh runs real processes.
#include <gtest/gtest.h>

#include <functional>
#include <map>
#include <thread>

#include "spes/dist/node_group.h"
#include "spes/model/transformer.h"
#include "spes/util/error.h"
#include "torch_helpers.h"

namespace spes {
namespace {

// Runs body(rank) on `ranks` threads, each with its own NodeGroup on one rendezvous store.
void run_ranks(int ranks, const std::function<void(NodeGroup&)>& body) {
  RendezvousServer store(60);
  std::vector<std::thread> threads;
  std::vector<std::exception_ptr> errors(static_cast<std::size_t>(ranks));
  for (int r = 0; r < ranks; ++r)
    threads.emplace_back([&, r] {
      try {
        NodeGroup group(RankContext{r, ranks, "127.0.0.1", store.port()}, "gloo", c10::Device(c10::kCPU), 60);
        body(group);
      } catch (...) {
        errors[static_cast<std::size_t>(r)] = std::current_exception();
      }
    });
  for (auto& t : threads) t.join();
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
}

std::map<std::string, torch::Tensor> weights(Trainer& t) {
  std::map<std::string, torch::Tensor> out;
  for (const auto& p : t.model()->named_parameters()) out[p.key()] = p.value().detach().clone();
  return out;
}

TEST(NodeGroup, GlooCollectivesGiveExactValues) {
  constexpr int kRanks = 3;
  std::vector<std::vector<float>> reduced(kRanks);
  std::vector<torch::Tensor> received(kRanks);
  std::vector<std::int64_t> maxima(kRanks);
  run_ranks(kRanks, [&](NodeGroup& g) {
    const int r = g.rank();
    auto t = torch::arange(5, torch::kFloat32) + 10.0 * r;  // rank r: 10r, 10r+1, ...
    g.all_reduce_sum(t);
    reduced[r].assign(t.data_ptr<float>(), t.data_ptr<float>() + 5);
    // Mixed dtypes and shapes, with buckets smaller than one tensor.
    std::vector<torch::Tensor> list{torch::full({3, 4}, static_cast<float>(r)),
                                    torch::full({7}, static_cast<double>(r) + 0.5).to(torch::kBFloat16),
                                    torch::arange(6, torch::kInt64).view({2, 3}) * (r + 1)};
    g.broadcast(list, /*root=*/1, /*bucket_bytes=*/16);
    received[r] = torch::cat({list[0].flatten().to(torch::kFloat64), list[1].to(torch::kFloat64),
                              list[2].flatten().to(torch::kFloat64)});
    maxima[r] = g.max(r == 2 ? 7 : r);
    g.barrier();
  });
  const auto expected_bcast = torch::cat({torch::full({12}, 1.0, torch::kFloat64), torch::full({7}, 1.5, torch::kFloat64),
                                          torch::arange(6, torch::kFloat64) * 2});
  for (int r = 0; r < kRanks; ++r) {
    for (int i = 0; i < 5; ++i) EXPECT_EQ(reduced[r][i], 3 * i + 30.0f) << "rank " << r;  // i + (i+10) + (i+20)
    EXPECT_TRUE(torch::equal(received[r], expected_bcast)) << "rank " << r << ": " << received[r];
    EXPECT_EQ(maxima[r], 7);
  }
}

TEST(NodeGroup, NcclWithoutAGpuIsAConfigError) {
  Config c = test::tiny_config({"node.backend=nccl"});
  try {
    resolve_backend(c, c10::Device(c10::kCPU));
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::Config);
    EXPECT_NE(std::string(e.what()).find("node.backend"), std::string::npos) << e.what();
  }
  EXPECT_EQ(resolve_backend(test::tiny_config(), c10::Device(c10::kCPU)), "gloo");
}

// Two ranks of batch 4 against one process: the same windows (the node's micro-batch is split
// by rows). The first step's gradients agree to fp32 rounding; over 20 AdamW steps so do the
// losses (weights are compared by loss: AdamW's g/sqrt(v) turns rounding in near-zero gradients
// into full-size updates, so weight differences say little).
TEST(DataParallel, TwoRanksTrainLikeOneRankWithTheWholeBatch) {
  constexpr int kSteps = 20;
  const std::vector<std::string> common{"train.owned_experts=[1, 2, 6]", "train.steps=20", "optim.lr=3e-3"};
  auto with = [&](std::vector<std::string> extra) {
    extra.insert(extra.end(), common.begin(), common.end());
    return test::tiny_config(extra);
  };
  auto grads = [](Trainer& t) {
    std::map<std::string, torch::Tensor> out;
    for (const auto& p : t.model()->named_parameters())
      if (p.value().grad().defined()) out[p.key()] = p.value().grad().clone();
    return out;
  };
  torch::set_num_threads(1);
  // The references: one rank with two micro-batches of 4 (the load-balance loss, like every batch
  // statistic, taken per 4 windows as on each rank), and one rank with the whole batch of 8.
  Trainer accum(with({"train.batch_size=4", "train.grad_accum=2"}), test::quiet());
  Trainer whole(with({"train.batch_size=8"}), test::quiet());
  Trainer untrained(with({}), test::quiet());
  std::vector<double> accum_loss, whole_loss;
  std::map<std::string, torch::Tensor> accum_grads, whole_grads;
  for (int i = 0; i < kSteps; ++i) {
    accum_loss.push_back(accum.step().loss);
    whole_loss.push_back(whole.step().loss);
    if (i == 0) accum_grads = grads(accum), whole_grads = grads(whole);
  }

  std::vector<std::map<std::string, torch::Tensor>> ranks_weights(2), ranks_grads(2);
  std::vector<std::vector<double>> ranks_loss(2);
  std::vector<std::int64_t> ranks_tokens(2);
  std::vector<GradientSync::StepReport> reports(2);
  run_ranks(2, [&](NodeGroup& g) {
    auto sync = g.make_gradient_sync(/*bucket_mb=*/0.05);  // several buckets on tiny
    TrainerOptions o = test::quiet();
    o.grad_sync = sync.get();
    Trainer t(with({"train.batch_size=4", "node.ranks=2"}), o);
    for (int i = 0; i < kSteps; ++i) {
      StepStats s = t.step();
      ranks_loss[g.rank()].push_back(s.loss);
      ranks_tokens[g.rank()] = s.tokens;
      if (i == 0) ranks_grads[g.rank()] = grads(t);
    }
    reports[g.rank()] = sync->last_step();
    ranks_weights[g.rank()] = weights(t);
  });

  EXPECT_EQ(ranks_tokens[0], 8 * accum.config().data.seq_len);  // the node's tokens, both ranks
  // The buckets overlap backward: most start from the gradient hooks, not after backward.
  EXPECT_GE(reports[0].buckets, 4);
  EXPECT_GE(reports[0].started_in_backward, reports[0].buckets / 2);
  ASSERT_EQ(ranks_grads[0].size(), accum_grads.size());         // the trainable set, nothing frozen
  double whole_diff = 0, whole_norm = 0;
  for (const auto& [name, g] : accum_grads) {
    const double scale = g.abs().max().item<double>() + 1e-12;
    EXPECT_LT(test::max_abs_diff(ranks_grads[0].at(name), g) / scale, 1e-4) << name << " vs grad_accum 2";
    EXPECT_LT(test::max_abs_diff(ranks_grads[1].at(name), g) / scale, 1e-4) << name << " vs grad_accum 2";
    whole_diff += (ranks_grads[0].at(name) - whole_grads.at(name)).pow(2).sum().item<double>();
    whole_norm += whole_grads.at(name).pow(2).sum().item<double>();
  }
  // Against one batch of 8 the load-balance term differs (a product of batch means, over 4
  // windows per rank instead of 8): mostly in the router and what feeds it, small overall.
  EXPECT_LT(std::sqrt(whole_diff / whole_norm), 0.02);
  const auto start = weights(untrained);
  int frozen = 0;
  for (const auto& [name, w0] : ranks_weights[0]) {
    // Every rank applies the same averaged gradient: the ranks stay bit-identical.
    EXPECT_TRUE(torch::equal(w0, ranks_weights[1].at(name))) << name << " differs between the ranks";
    const bool is_frozen = MoeTransformerImpl::is_expert_parameter(name) &&
                           name.find("experts.1.") == std::string::npos && name.find("experts.2.") == std::string::npos &&
                           name.find("experts.6.") == std::string::npos;
    if (is_frozen) ++frozen;
    EXPECT_EQ(torch::equal(w0, start.at(name)), is_frozen) << name << (is_frozen ? ": a frozen expert changed" : " did not train");
  }
  EXPECT_GT(frozen, 0);
  double worst_accum = 0, worst_whole = 0;
  for (int i = 0; i < kSteps; ++i) {
    EXPECT_EQ(ranks_loss[0][i], ranks_loss[1][i]) << "step " << i + 1;  // one loss for the node
    worst_accum = std::max(worst_accum, std::abs(ranks_loss[0][i] - accum_loss[i]) / accum_loss[i]);
    worst_whole = std::max(worst_whole, std::abs(ranks_loss[0][i] - whole_loss[i]) / whole_loss[i]);
  }
  EXPECT_LT(worst_accum, 1e-4);
  EXPECT_LT(worst_whole, 2e-3);
  std::printf("2 ranks x 4 vs 1 rank: step-1 gradient vs batch 8 %.2e (relative norm); worst relative loss difference "
              "over %d steps %.2e (grad_accum 2), %.2e (batch 8); %d of %d buckets started during backward\n",
              std::sqrt(whole_diff / whole_norm), kSteps, worst_accum, worst_whole, reports[0].started_in_backward,
              reports[0].buckets);
}

}  // namespace
}  // namespace spes
