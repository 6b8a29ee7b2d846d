// SentencePiece tokenizer: train one on documents, or load a .model file.
// Thread-safe for concurrent encode/decode after construction.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "spes/data/corpus.h"

namespace spes {

struct TokenizerTrainOptions {
  std::int64_t vocab_size = 8192;
  std::string model_type = "bpe";  // bpe | unigram
  std::uint32_t seed = 6198;
  int threads = 2;
};

class Tokenizer {
 public:
  // Loads a SentencePiece .model file; Error(Data) if missing or unreadable.
  explicit Tokenizer(const std::filesystem::path& model_file);
  ~Tokenizer();
  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;

  // Trains on the documents' lines and writes `model_file` (and nothing else).
  static void train(const std::vector<Document>& docs, const std::filesystem::path& model_file,
                    const TokenizerTrainOptions& options);

  std::vector<std::uint32_t> encode(const std::string& text) const;
  std::string decode(const std::vector<std::uint32_t>& ids) const;
  std::int64_t vocab_size() const;
  std::uint32_t eos_id() const;
  const std::filesystem::path& path() const { return path_; }

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  std::filesystem::path path_;
};

}  // namespace spes
