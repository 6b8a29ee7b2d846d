// Checkpoint shards on the tiny config: exact resume, corrupt and partial shards, config refusal.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "spes/ckpt/merge.h"
#include "spes/train/checkpoint.h"
#include "spes/train/trainer.h"
#include "spes/util/error.h"
#include "torch_helpers.h"

namespace spes {
namespace {
namespace fs = std::filesystem;

struct ScratchDir : test::ScratchDir {
  ScratchDir() : test::ScratchDir("ckpt-test") {}
};

Config config_in(const ScratchDir& d, std::vector<std::string> extra = {}) {
  extra.push_back("train.steps=24");
  extra.push_back("checkpoint.dir=" + d.path.string());
  extra.push_back("checkpoint.keep=2");
  return test::tiny_config(extra);
}

std::vector<torch::Tensor> weights(Trainer& t) {
  std::vector<torch::Tensor> out;
  for (const auto& p : t.model()->parameters()) out.push_back(p.detach().clone());
  return out;
}

// 20 steps, shard, 4 more in a new trainer: the same losses and bits as 24 uninterrupted steps
// (past the warm-up, with experts that got no tokens in a step).
TEST(Checkpoint, ResumeIsExact) {
  ScratchDir dir;
  const Config c = config_in(dir, {"train.owned_experts=[0, 2]"});  // frozen experts too
  Trainer whole(c, test::quiet());
  std::vector<double> want;
  for (int i = 0; i < 24; ++i) want.push_back(whole.step().loss);

  {
    Trainer first(c, test::quiet());
    for (int i = 0; i < 20; ++i) EXPECT_EQ(first.step().loss, want[i]);
    write_shard(first, 7);
  }
  Config resumed_config = c;
  resumed_config.checkpoint.resume = "auto";
  Trainer second(resumed_config, test::quiet());
  auto info = resume_from_config(second);
  ASSERT_TRUE(info);
  EXPECT_EQ(info->step, 20);
  EXPECT_EQ(info->sync_round, 7u);
  EXPECT_EQ(second.step_count(), 20);
  for (int i = 20; i < 24; ++i) EXPECT_EQ(second.step().loss, want[i]) << "step " << i + 1;
  auto a = weights(whole), b = weights(second);
  ASSERT_EQ(a.size(), b.size());
  for (std::size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(torch::equal(a[i], b[i])) << "tensor " << i;
}

// A corrupt newest shard is reported and the previous one used; a folder without a manifest
// (a crash mid-write) is never taken; only the newest `keep` shards stay.
TEST(Checkpoint, CorruptOrPartialShardFallsBackToThePreviousOne) {
  ScratchDir dir;
  const Config c = config_in(dir);
  Trainer t(c, test::quiet());
  for (int s = 1; s <= 3; ++s) {
    t.step();
    write_shard(t, 0);
  }
  EXPECT_EQ(list_shards(dir.path.string()), (std::vector<std::string>{"step-00000002", "step-00000003"}));
  {  // flip one byte near the end of the newest shard's weights
    std::fstream f(dir.path / "step-00000003" / "model.safetensors", std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(-5, std::ios::end);
    char byte = 0;
    f.read(&byte, 1);
    f.seekp(-5, std::ios::end);
    byte ^= 0x5a;
    f.write(&byte, 1);
  }
  try {
    read_shard((dir.path / "step-00000003").string());
    ADD_FAILURE() << "corrupt shard read";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::Checkpoint);
    EXPECT_NE(std::string(e.what()).find("fails its checksum"), std::string::npos) << e.what();
  }
  fs::create_directories(dir.path / "step-00000009");  // partial: no manifest
  auto shard = newest_shard(dir.path.string());
  ASSERT_TRUE(shard);
  EXPECT_EQ(shard->info.step, 2);
  fs::remove(dir.path / "step-00000002" / "optimizer.safetensors");
  EXPECT_FALSE(newest_shard(dir.path.string()));
}

// A shard of another configuration is refused with the differences, unless asked for.
TEST(Checkpoint, OtherConfigIsRefusedUnlessAllowed) {
  ScratchDir dir;
  {
    Trainer t(config_in(dir), test::quiet());
    t.step();
    write_shard(t, 0);
  }
  Config other = config_in(dir, {"optim.lr=0.123", "train.owned_experts=[1]"});
  other.checkpoint.resume = "auto";
  Trainer t(other, test::quiet());
  try {
    resume_from_config(t);
    ADD_FAILURE() << "resumed from another config";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_EQ(e.kind(), ErrorKind::Checkpoint);
    EXPECT_NE(msg.find("optim.lr: shard"), std::string::npos) << msg;
    EXPECT_NE(msg.find("owned experts: shard"), std::string::npos) << msg;
  }
  EXPECT_EQ(t.step_count(), 0);
  other.checkpoint.allow_mismatch = true;
  Trainer allowed(other, test::quiet());
  ASSERT_TRUE(resume_from_config(allowed));
  EXPECT_EQ(allowed.step_count(), 1);
}

const torch::optim::AdamWParamState* state_of(Trainer& t, const std::string& name) {
  for (const auto& item : t.model()->named_parameters())
    if (item.key() == name) {
      auto& states = t.optimizer().state();
      auto it = states.find(item.value().unsafeGetTensorImpl());
      return it == states.end() ? nullptr : static_cast<const torch::optim::AdamWParamState*>(it->second.get());
    }
  return nullptr;
}

std::vector<float> values_of(const torch::Tensor& t) {
  auto c = t.contiguous();
  return std::vector<float>(c.data_ptr<float>(), c.data_ptr<float>() + c.numel());
}

// Two nodes' shards (experts 0-3 and 4-7) merge into one model; four nodes then resume from it
// under a new assignment: every weight from the merge, moments only where the node trained the
// expert before, data positions only for node ids the old run had.
TEST(Checkpoint, MergeThenReshardToAnotherNodeCount) {
  ScratchDir dir;
  auto node_config = [&](int node, const std::string& owned, const std::string& ckpt_dir) {
    return test::tiny_config({"run.node_id=" + std::to_string(node), "train.owned_experts=" + owned,
                              "checkpoint.dir=" + (dir.path / ckpt_dir).string(), "train.steps=24"});
  };
  std::vector<Shard> shards;
  for (int node = 0; node < 2; ++node) {
    Trainer t(node_config(node, node == 0 ? "[0, 1, 2, 3]" : "[4, 5, 6, 7]", "old" + std::to_string(node)), test::quiet());
    for (int i = 0; i < 3; ++i) t.step();
    shards.push_back(read_shard(write_shard(t, 0)));
  }
  const Shard merged = merge_shards(shards);
  const std::string merged_path = (dir.path / "merged").string();
  write_shard_folder(merged_path, merged);

  const std::string expert1 = "layers.0.mlp.experts.1.gate_proj.weight", expert2 = "layers.0.mlp.experts.2.gate_proj.weight";
  const std::string shared = "layers.1.self_attn.v_proj.weight";
  for (int node = 0; node < 4; ++node) {
    Config c = node_config(node, fmt::format("[{}, {}]", 2 * node, 2 * node + 1), "new" + std::to_string(node));
    c.checkpoint.resume = merged_path;
    Trainer t(c, test::quiet());
    ASSERT_TRUE(resume_from_config(t));
    EXPECT_EQ(t.step_count(), 3);
    for (const auto& item : t.model()->named_parameters())
      ASSERT_EQ(values_of(item.value()), merged.model.at(item.key()).values) << item.key();
    const auto* shared_state = state_of(t, shared);
    ASSERT_TRUE(shared_state);
    EXPECT_EQ(values_of(shared_state->exp_avg()), merged.optimizer.at(shared + ".exp_avg").values);
    if (node == 0) {  // expert 1 was node 0's before: its moments carry over
      ASSERT_TRUE(state_of(t, expert1));
      EXPECT_EQ(values_of(state_of(t, expert1)->exp_avg()), shards[0].optimizer.at(expert1 + ".exp_avg").values);
    }
    if (node == 1) {  // expert 2 was node 0's: node 1 starts it with zero moments
      EXPECT_EQ(state_of(t, expert2), nullptr);
      EXPECT_EQ(t.sampler().state(), shards[1].info.loader);
    }
    if (node >= 2) {  // a node id the old run did not have
      EXPECT_EQ(t.sampler().state(), LoaderState{});
    }
    EXPECT_TRUE(std::isfinite(t.step().loss));
  }
}

}  // namespace
}  // namespace spes
