#include "yaml_reader.h"

#include <cmath>
#include <filesystem>
#include <limits>

#include "spes/util/error.h"

namespace spes::config_detail {

MapReader::MapReader(YAML::Node node, std::string prefix, std::string source,
                     std::map<std::string, int>* lines)
    : node_(std::move(node)), prefix_(std::move(prefix)), source_(std::move(source)), lines_(lines) {
  if (node_ && !node_.IsNull() && !node_.IsMap()) {
    std::string what = prefix_.empty() ? "the document" : "'" + prefix_ + "'";
    raise(ErrorKind::Config, "{}:{}: {} must be a mapping of keys to values", source_,
          node_.Mark().line + 1, what);
  }
}

std::string MapReader::path(const std::string& key) const { return prefix_.empty() ? key : prefix_ + "." + key; }

std::string MapReader::where(const std::string& key) const { return describe_key(source_, *lines_, path(key)); }

void MapReader::fail(const std::string& key, const std::string& message) const {
  raise(ErrorKind::Config, "{}: {}", where(key), message);
}

bool MapReader::has(const std::string& key) const {
  return node_ && node_.IsMap() && node_[key];
}

YAML::Node MapReader::lookup(const std::string& key) {
  known_.insert(key);
  const YAML::Node& map = node_;
  if (!map || !map.IsMap() || !map[key]) return YAML::Node(YAML::NodeType::Undefined);
  YAML::Node value = map[key];
  {
    const std::string full = path(key);
    // Keys given with --set are pre-marked -1 so that messages name the flag, not a line.
    auto it = lines_->find(full);
    if (it == lines_->end() || it->second >= 0) (*lines_)[full] = value.Mark().line + 1;
  }
  return value;
}

namespace {
std::string shown(const YAML::Node& v) { return v.IsScalar() ? "'" + v.Scalar() + "'" : "a list or mapping"; }
bool scalar_is(const YAML::Node& v) { return v.IsScalar(); }
}  // namespace

void MapReader::get(const std::string& key, std::int64_t& out) {
  YAML::Node v = lookup(key);
  if (!v || v.IsNull()) return;  // absent or empty: keep the default
  if (v.IsScalar()) {
    try {
      out = v.as<std::int64_t>();
      return;
    } catch (const YAML::Exception&) {
    }
    try {  // "1e6" is an integer too
      double d = v.as<double>();
      if (std::floor(d) == d && std::fabs(d) < 9e15) {
        out = static_cast<std::int64_t>(d);
        return;
      }
    } catch (const YAML::Exception&) {
    }
  }
  fail(key, fmt::format("expected an integer, got {}", shown(v)));
}

void MapReader::get(const std::string& key, int& out) {
  std::int64_t wide = out;
  get(key, wide);
  if (wide < std::numeric_limits<int>::min() || wide > std::numeric_limits<int>::max())
    fail(key, fmt::format("{} does not fit in a 32-bit integer", wide));
  out = static_cast<int>(wide);
}

void MapReader::get(const std::string& key, std::uint64_t& out) {
  std::int64_t wide = static_cast<std::int64_t>(out);
  get(key, wide);
  if (wide < 0) fail(key, fmt::format("must not be negative, got {}", wide));
  out = static_cast<std::uint64_t>(wide);
}

void MapReader::get(const std::string& key, double& out) {
  YAML::Node v = lookup(key);
  if (!v || v.IsNull()) return;  // absent or empty: keep the default
  try {
    if (!scalar_is(v)) throw YAML::Exception(YAML::Mark(), "");
    out = v.as<double>();
  } catch (const YAML::Exception&) {
    fail(key, fmt::format("expected a number, got {}", shown(v)));
  }
  if (!std::isfinite(out)) fail(key, "must be a finite number");
}

void MapReader::get(const std::string& key, bool& out) {
  YAML::Node v = lookup(key);
  if (!v || v.IsNull()) return;  // absent or empty: keep the default
  try {
    if (!scalar_is(v)) throw YAML::Exception(YAML::Mark(), "");
    out = v.as<bool>();
  } catch (const YAML::Exception&) {
    fail(key, fmt::format("expected true or false, got {}", shown(v)));
  }
}

void MapReader::get(const std::string& key, std::string& out) {
  YAML::Node v = lookup(key);
  if (!v) return;
  if (v.IsNull()) {
    out.clear();
    return;
  }
  if (!v.IsScalar()) fail(key, "expected a string");
  out = v.Scalar();
}

MapReader MapReader::section(const std::string& key) {
  YAML::Node v = lookup(key);
  if (v && !v.IsNull() && !v.IsMap()) fail(key, "must be a mapping (a section of keys)");
  return MapReader(v && !v.IsNull() ? v : YAML::Node(YAML::NodeType::Undefined), path(key), source_, lines_);
}

YAML::Node MapReader::raw(const std::string& key) { return lookup(key); }

void MapReader::finish() const {
  if (!node_ || !node_.IsMap()) return;
  for (const auto& entry : node_) {
    if (!entry.first.IsScalar())  // YAML's complex keys ("? ...") are valid YAML but no spes key
      raise(ErrorKind::Config, "{}:{}: a key must be a plain name, not a list or a mapping{}", source_,
            entry.first.Mark().line + 1, prefix_.empty() ? "" : " (in '" + prefix_ + "')");
    std::string key = entry.first.Scalar();
    if (known_.count(key)) continue;
    std::string known_list;
    for (const auto& k : known_) known_list += (known_list.empty() ? "" : ", ") + k;
    std::string full = prefix_.empty() ? key : prefix_ + "." + key;
    auto marked = lines_->find(full);
    std::string at = marked != lines_->end() && marked->second < 0
                         ? fmt::format("{} (--set {})", source_, full)
                         : fmt::format("{}:{}", source_, entry.first.Mark().line + 1);
    raise(ErrorKind::Config, "{}: unknown key '{}' (known keys{}: {})", at, full,
          prefix_.empty() ? "" : " in '" + prefix_ + "'", known_list);
  }
}

void apply_override(YAML::Node& root, const std::string& assignment) {
  auto eq = assignment.find('=');
  if (eq == std::string::npos || eq == 0)
    raise(ErrorKind::Config, "--set '{}': expected section.key=value", assignment);
  std::string path = assignment.substr(0, eq);
  std::string value_text = assignment.substr(eq + 1);
  YAML::Node value;
  try {
    value = YAML::Load(value_text);
  } catch (const YAML::Exception& e) {
    raise(ErrorKind::Config, "--set '{}': value is not valid YAML: {}", assignment, e.msg);
  }
  std::vector<std::string> parts;
  std::size_t start = 0;
  while (true) {
    auto dot = path.find('.', start);
    parts.push_back(path.substr(start, dot - start));
    if (dot == std::string::npos) break;
    start = dot + 1;
  }
  // yaml-cpp's operator[] on a Node copy still refers to the same document, so walk with
  // reset() to move the cursor without assigning through it.
  YAML::Node cursor;
  cursor.reset(root);
  for (std::size_t i = 0; i + 1 < parts.size(); ++i) {
    if (parts[i].empty()) raise(ErrorKind::Config, "--set '{}': empty key in path", assignment);
    YAML::Node next = cursor[parts[i]];
    if (!next || next.IsNull()) {
      cursor[parts[i]] = YAML::Node(YAML::NodeType::Map);
      next = cursor[parts[i]];
    } else if (!next.IsMap()) {
      raise(ErrorKind::Config, "--set '{}': '{}' is not a section", assignment, parts[i]);
    }
    cursor.reset(next);
  }
  cursor[parts.back()] = value;
}

void read_credentials(MapReader& r, Credentials& c, std::string* node_dir) {
  r.get("token", c.token);
  r.get("token_file", c.token_file);
  r.get("insecure", c.insecure);
  MapReader tls = r.section("tls");
  tls.get("ca", c.tls_ca);
  tls.get("cert", c.tls_cert);
  tls.get("key", c.tls_key);
  if (node_dir) tls.get("node_dir", *node_dir);
  tls.finish();
}

void check_credentials(MapReader& r, const Credentials& c, bool files_exist) {
  if (c.token.empty() && c.token_file.empty())
    r.fail("token", fmt::format("a run token is required ({} or {})", r.path("token"), r.path("token_file")));
  if (files_exist && !c.token_file.empty() && !std::filesystem::exists(c.token_file))
    r.fail("token_file", fmt::format("file '{}' does not exist", c.token_file));
  const bool any_tls = !c.tls_ca.empty() || !c.tls_cert.empty() || !c.tls_key.empty();
  if (c.insecure && any_tls) r.fail("insecure", fmt::format("is true but {} is also given: choose one", r.path("tls")));
  if (c.insecure) return;
  if (!any_tls)
    r.fail("tls", fmt::format("TLS files are required ({}, {}, {}), or set {}: true", r.path("tls.ca"),
                              r.path("tls.cert"), r.path("tls.key"), r.path("insecure")));
  MapReader tls = r.section("tls");
  for (auto [key, path] : {std::pair{"ca", &c.tls_ca}, {"cert", &c.tls_cert}, {"key", &c.tls_key}}) {
    if (path->empty()) tls.fail(key, "is required with TLS");
    if (files_exist && !std::filesystem::exists(*path)) tls.fail(key, fmt::format("file '{}' does not exist", *path));
  }
}

std::string describe_key(const std::string& source, const std::map<std::string, int>& lines, const std::string& key) {
  auto it = lines.find(key);
  if (it == lines.end()) return fmt::format("{} ({})", source, key);
  if (it->second < 0) return fmt::format("{} (--set {})", source, key);
  return fmt::format("{}:{} ({})", source, it->second, key);
}

// An expert list: 'all' (empty result), or integers and 'a-b' ranges.
std::vector<int> read_expert_list(MapReader& r, const YAML::Node& node, const std::string& key) {
  std::vector<int> out;
  if (!node || node.IsNull()) return out;
  if (node.IsScalar()) {
    if (node.Scalar() == "all") return out;
    r.fail(key, fmt::format("expected 'all' or a list of expert indices, got '{}'", node.Scalar()));
  }
  if (!node.IsSequence()) r.fail(key, "expected 'all' or a list of expert indices");
  for (const auto& item : node) {
    if (!item.IsScalar()) r.fail(key, "list items must be integers or 'a-b' ranges");
    const std::string& text = item.Scalar();
    auto dash = text.find('-', 1);
    try {
      if (dash != std::string::npos) {
        int lo = std::stoi(text.substr(0, dash));
        int hi = std::stoi(text.substr(dash + 1));
        if (hi < lo) r.fail(key, fmt::format("range '{}' is empty", text));
        for (int e = lo; e <= hi; ++e) out.push_back(e);
      } else {
        std::size_t used = 0;
        int e = std::stoi(text, &used);
        if (used != text.size()) throw std::invalid_argument(text);
        out.push_back(e);
      }
    } catch (const std::logic_error&) {
      r.fail(key, fmt::format("'{}' is not an expert index or 'a-b' range", text));
    }
  }
  return out;
}

}  // namespace spes::config_detail
