#include "spes/data/prepare.h"

#include <spdlog/spdlog.h>

#include <nlohmann/json.hpp>
#include <thread>

#include "spes/data/corpus.h"
#include "spes/data/shard.h"
#include "spes/data/tokenizer.h"
#include "spes/util/error.h"
#include "spes/util/fs.h"

namespace spes {
namespace fs = std::filesystem;

DataPaths data_paths(const DataConfig& data) {
  DataPaths p;
  p.dir = data.dir;
  p.tokenizer = p.dir / "tokenizer.model";
  p.train = p.dir / "train.bin";
  p.val = p.dir / "val.bin";
  p.meta = p.dir / "meta.json";
  return p;
}

bool is_validation_document(const std::string& name, double val_fraction) {
  std::uint64_t h = 1469598103934665603ull;  // FNV-1a
  for (unsigned char c : name) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return static_cast<double>(h % 1000000ull) < val_fraction * 1e6;
}

namespace {

nlohmann::json settings_of(const Config& c) {
  return {{"corpus", c.data.corpus},
          {"tokenizer", c.data.tokenizer},
          {"tokenizer_type", c.data.tokenizer_type},
          {"vocab_size", c.model.vocab_size},
          {"val_fraction", c.data.val_fraction},
          {"format_version", kShardVersion}};
}

std::vector<std::uint32_t> encode_all(const Tokenizer& tok, const std::vector<const Document*>& docs) {
  std::vector<std::uint32_t> out;
  for (const Document* d : docs) {
    auto ids = tok.encode(d->text);
    out.insert(out.end(), ids.begin(), ids.end());
    out.push_back(tok.eos_id());
  }
  return out;
}

}  // namespace

PreparedData prepare_data(const Config& config, bool force) {
  PreparedData result;
  result.paths = data_paths(config.data);
  const DataPaths& p = result.paths;
  const nlohmann::json settings = settings_of(config);
  // Several nodes started at once on one machine share data.dir: one prepares, the others wait
  // and then find it up to date.
  ensure_directory(p.dir);
  FileLock lock(p.dir / ".prepare.lock", [&] {
    spdlog::info("another process is preparing {}: waiting for it", p.dir.string());
  });

  if (!force && fs::exists(p.meta) && fs::exists(p.train) && fs::exists(p.val) && fs::exists(p.tokenizer)) {
    try {
      auto meta = nlohmann::json::parse(read_file(p.meta));
      if (meta.at("settings") == settings) {
        result.vocab_size = meta.at("vocab_size");
        result.train_tokens = meta.at("train_tokens");
        result.val_tokens = meta.at("val_tokens");
        result.train_docs = meta.at("train_docs");
        result.val_docs = meta.at("val_docs");
        result.reused = true;
        spdlog::info("data in {} is up to date ({} train / {} validation tokens)", p.dir.string(),
                     result.train_tokens, result.val_tokens);
        return result;
      }
      spdlog::info("data in {} was made with other settings; rebuilding", p.dir.string());
    } catch (const std::exception& e) {
      spdlog::warn("ignoring unreadable {}: {}", p.meta.string(), e.what());
    }
  }

  // A user-supplied tokenizer is checked before the (slower) corpus is read.
  if (!config.data.tokenizer.empty()) Tokenizer check(config.data.tokenizer);
  std::vector<Document> docs = load_corpus(config.data);
  std::vector<const Document*> train_docs, val_docs;
  for (const auto& d : docs) (is_validation_document(d.name, config.data.val_fraction) ? val_docs : train_docs).push_back(&d);
  if (docs.size() < 2)
    raise(ErrorKind::Data, "corpus '{}' has {} document(s); at least 2 are needed to hold one out "
          "for validation", config.data.corpus, docs.size());
  // Small corpora can hash every document to one side; move one across so both splits exist.
  if (val_docs.empty()) {
    val_docs.push_back(train_docs.back());
    train_docs.pop_back();
  } else if (train_docs.empty()) {
    train_docs.push_back(val_docs.back());
    val_docs.pop_back();
  }
  spdlog::info("corpus {}: {} documents ({} train, {} validation)", config.data.corpus, docs.size(),
               train_docs.size(), val_docs.size());

  if (config.data.tokenizer.empty()) {
    std::vector<Document> train_copy;
    train_copy.reserve(train_docs.size());
    for (const Document* d : train_docs) train_copy.push_back(*d);
    TokenizerTrainOptions opts;
    opts.vocab_size = config.model.vocab_size;
    opts.model_type = config.data.tokenizer_type;
    opts.seed = static_cast<std::uint32_t>(config.run.seed);
    opts.threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    spdlog::info("training a {} tokenizer with {} pieces", opts.model_type, opts.vocab_size);
    Tokenizer::train(train_copy, p.tokenizer, opts);
  } else {
    // data.tokenizer may already be data.dir's own tokenizer.model (a rebuild with other settings).
    std::error_code ec;
    if (!fs::equivalent(config.data.tokenizer, p.tokenizer, ec))
      fs::copy_file(config.data.tokenizer, p.tokenizer, fs::copy_options::overwrite_existing);
  }
  Tokenizer tok(p.tokenizer);
  if (tok.vocab_size() > config.model.vocab_size)
    raise(ErrorKind::Data, "tokenizer '{}' has {} pieces but model.vocab_size is {} ({})",
          p.tokenizer.string(), tok.vocab_size(), config.model.vocab_size, config.where("model.vocab_size"));

  auto train_tokens = encode_all(tok, train_docs);
  auto val_tokens = encode_all(tok, val_docs);
  const auto vocab = static_cast<std::uint32_t>(config.model.vocab_size);
  write_token_shard(p.train, train_tokens, vocab, tok.eos_id());
  write_token_shard(p.val, val_tokens, vocab, tok.eos_id());

  result.vocab_size = config.model.vocab_size;
  result.train_tokens = static_cast<std::int64_t>(train_tokens.size());
  result.val_tokens = static_cast<std::int64_t>(val_tokens.size());
  result.train_docs = static_cast<std::int64_t>(train_docs.size());
  result.val_docs = static_cast<std::int64_t>(val_docs.size());
  nlohmann::json meta = {{"settings", settings},
                         {"vocab_size", result.vocab_size},
                         {"train_tokens", result.train_tokens},
                         {"val_tokens", result.val_tokens},
                         {"train_docs", result.train_docs},
                         {"val_docs", result.val_docs}};
  write_file_atomic(p.meta, meta.dump(2) + "\n");
  spdlog::info("wrote {} ({} tokens) and {} ({} tokens)", p.train.string(), result.train_tokens,
               p.val.string(), result.val_tokens);
  return result;
}

}  // namespace spes
