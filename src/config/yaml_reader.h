// Strict reading of one YAML mapping into struct fields (internal to the config module).
// Each get() records the key as known; finish() rejects keys nobody asked for. Messages
// carry "file:line: section.key: ..." so users can find the offending line.
#pragma once

#include <yaml-cpp/yaml.h>

#include <map>
#include <set>
#include <string>
#include <vector>

#include "spes/config/config.h"

namespace spes::config_detail {

class MapReader {
 public:
  // `prefix` is the dotted path of this mapping ("model"); `lines` collects key -> line.
  MapReader(YAML::Node node, std::string prefix, std::string source,
            std::map<std::string, int>* lines);

  bool has(const std::string& key) const;
  void get(const std::string& key, std::int64_t& out);
  void get(const std::string& key, int& out);
  void get(const std::string& key, std::uint64_t& out);
  void get(const std::string& key, double& out);
  void get(const std::string& key, bool& out);
  void get(const std::string& key, std::string& out);
  // A sub-mapping; absent gives an empty reader.
  MapReader section(const std::string& key);
  // The raw node (for fields with custom syntax); marks the key as known.
  YAML::Node raw(const std::string& key);
  // Throws for every key present in the mapping that no get()/section()/raw() asked for.
  void finish() const;

  std::string path(const std::string& key) const;   // "section.key"
  std::string where(const std::string& key) const;  // "file:line (section.key)"
  [[noreturn]] void fail(const std::string& key, const std::string& message) const;

 private:
  YAML::Node lookup(const std::string& key);
  YAML::Node node_;
  std::string prefix_;
  std::string source_;
  std::map<std::string, int>* lines_;
  std::set<std::string> known_;
};

// Reads token, token_file, insecure and tls: {ca, cert, key} from `r`; with `node_dir` also
// tls.node_dir (a cluster file's folder of per-node certificates).
void read_credentials(MapReader& r, Credentials& c, std::string* node_dir = nullptr);
// A token (or its file) is required, and TLS files unless insecure (not both); with `files_exist`
// every named file must exist.
void check_credentials(MapReader& r, const Credentials& c, bool files_exist);

// "file:line (key)", "file (--set key)" or "file (key)" from a config's recorded key lines.
std::string describe_key(const std::string& source, const std::map<std::string, int>& lines, const std::string& key);

// An expert list: 'all' or absent (empty result), or integers and 'a-b' ranges.
std::vector<int> read_expert_list(MapReader& r, const YAML::Node& node, const std::string& key);

// Applies "a.b.c=value" to a document, creating maps as needed. Throws Error(Config).
void apply_override(YAML::Node& root, const std::string& assignment);

}  // namespace spes::config_detail
