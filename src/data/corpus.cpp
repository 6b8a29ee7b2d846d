#include "spes/data/corpus.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <nlohmann/json.hpp>
#include <sstream>

#include "spes/util/error.h"
#include "spes/util/fs.h"
#include "spes/util/process.h"

namespace spes {
namespace fs = std::filesystem;

std::vector<Document> kjv_chapters(std::string_view listing) {
  std::vector<Document> docs;
  std::size_t line_no = 0, pos = 0;
  while (pos < listing.size()) {
    std::size_t eol = listing.find('\n', pos);
    if (eol == std::string_view::npos) eol = listing.size();
    std::string_view line = listing.substr(pos, eol - pos);
    pos = eol + 1;
    ++line_no;
    if (line.find_first_not_of(" \t\r") == std::string_view::npos) continue;
    // "Ge1:1 In the beginning ...": the chapter is the reference up to the colon.
    std::size_t space = line.find(' ');
    std::size_t colon = line.find(':');
    if (space == std::string_view::npos || colon == std::string_view::npos || colon > space || colon == 0)
      raise(ErrorKind::Data, "line {} of the bible listing is not 'Book<chapter>:<verse> text': '{}'", line_no,
            std::string(line.substr(0, 80)));
    std::string chapter(line.substr(0, colon));
    std::string_view verse = line.substr(space + 1);
    while (!verse.empty() && (verse.back() == '\r' || verse.back() == ' ')) verse.remove_suffix(1);
    if (docs.empty() || docs.back().name != chapter) docs.push_back({chapter, ""});
    else docs.back().text += '\n';
    docs.back().text += verse;
  }
  return docs;
}

std::vector<Document> read_kjv_corpus() {
  if (!program_exists("bible"))
    raise(ErrorKind::Data,
          "data.corpus is 'kjv' but the program 'bible' is not installed: install Debian's bible-kjv "
          "(run scripts/setup.sh), or point data.corpus at a folder of .txt / .jsonl files");
  CommandResult listing = run_command({"bible", "-f", kKjvRange});
  if (listing.exit_status != 0)
    raise(ErrorKind::Data, "'bible -f {}' failed (exit {}): {}", kKjvRange, listing.exit_status,
          listing.output.substr(0, 400));
  std::vector<Document> docs = kjv_chapters(listing.output);
  if (docs.size() < kKjvChapters)
    raise(ErrorKind::Data, "'bible -f {}' gave {} chapters, expected {}: is bible-kjv-text complete?", kKjvRange,
          docs.size(), kKjvChapters);
  return docs;
}

std::vector<Document> read_text_folder(const fs::path& dir) {
  if (!fs::is_directory(dir))
    raise(ErrorKind::Data, "corpus folder '{}' does not exist (data.corpus must be 'kjv' or a folder)",
          dir.string());
  std::vector<fs::path> files;
  for (const auto& entry : fs::recursive_directory_iterator(dir)) {
    if (!entry.is_regular_file()) continue;
    auto ext = entry.path().extension().string();
    if (ext == ".txt" || ext == ".jsonl") files.push_back(entry.path());
  }
  std::sort(files.begin(), files.end());
  std::vector<Document> docs;
  for (const auto& f : files) {
    std::string content = read_file(f);
    std::string rel = fs::relative(f, dir).string();
    if (f.extension() == ".txt") {
      if (content.find_first_not_of(" \t\r\n") != std::string::npos) docs.push_back({rel, content});
      continue;
    }
    std::istringstream lines(content);
    std::string line;
    int line_no = 0;
    while (std::getline(lines, line)) {
      ++line_no;
      if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
      nlohmann::json obj;
      try {
        obj = nlohmann::json::parse(line);
      } catch (const nlohmann::json::parse_error& e) {
        raise(ErrorKind::Data, "{}:{}: not valid JSON: {}", f.string(), line_no, e.what());
      }
      if (!obj.is_object() || !obj.contains("text") || !obj["text"].is_string())
        raise(ErrorKind::Data, "{}:{}: expected an object with a string field \"text\"", f.string(), line_no);
      std::string text = obj["text"].get<std::string>();
      if (!text.empty()) docs.push_back({rel + ":" + std::to_string(line_no), std::move(text)});
    }
  }
  if (docs.empty())
    raise(ErrorKind::Data, "corpus folder '{}' holds no text: expected non-empty .txt or .jsonl files",
          dir.string());
  return docs;
}

std::vector<Document> load_corpus(const DataConfig& data) {
  if (data.corpus == kKjvCorpus) return read_kjv_corpus();
  return read_text_folder(data.corpus);
}

}  // namespace spes
