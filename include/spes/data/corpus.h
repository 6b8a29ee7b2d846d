// Text corpora: the King James Bible shipped by a Debian package (bible-kjv), or any folder of
// .txt / .jsonl files. Throws Error(Data).
#pragma once

#include <cstddef>
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

// data.corpus == "kjv": the King James Bible from Debian's bible-kjv, listed by its `bible`
// program (about 4.4 MB of English, 1189 chapters); one document per chapter, named by it ("Ge1").
inline constexpr const char* kKjvCorpus = "kjv";
inline constexpr const char* kKjvRange = "Gen1:1-Rev22:21";
inline constexpr std::size_t kKjvChapters = 1189;

// `bible -f` output ("Ge1:1 In the beginning ...", a verse a line) to one document per chapter,
// its verses without their references, one a line. Error(Data) on a line of another shape.
std::vector<Document> kjv_chapters(std::string_view listing);
// Runs `bible -f Gen1:1-Rev22:21`; Error(Data) when bible-kjv is missing or incomplete.
std::vector<Document> read_kjv_corpus();

// Every .txt file (one document each) and .jsonl file (one {"text": ...} object a line)
// below `dir`, in sorted path order.
std::vector<Document> read_text_folder(const std::filesystem::path& dir);

// data.corpus == "kjv" → the King James Bible, otherwise a text folder. Never empty.
std::vector<Document> load_corpus(const DataConfig& data);

}  // namespace spes
