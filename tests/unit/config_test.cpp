#include <gtest/gtest.h>

#include <tuple>

#include "spes/config/config.h"
#include "spes/util/error.h"
#include "test_paths.h"

namespace spes {
namespace {

const char* kMinimal = R"(model:
  vocab_size: 512
  d_model: 64
  n_layers: 2
  n_heads: 4
  d_ff: 128
  n_experts: 8
  top_k: 2
)";

// The message of the Error(Config) that parsing `yaml` throws ("" if none is thrown).
std::string config_error(const std::string& yaml, const std::vector<std::string>& overrides = {}) {
  try {
    parse_config(yaml, "test.yaml", overrides);
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::Config);
    return e.what();
  }
  return "";
}

TEST(Config, TinyParsesWithItsValues) {
  Config c = load_config(test::config_path("tiny"));
  EXPECT_EQ(c.model.d_model, 64);
  EXPECT_EQ(c.model.n_experts, 8);
  EXPECT_EQ(c.model.kv_heads(), 4);
  EXPECT_EQ(c.model.qk_norm, QkNorm::Full);
  EXPECT_DOUBLE_EQ(c.optim.lr, 3e-3);
  EXPECT_TRUE(c.owns_all_experts());
  EXPECT_EQ(c.owned_expert_list().size(), 8u);
  EXPECT_EQ(c.key_lines.at("model.d_model"), 10);
}

TEST(Config, DefaultsFollowSpes) {
  Config c = parse_config(kMinimal, "m.yaml");
  EXPECT_DOUBLE_EQ(c.optim.beta1, 0.9);
  EXPECT_DOUBLE_EQ(c.optim.beta2, 0.95);
  EXPECT_DOUBLE_EQ(c.optim.eps, 1e-8);
  EXPECT_DOUBLE_EQ(c.optim.weight_decay, 0.1);
  EXPECT_DOUBLE_EQ(c.optim.grad_clip, 1.0);
  EXPECT_DOUBLE_EQ(c.loss.z_loss, 1e-5);
  EXPECT_DOUBLE_EQ(c.loss.load_balance, 0.01);
  EXPECT_DOUBLE_EQ(c.loss.router_z_loss, 0.001);
  EXPECT_DOUBLE_EQ(c.model.rms_eps, 1e-6);
  EXPECT_DOUBLE_EQ(c.schedule.warmup_start_ratio, 0.1);
  EXPECT_DOUBLE_EQ(c.schedule.min_lr_ratio, 0.1);
  EXPECT_EQ(c.run.seed, 6198u);
}

TEST(Config, OverlapLandsBeforeTheNextRound) {
  const std::vector<std::string> sync = {"sync.every=20", "sync.token=t", "sync.insecure=true",
                                         "sync.peers=[{id: 0, address: '127.0.0.1:1'}, {id: 1, address: '127.0.0.1:2'}]"};
  EXPECT_EQ(parse_config(kMinimal, "m.yaml", sync).sync.delay(), 0);  // blocking by default
  auto overlap = sync;
  overlap.push_back("sync.overlap=true");
  EXPECT_EQ(parse_config(kMinimal, "m.yaml", overlap).sync.delay(), 5);  // every / 4
  overlap.push_back("sync.max_delay=19");
  EXPECT_EQ(parse_config(kMinimal, "m.yaml", overlap).sync.delay(), 19);
  overlap.back() = "sync.max_delay=20";
  const std::string msg = config_error(kMinimal, overlap);
  EXPECT_NE(msg.find("sync.max_delay"), std::string::npos) << msg;
  EXPECT_NE(msg.find("less than sync.every (20)"), std::string::npos) << msg;
  overlap.back() = "sync.max_delay=-2";
  EXPECT_NE(config_error(kMinimal, overlap).find("must be >= 0"), std::string::npos);
  overlap.back() = "sync.late=later";
  EXPECT_NE(config_error(kMinimal, overlap).find("must be wait or skip, not 'later'"), std::string::npos);
  overlap.back() = "sync.late=skip";
  EXPECT_EQ(parse_config(kMinimal, "m.yaml", overlap).sync.late, "skip");
  // Fragments: a round every every / fragments steps; tau defaults to a quarter of that and must
  // stay below it.
  overlap.back() = "sync.fragments=4";
  const Config split = parse_config(kMinimal, "m.yaml", overlap);
  EXPECT_EQ(split.sync.period(), 5);
  EXPECT_EQ(split.sync.delay(), 1);
  overlap.push_back("sync.max_delay=5");
  const std::string too_late = config_error(kMinimal, overlap);
  EXPECT_NE(too_late.find("less than sync.every / sync.fragments (5)"), std::string::npos) << too_late;
  overlap.back() = "sync.fragments=3";
  const std::string uneven = config_error(kMinimal, overlap);
  EXPECT_NE(uneven.find("sync.fragments"), std::string::npos) << uneven;
  EXPECT_NE(uneven.find("must divide sync.every (20)"), std::string::npos) << uneven;
  overlap.back() = "sync.fragments=0";
  EXPECT_NE(config_error(kMinimal, overlap).find("must be >= 1"), std::string::npos);
}

TEST(Config, RoundDeadlineSettingsAreChecked) {
  const std::vector<std::string> sync = {"sync.every=20", "sync.token=t", "sync.insecure=true",
                                         "sync.peers=[{id: 0, address: '127.0.0.1:1'}, {id: 1, address: '127.0.0.1:2'}]"};
  const Config c = parse_config(kMinimal, "m.yaml", sync);
  EXPECT_EQ(c.sync.deadline_factor, 4);
  EXPECT_EQ(c.sync.min_round_timeout_s, 120);
  auto with = [&](const std::string& kv) {
    auto v = sync;
    v.push_back(kv);
    return config_error(kMinimal, v);
  };
  EXPECT_EQ(parse_config(kMinimal, "m.yaml", [&] { auto v = sync; v.push_back("sync.deadline_factor=0"); return v; }())
                .sync.deadline_factor, 0);  // 0: the fixed round_timeout_s
  const std::string weak = with("sync.deadline_factor=0.5");
  EXPECT_NE(weak.find("sync.deadline_factor"), std::string::npos) << weak;
  EXPECT_NE(weak.find("must be 0"), std::string::npos) << weak;
  const std::string floor = with("sync.min_round_timeout_s=0");
  EXPECT_NE(floor.find("sync.min_round_timeout_s"), std::string::npos) << floor;
  EXPECT_NE(floor.find("must be positive"), std::string::npos) << floor;
}

TEST(Config, SparseSettingsAreChecked) {
  const std::vector<std::string> sync = {"sync.every=20", "sync.token=t", "sync.insecure=true",
                                         "sync.peers=[{id: 0, address: '127.0.0.1:1'}, {id: 1, address: '127.0.0.1:2'}]",
                                         "sync.encoding.shared=sparse", "sync.encoding.experts=sparse"};
  const Config c = parse_config(kMinimal, "m.yaml", sync);
  EXPECT_EQ(c.sync.shared_encoding, WireEncoding::Sparse);
  EXPECT_EQ(c.sync.sparse.chunk, 4096);
  EXPECT_EQ(c.sync.sparse.k(), 82);  // round(0.02 x 4096)
  EXPECT_EQ(c.sync.sparse.bits, 2);
  EXPECT_TRUE(c.sync.sparse.local_experts);
  EXPECT_EQ(c.sync.sparse.dense_below, 4096);
  EXPECT_EQ(c.sync.encode_threads, 0);  // one per core
  EXPECT_EQ(c.sync.zstd_level(), 1);     // sync.compression zstd at level 1
  EXPECT_EQ(c.sync.sparse.shared_k(), 4096);  // shared contributions whole by default
  EXPECT_DOUBLE_EQ(c.sync.sparse.shared_kept(4), 1.0);  // "whole"
  EXPECT_DOUBLE_EQ(parse_config(kMinimal, "m.yaml", [&] {
                     auto v = sync;
                     v.push_back("sync.sparse.local_shared=mean");
                     return v;
                   }()).sync.sparse.shared_kept(4),
                   0.25);  // as the average weighs it
  EXPECT_EQ(c.sync.sparse.average_k(4), 4096);  // averages follow the contributions
  const Config topk = parse_config(kMinimal, "m.yaml", [&] {
    auto v = sync;
    v.push_back("sync.sparse.shared_density=0");
    return v;
  }());
  EXPECT_EQ(topk.sync.sparse.shared_k(), 82);  // 0: the experts' density
  EXPECT_EQ(topk.sync.sparse.average_k(4), 328);   // round(4 x 0.02 x 4096)
  EXPECT_EQ(topk.sync.sparse.average_k(64), 4096);  // at most the whole chunk
  EXPECT_EQ(parse_config(kMinimal, "m.yaml", [&] {
              auto v = sync;
              v.push_back("sync.sparse.average_density=0.01");
              return v;
            }()).sync.sparse.average_k(4),
            41);
  EXPECT_EQ(topk.sync.sparse.bits_of_averages(), 2);  // average_bits 0: the contributions' bits
  EXPECT_EQ(parse_config(kMinimal, "m.yaml", [&] {
              auto v = sync;
              v.push_back("sync.sparse.average_bits=4");
              return v;
            }()).sync.sparse.bits_of_averages(),
            4);
  EXPECT_EQ(parse_config(kMinimal, "m.yaml", [&] {  // fragments carry sparse payloads too
              auto v = sync;
              v.push_back("sync.fragments=2");
              return v;
            }()).sync.fragments,
            2);
  auto with = [&](const std::string& kv) {
    auto v = sync;
    v.push_back(kv);
    return config_error(kMinimal, v);
  };
  for (const auto& [kv, key, why] : std::vector<std::tuple<std::string, std::string, std::string>>{
           {"sync.sparse.bits=3", "sync.sparse.bits", "2, 4 or 8"},
           {"sync.sparse.average_bits=1", "sync.sparse.average_bits", "0 (= bits), 2, 4 or 8"},
           {"sync.sparse.density=0", "sync.sparse.density", "(0, 1]"},
           {"sync.sparse.density=1.5", "sync.sparse.density", "(0, 1]"},
           {"sync.sparse.decay=0", "sync.sparse.decay", "(0, 1]"},
           {"sync.sparse.average_density=-0.1", "sync.sparse.average_density", "[0, 1]"},
           {"sync.sparse.shared_density=1.5", "sync.sparse.shared_density", "[0, 1]"},
           {"sync.sparse.dense_below=-1", "sync.sparse.dense_below", "go as int8 deltas"},
           {"sync.encode_threads=-1", "sync.encode_threads", "0 (one per core) and 1024"},
           {"sync.compression=gzip", "sync.compression", "zstd or none, not 'gzip'"},
           {"sync.compression_level=0", "sync.compression_level", "between 1 and 19"},
           {"sync.sparse.local_shared=half", "sync.sparse.local_shared", "mean, whole or off, got 'half'"},
           {"sync.sparse.chunk=32", "sync.sparse.chunk", "between 64 and 65536"},
           {"sync.sparse.chunk=100000", "sync.sparse.chunk", "between 64 and 65536"},
           {"sync.encoding.shared=sparse4", "sync.encoding.shared", "or sparse"}}) {
    const std::string msg = with(kv);
    EXPECT_NE(msg.find(key), std::string::npos) << kv << ": " << msg;
    EXPECT_NE(msg.find(why), std::string::npos) << kv << ": " << msg;
  }
}

TEST(Config, ComplexKeysAreRefusedWithTheLine) {
  // Found by fuzz_config: a mapping used as a key made yaml-cpp throw past the config loader.
  const std::string msg = config_error(std::string(kMinimal) + "? {a: 1}\n: 2\n");
  EXPECT_NE(msg.find("test.yaml:9: a key must be a plain name"), std::string::npos) << msg;
  EXPECT_NE(config_error("model:\n  ? [1, 2]\n  : 3\n").find("(in 'model')"), std::string::npos);
}

TEST(Config, PaperShapesParse) {
  for (const char* name : {"tiny", "small", "1b", "7b", "9b-upcycle"}) {
    SCOPED_TRACE(name);
    EXPECT_NO_THROW(load_config(test::config_path(name)));
  }
  Config c = load_config(test::config_path("9b-upcycle"));
  EXPECT_EQ(c.model.kv_heads(), 8);
  EXPECT_EQ(c.model.qk_norm, QkNorm::PerHead);
  EXPECT_TRUE(c.model.norm_topk_prob);
}

TEST(Config, UnknownKeyNamesFileLineAndKey) {
  std::string msg = config_error(std::string(kMinimal) + "  n_head: 4\n");
  EXPECT_NE(msg.find("test.yaml:9"), std::string::npos) << msg;
  EXPECT_NE(msg.find("unknown key 'model.n_head'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("n_heads"), std::string::npos) << msg;  // the known keys are listed
  msg = config_error(std::string(kMinimal) + "trainer:\n  steps: 3\n");
  EXPECT_NE(msg.find("unknown key 'trainer'"), std::string::npos) << msg;
}

TEST(Config, RetiredEvalBatchesPointsToEvalWindows) {
  std::string msg = config_error(std::string(kMinimal) + "train:\n  eval_batches: 4\n");
  EXPECT_NE(msg.find("train.eval_batches"), std::string::npos) << msg;
  EXPECT_NE(msg.find("replaced by train.eval_windows"), std::string::npos) << msg;
  EXPECT_EQ(load_config(test::config_path("small")).train.eval_windows, 64);
}

TEST(Config, NpmBrownCorpusIsRefusedWithTheWayOut) {
  std::string msg = config_error(std::string(kMinimal) + "data:\n  corpus: brown\n");
  EXPECT_NE(msg.find("data.corpus"), std::string::npos) << msg;
  EXPECT_NE(msg.find("use 'kjv'"), std::string::npos) << msg;
  msg = config_error(std::string(kMinimal) + "data:\n  cache_dir: data/cache\n");
  EXPECT_NE(msg.find("data.cache_dir"), std::string::npos) << msg;
  EXPECT_EQ(load_config(test::config_path("tiny")).data.corpus, "kjv");
}

TEST(Config, WrongTypeNamesLineAndKey) {
  std::string msg = config_error(std::string(kMinimal) + "train:\n  steps: many\n");
  EXPECT_NE(msg.find("test.yaml:10 (train.steps)"), std::string::npos) << msg;
  EXPECT_NE(msg.find("expected an integer, got 'many'"), std::string::npos) << msg;
  msg = config_error(std::string(kMinimal) + "optim:\n  lr: [1, 2]\n");
  EXPECT_NE(msg.find("(optim.lr): expected a number"), std::string::npos) << msg;
  msg = config_error(std::string(kMinimal) + "  norm_topk_prob: maybe\n");
  EXPECT_NE(msg.find("expected true or false"), std::string::npos) << msg;
}

TEST(Config, ImpossibleShapesAreRefused) {
  std::string base = kMinimal;
  auto replace = [&](const std::string& from, const std::string& to) {
    std::string s = base;
    s.replace(s.find(from), from.size(), to);
    return s;
  };
  std::string msg = config_error(replace("n_heads: 4", "n_heads: 5"));
  EXPECT_NE(msg.find("test.yaml:5 (model.n_heads): n_heads (5) must divide d_model (64)"), std::string::npos) << msg;
  msg = config_error(replace("top_k: 2", "top_k: 9"));
  EXPECT_NE(msg.find("(model.top_k): top_k (9) must be between 1 and n_experts (8)"), std::string::npos) << msg;
  msg = config_error(replace("  d_ff: 128\n", ""));
  EXPECT_NE(msg.find("(model.d_ff): is required"), std::string::npos) << msg;
  msg = config_error(std::string(kMinimal) + "  n_kv_heads: 3\n");
  EXPECT_NE(msg.find("n_kv_heads (3) must divide n_heads (4)"), std::string::npos) << msg;
  msg = config_error(std::string(kMinimal) + "  qk_norm: sometimes\n");
  EXPECT_NE(msg.find("must be none, full or per_head"), std::string::npos) << msg;
  msg = config_error(std::string(kMinimal) + "data:\n  seq_len: 4096\n");
  EXPECT_NE(msg.find("exceeds model.max_seq_len"), std::string::npos) << msg;
}

TEST(Config, OwnedExperts) {
  Config c = parse_config(std::string(kMinimal) + "train:\n  owned_experts: [6, \"0-2\"]\n", "t.yaml");
  EXPECT_EQ(c.owned_expert_list(), (std::vector<int>{0, 1, 2, 6}));
  EXPECT_FALSE(c.owns_all_experts());
  std::string msg = config_error(std::string(kMinimal) + "train:\n  owned_experts: [1, 8]\n");
  EXPECT_NE(msg.find("test.yaml:10 (train.owned_experts): expert 8 is out of range: the model has experts 0..7"),
            std::string::npos) << msg;
  msg = config_error(std::string(kMinimal) + "train:\n  owned_experts: [1, 1]\n");
  EXPECT_NE(msg.find("listed twice"), std::string::npos) << msg;
  msg = config_error(std::string(kMinimal) + "train:\n  owned_experts: some\n");
  EXPECT_NE(msg.find("expected 'all' or a list"), std::string::npos) << msg;
}

TEST(Config, OverridesApplyAndAreNamedInErrors) {
  Config c = parse_config(kMinimal, "m.yaml", {"train.steps=7", "optim.lr=1e-2", "run.name=x"});
  EXPECT_EQ(c.train.steps, 7);
  EXPECT_DOUBLE_EQ(c.optim.lr, 1e-2);
  EXPECT_EQ(c.run.name, "x");
  std::string msg = config_error(kMinimal, {"train.stepz=7"});
  EXPECT_NE(msg.find("--set train.stepz"), std::string::npos) << msg;
  msg = config_error(kMinimal, {"train.steps=-1"});
  EXPECT_NE(msg.find("(--set train.steps): must be positive"), std::string::npos) << msg;
  msg = config_error(kMinimal, {"nonsense"});
  EXPECT_NE(msg.find("expected section.key=value"), std::string::npos) << msg;
}

TEST(Config, MissingFileAndBadYaml) {
  try {
    load_config("/nonexistent/x.yaml");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::Config);
    EXPECT_NE(std::string(e.what()).find("'/nonexistent/x.yaml' does not exist"), std::string::npos);
  }
  std::string msg = config_error("model: [unclosed\n");
  EXPECT_NE(msg.find("not valid YAML"), std::string::npos) << msg;
  msg = config_error("run:\n  name: a\n");
  EXPECT_NE(msg.find("'model' section is required"), std::string::npos) << msg;
}

}  // namespace
}  // namespace spes
