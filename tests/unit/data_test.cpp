#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <optional>
#include <set>

#include <unistd.h>

#include "spes/config/config.h"
#include "spes/data/corpus.h"
#include "spes/data/loader.h"
#include "spes/data/prepare.h"
#include "spes/data/shard.h"
#include "spes/data/tokenizer.h"
#include "spes/util/error.h"
#include "spes/util/fs.h"
#include "test_paths.h"

namespace spes {
namespace {
namespace fs = std::filesystem;

class TempDir {
 public:
  TempDir() {
    path_ = fs::temp_directory_path() / ("spes-test-" + std::to_string(::getpid()) + "-" + std::to_string(counter_++));
    fs::remove_all(path_);
    fs::create_directories(path_);
  }
  ~TempDir() { fs::remove_all(path_); }
  const fs::path& path() const { return path_; }

 private:
  static inline int counter_ = 0;
  fs::path path_;
};

void write_text(const fs::path& p, const std::string& s) {
  std::ofstream out(p, std::ios::binary);
  out << s;
}

// The message of the Error(Data) that `f` throws.
template <typename F>
std::string data_error(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::Data) << e.what();
    return e.what();
  }
  ADD_FAILURE() << "no error thrown";
  return "";
}

TEST(Corpus, KjvListingBecomesOneDocumentPerChapter) {
  const std::string listing =
      "Ge1:1 In the beginning God created the heaven and the earth.\n"
      "Ge1:2 And the earth was without form, and void. \r\n"
      "\n"
      "Ge2:1 Thus the heavens and the earth were finished.\n"
      "1Sm3:10 And the LORD came, and stood.";
  auto docs = kjv_chapters(listing);
  ASSERT_EQ(docs.size(), 3u);
  EXPECT_EQ(docs[0].name, "Ge1");
  EXPECT_EQ(docs[0].text,
            "In the beginning God created the heaven and the earth.\nAnd the earth was without form, and void.");
  EXPECT_EQ(docs[1].name, "Ge2");
  EXPECT_EQ(docs[2].name, "1Sm3");
  EXPECT_EQ(docs[2].text, "And the LORD came, and stood.");
  std::string msg = data_error([] { kjv_chapters("Ge1:1 fine\nnot a verse line\n"); });
  EXPECT_NE(msg.find("line 2 of the bible listing"), std::string::npos) << msg;
}

TEST(Corpus, KjvIsTheWholeBible) {
  auto docs = read_kjv_corpus();
  ASSERT_EQ(docs.size(), kKjvChapters);
  EXPECT_EQ(docs.front().name, "Ge1");
  EXPECT_EQ(docs.back().name, "Rev22");
  EXPECT_EQ(docs.front().text.rfind("In the beginning God created the heaven and the earth.\n", 0), 0u);
  std::size_t bytes = 0;
  for (const auto& d : docs) bytes += d.text.size();
  EXPECT_GT(bytes, 4000000u);
}

TEST(Corpus, TextFolderReadsTxtAndJsonl) {
  TempDir dir;
  fs::create_directories(dir.path() / "sub");
  write_text(dir.path() / "b.txt", "second document\n");
  write_text(dir.path() / "a.txt", "first document\n");
  write_text(dir.path() / "sub" / "c.jsonl", "{\"text\": \"third\"}\n\n{\"text\": \"fourth\"}\n");
  write_text(dir.path() / "ignored.md", "not text");
  auto docs = read_text_folder(dir.path());
  ASSERT_EQ(docs.size(), 4u);
  EXPECT_EQ(docs[0].name, "a.txt");
  EXPECT_EQ(docs[0].text, "first document\n");
  EXPECT_EQ(docs[2].name, "sub/c.jsonl:1");
  EXPECT_EQ(docs[3].text, "fourth");
}

TEST(Corpus, BadFoldersAreClearErrors) {
  TempDir dir;
  std::string msg = data_error([&] { read_text_folder(dir.path()); });
  EXPECT_NE(msg.find("holds no text"), std::string::npos) << msg;
  msg = data_error([&] { read_text_folder(dir.path() / "missing"); });
  EXPECT_NE(msg.find("does not exist"), std::string::npos) << msg;
  write_text(dir.path() / "x.jsonl", "{\"text\": \"ok\"}\n{\"txt\": 1}\n");
  msg = data_error([&] { read_text_folder(dir.path()); });
  EXPECT_NE(msg.find("x.jsonl:2: expected an object with a string field \"text\""), std::string::npos) << msg;
  write_text(dir.path() / "x.jsonl", "{broken\n");
  msg = data_error([&] { read_text_folder(dir.path()); });
  EXPECT_NE(msg.find("x.jsonl:1: not valid JSON"), std::string::npos) << msg;
}

TEST(Shard, RoundTripAndValidation) {
  TempDir dir;
  const fs::path p = dir.path() / "t.bin";
  std::vector<std::uint32_t> tokens = {1, 5, 9, 2, 0, 99};
  write_token_shard(p, tokens, 100, 2);
  TokenShard shard(p);
  EXPECT_EQ(shard.vocab_size(), 100u);
  EXPECT_EQ(shard.eos_id(), 2u);
  ASSERT_EQ(shard.size(), tokens.size());
  EXPECT_TRUE(std::equal(tokens.begin(), tokens.end(), shard.tokens().begin()));

  std::string msg = data_error([&] { write_token_shard(dir.path() / "bad.bin", {1, 100}, 100, 2); });
  EXPECT_NE(msg.find("token 100 at position 1 is >= vocab size 100"), std::string::npos) << msg;
  EXPECT_FALSE(fs::exists(dir.path() / "bad.bin"));
}

TEST(Shard, CorruptFilesAreRefusedByName) {
  TempDir dir;
  const fs::path good = dir.path() / "good.bin";
  write_token_shard(good, {1, 2, 3, 4}, 10, 2);
  std::string bytes = read_file(good);

  const fs::path truncated = dir.path() / "truncated.bin";
  write_text(truncated, bytes.substr(0, bytes.size() - 3));
  std::string msg = data_error([&] { TokenShard s(truncated); });
  EXPECT_NE(msg.find("truncated.bin' is truncated"), std::string::npos) << msg;

  const fs::path header_only = dir.path() / "short.bin";
  write_text(header_only, bytes.substr(0, 10));
  msg = data_error([&] { TokenShard s(header_only); });
  EXPECT_NE(msg.find("smaller than its 32-byte header"), std::string::npos) << msg;

  const fs::path foreign = dir.path() / "foreign.bin";
  write_text(foreign, std::string(64, 'x'));
  msg = data_error([&] { TokenShard s(foreign); });
  EXPECT_NE(msg.find("foreign.bin' is not a spes token shard"), std::string::npos) << msg;

  std::string bad_token = bytes;
  bad_token[32 + 8] = 50;  // third token = 50 >= vocab 10
  const fs::path corrupt = dir.path() / "corrupt.bin";
  write_text(corrupt, bad_token);
  msg = data_error([&] { TokenShard s(corrupt); });
  EXPECT_NE(msg.find("token id 50 at position 2 is >= vocab size 10"), std::string::npos) << msg;

  std::string future = bytes;
  future[8] = 9;
  write_text(corrupt, future);
  msg = data_error([&] { TokenShard s(corrupt); });
  EXPECT_NE(msg.find("format version 9"), std::string::npos) << msg;

  msg = data_error([&] { TokenShard s(dir.path() / "none.bin"); });
  EXPECT_NE(msg.find("does not exist"), std::string::npos) << msg;
}

class SamplerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::vector<std::uint32_t> tokens(1000);
    for (std::size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<std::uint32_t>(i % 97);
    path_ = dir_.path() / "s.bin";
    write_token_shard(path_, tokens, 97, 0);
    shard_.emplace(path_);
  }
  TempDir dir_;
  fs::path path_;
  std::optional<TokenShard> shard_;
};

TEST_F(SamplerTest, WindowsAreShiftedTargets) {
  WindowSampler s(*shard_, 16, 1, 0);
  EXPECT_EQ(s.windows_per_epoch(), (1000 - 16) / 16);
  TokenBatch b = s.next_batch(3);
  ASSERT_EQ(b.inputs.size(), 48u);
  for (int r = 0; r < 3; ++r)
    for (int i = 0; i < 16; ++i) EXPECT_EQ(b.targets[r * 16 + i], (b.inputs[r * 16 + i] + 1) % 97);
}

TEST_F(SamplerTest, SameSeedSameOrderOtherNodeOtherOrder) {
  WindowSampler a(*shard_, 16, 6198, 0), b(*shard_, 16, 6198, 0), c(*shard_, 16, 6198, 1);
  auto ba = a.next_batch(8), bb = b.next_batch(8), bc = c.next_batch(8);
  EXPECT_EQ(ba.inputs, bb.inputs);
  EXPECT_NE(ba.inputs, bc.inputs);
  EXPECT_EQ(node_data_seed(6198, 3), 9198u);
}

TEST_F(SamplerTest, EpochVisitsEveryWindowOnceAndStateRestores) {
  WindowSampler s(*shard_, 16, 7, 2);
  const auto W = s.windows_per_epoch();
  std::set<std::int64_t> starts;
  for (std::int64_t i = 0; i < W; ++i) starts.insert(s.next_batch(1).inputs[0] * 1000 + s.state().cursor);
  EXPECT_EQ(static_cast<std::int64_t>(starts.size()), W);
  EXPECT_EQ(s.state().epoch, 0u);
  s.next_batch(5);
  EXPECT_EQ(s.state().epoch, 1u);
  LoaderState saved = s.state();
  auto expected = s.next_batch(4);
  WindowSampler fresh(*shard_, 16, 7, 2);
  fresh.restore(saved);
  EXPECT_EQ(fresh.next_batch(4).inputs, expected.inputs);
}

TEST_F(SamplerTest, TooShortShardAndValidationWindows) {
  std::string msg = data_error([&] { WindowSampler s(*shard_, 600, 1, 0); });
  EXPECT_NE(msg.find("too few for one training window"), std::string::npos) << msg;
  EXPECT_EQ(validation_windows(*shard_, 100), 9);
  auto v1 = validation_batch(*shard_, 100, 0, 2), v2 = validation_batch(*shard_, 100, 0, 2);
  EXPECT_EQ(v1.inputs, v2.inputs);
  EXPECT_EQ(v1.inputs[100], 100 % 97);  // second window starts at token 100
  // Window i is the same whichever call reads it: windows 1..3 in one call = the tail of 0..3.
  auto all = validation_batch(*shard_, 100, 0, 4), tail = validation_batch(*shard_, 100, 1, 3);
  EXPECT_EQ(std::vector<std::int64_t>(all.inputs.begin() + 100, all.inputs.end()), tail.inputs);
  EXPECT_EQ(validation_batch(*shard_, 100, 9, 1).inputs, validation_batch(*shard_, 100, 0, 1).inputs);  // wraps
}

TEST(Split, ByNameHashIsStableAndProportional) {
  int val = 0;
  for (int i = 0; i < 10000; ++i) val += is_validation_document("doc" + std::to_string(i), 0.1);
  EXPECT_NEAR(val, 1000, 120);
  EXPECT_EQ(is_validation_document("ca01", 0.02), is_validation_document("ca01", 0.02));
}

TEST(Tokenizer, TrainsEncodesAndDecodes) {
  TempDir dir;
  std::vector<Document> docs;
  for (int i = 0; i < 50; ++i)
    docs.push_back({"d" + std::to_string(i), "the quick brown fox jumps over the lazy dog number " +
                                                 std::to_string(i) + "\nthe end of story " + std::to_string(i)});
  TokenizerTrainOptions opts;
  opts.vocab_size = 100;
  Tokenizer::train(docs, dir.path() / "t.model", opts);
  Tokenizer tok(dir.path() / "t.model");
  EXPECT_EQ(tok.vocab_size(), 100);
  auto ids = tok.encode("the quick brown fox");
  EXPECT_FALSE(ids.empty());
  for (auto id : ids) EXPECT_LT(id, 100u);
  EXPECT_EQ(tok.decode(ids), "the quick brown fox");
  std::string msg = data_error([&] { Tokenizer t(dir.path() / "missing.model"); });
  EXPECT_NE(msg.find("missing.model' does not exist"), std::string::npos) << msg;
  write_text(dir.path() / "junk.model", "garbage");
  msg = data_error([&] { Tokenizer t(dir.path() / "junk.model"); });
  EXPECT_NE(msg.find("cannot load tokenizer model"), std::string::npos) << msg;
}

TEST(Prepare, TinyDataFromTheKingJamesBible) {
  // Made by the prepare_tiny_data fixture from the real corpus.
  Config c = load_config(test::config_path("tiny"), {"data.dir=" + test::tiny_data_dir()});
  DataPaths p = data_paths(c.data);
  TokenShard train(p.train), val(p.val);
  Tokenizer tok(p.tokenizer);
  EXPECT_EQ(tok.vocab_size(), 512);
  EXPECT_EQ(train.vocab_size(), 512u);
  EXPECT_GT(train.size(), 1000000u);  // ~790k words of English
  EXPECT_GT(val.size(), 10000u);
  EXPECT_LT(val.size(), train.size() / 10);
  // Documents end with EOS, and the text decodes to English.
  std::size_t eos = 0;
  for (auto t : train.tokens()) eos += (t == train.eos_id());
  EXPECT_GT(eos, 1000u);  // one a chapter
  std::vector<std::uint32_t> head(train.tokens().begin(), train.tokens().begin() + 40);
  std::string text = tok.decode(head);
  EXPECT_NE(text.find(" the "), std::string::npos) << text;
  EXPECT_EQ(text.find(":1"), std::string::npos) << text;  // verse references are gone
  // A second prepare reuses the data.
  PreparedData again = prepare_data(c);
  EXPECT_TRUE(again.reused);
}

TEST(Prepare, TokenizerInsideTheDataFolderIsReusedInPlace) {
  TempDir dir;
  write_text(dir.path() / "a.txt", "alpha beta gamma delta\n");
  write_text(dir.path() / "b.txt", "epsilon zeta eta theta\n");
  fs::create_directories(dir.path() / "out");
  fs::copy_file(test::tiny_data_dir() + "/tokenizer.model", dir.path() / "out" / "tokenizer.model");
  Config c = load_config(test::config_path("tiny"), {"data.dir=" + (dir.path() / "out").string(),
                                                     "data.tokenizer=" + (dir.path() / "out" / "tokenizer.model").string(),
                                                     "data.corpus=" + dir.path().string()});
  PreparedData d = prepare_data(c);
  EXPECT_FALSE(d.reused);
  EXPECT_GT(d.train_tokens + d.val_tokens, 0);
  EXPECT_EQ(Tokenizer(dir.path() / "out" / "tokenizer.model").vocab_size(), 512);
}

TEST(Prepare, TokenizerLargerThanModelVocabIsRefused) {
  TempDir dir;
  write_text(dir.path() / "a.txt", "alpha beta gamma delta\n");
  write_text(dir.path() / "b.txt", "epsilon zeta eta theta\n");
  Config c = load_config(test::config_path("tiny"),
                         {"data.dir=" + (dir.path() / "out").string(),
                          "data.tokenizer=" + test::tiny_data_dir() + "/tokenizer.model",
                          "data.corpus=" + dir.path().string(), "model.vocab_size=300"});
  std::string msg = data_error([&] { prepare_data(c); });
  EXPECT_NE(msg.find("has 512 pieces but model.vocab_size is 300"), std::string::npos) << msg;
}

}  // namespace
}  // namespace spes
