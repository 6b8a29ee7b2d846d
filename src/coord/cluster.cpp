#include "spes/coord/cluster.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <filesystem>
#include <set>

#include "config/yaml_reader.h"
#include "spes/config/config.h"
#include "spes/sync/identity.h"
#include "spes/util/error.h"
#include "spes/util/fs.h"

namespace spes {
using config_detail::MapReader;

const char* assignment_strategy_name(AssignmentStrategy s) {
  switch (s) {
    case AssignmentStrategy::Contiguous: return "contiguous";
    case AssignmentStrategy::RoundRobin: return "round_robin";
    case AssignmentStrategy::Explicit: return "explicit";
  }
  return "?";
}

std::string ClusterConfig::where(const std::string& key) const {
  return config_detail::describe_key(source, key_lines, key);
}

std::string ClusterConfig::node_cert(int id) const {
  return tls_node_dir.empty() ? tls_cert : (std::filesystem::path(tls_node_dir) / (node_holder_name(id) + ".pem")).string();
}

std::string ClusterConfig::node_key(int id) const {
  return tls_node_dir.empty() ? tls_key : (std::filesystem::path(tls_node_dir) / (node_holder_name(id) + ".key")).string();
}

std::string ClusterConfig::state_path() const {
  return coordinator.state.empty() ? out_dir + "/coordinator/state.json" : coordinator.state;
}

namespace {

void read_nodes(MapReader& top, ClusterConfig& c) {
  YAML::Node list = top.raw("nodes");
  if (!list || !list.IsSequence() || list.size() == 0)
    top.fail("nodes", "is required: a list of {id, address} mappings, one per node");
  std::set<int> ids;
  std::set<std::string> addresses;
  for (std::size_t i = 0; i < list.size(); ++i) {
    MapReader item(list[i], fmt::format("nodes[{}]", i), c.source, &c.key_lines);
    ClusterNode node;
    if (!item.has("id")) item.fail("id", "is required");
    if (!item.has("address")) item.fail("address", "is required (host:port of the node's sync service)");
    item.get("id", node.id);
    item.get("address", node.address);
    node.experts = config_detail::read_expert_list(item, item.raw("experts"), "experts");
    item.get("metrics", node.metrics);
    item.finish();
    if (!node.metrics.empty() && node.metrics.rfind(':') == std::string::npos)
      item.fail("metrics", fmt::format("'{}' is not host:port", node.metrics));
    if (node.address.rfind(':') == std::string::npos)
      item.fail("address", fmt::format("'{}' is not host:port", node.address));
    if (!ids.insert(node.id).second) item.fail("id", fmt::format("node id {} is listed twice", node.id));
    if (!addresses.insert(node.address).second)
      item.fail("address", fmt::format("address {} is used by two nodes", node.address));
    c.nodes.push_back(std::move(node));
  }
  std::sort(c.nodes.begin(), c.nodes.end(), [](const auto& a, const auto& b) { return a.id < b.id; });
  for (std::size_t i = 0; i < c.nodes.size(); ++i)
    if (c.nodes[i].id != static_cast<int>(i))
      top.fail("nodes", fmt::format("node ids must be 0..{} (one per node); id {} is missing", c.nodes.size() - 1, i));
}

}  // namespace

ClusterConfig parse_cluster(const std::string& yaml_text, const std::string& source_name) {
  YAML::Node root;
  try {
    root = YAML::Load(yaml_text);
  } catch (const YAML::ParserException& e) {
    raise(ErrorKind::Config, "{}:{}: not valid YAML: {}", source_name, e.mark.line + 1, e.msg);
  }
  if (!root || !root.IsMap()) raise(ErrorKind::Config, "{}: a cluster file is a YAML mapping", source_name);
  ClusterConfig c;
  c.source = source_name;
  MapReader top(root, "", source_name, &c.key_lines);
  for (const char* key : {"run", "config", "out_dir"})
    if (!top.has(key)) top.fail(key, "is required");
  top.get("run", c.run);
  top.get("config", c.config);
  top.get("out_dir", c.out_dir);
  read_credentials(top, c, &c.tls_node_dir);
  std::string strategy = "contiguous";
  top.get("assignment", strategy);
  if (strategy == "contiguous") c.assignment = AssignmentStrategy::Contiguous;
  else if (strategy == "round_robin") c.assignment = AssignmentStrategy::RoundRobin;
  else if (strategy == "explicit") c.assignment = AssignmentStrategy::Explicit;
  else top.fail("assignment", fmt::format("'{}' is not one of contiguous, round_robin, explicit", strategy));
  top.get("replication", c.replication);
  top.get("experts_per_layer", c.experts_per_layer);
  YAML::Node set = top.raw("set");
  if (set && !set.IsNull()) {
    if (!set.IsMap()) top.fail("set", "expected a mapping of config keys to values, e.g. {train.steps: 200}");
    for (const auto& kv : set) {
      YAML::Emitter out;
      out << YAML::Flow << kv.second;
      c.overrides.emplace_back(kv.first.as<std::string>(), out.c_str());
    }
  }
  MapReader coord = top.section("coordinator");
  coord.get("address", c.coordinator.address);
  coord.get("heartbeat_s", c.coordinator.heartbeat_s);
  coord.get("dead_after_s", c.coordinator.dead_after_s);
  coord.get("grace_s", c.coordinator.grace_s);
  coord.get("state", c.coordinator.state);
  coord.get("metrics", c.coordinator.metrics);
  coord.get("http", c.coordinator.http);
  coord.finish();
  if (!c.coordinator.http.empty() && c.coordinator.http.rfind(':') == std::string::npos)
    coord.fail("http", fmt::format("'{}' is not host:port", c.coordinator.http));
  if (!c.coordinator.metrics.empty() && c.coordinator.metrics.rfind(':') == std::string::npos)
    coord.fail("metrics", fmt::format("'{}' is not host:port", c.coordinator.metrics));
  read_nodes(top, c);
  top.finish();

  if (c.run.empty()) top.fail("run", "must not be empty");
  // The token file may not exist yet: launch-local creates it (the node configs check it).
  check_credentials(top, c, /*files_exist=*/false);
  if (c.replication != 1)
    top.fail("replication", fmt::format("{} owners per expert is not supported: every expert has exactly one owner "
                                        "(replication: 1)", c.replication));
  if (!c.coordinator.address.empty() && c.coordinator.address.rfind(':') == std::string::npos)
    coord.fail("address", fmt::format("'{}' is not host:port", c.coordinator.address));
  if (c.coordinator.heartbeat_s <= 0) coord.fail("heartbeat_s", "must be positive");
  if (c.coordinator.dead_after_s <= c.coordinator.heartbeat_s)
    coord.fail("dead_after_s", "must be longer than heartbeat_s");
  if (c.coordinator.grace_s < 0) coord.fail("grace_s", "must be >= 0");
  const bool explicit_lists = std::any_of(c.nodes.begin(), c.nodes.end(), [](const auto& n) { return !n.experts.empty(); });
  if (explicit_lists && c.assignment != AssignmentStrategy::Explicit)
    top.fail("assignment", "nodes list experts, which needs assignment: explicit");
  for (const auto& n : c.nodes)
    if (n.address == c.coordinator.address)
      top.fail("coordinator", fmt::format("address {} is also node {}'s address", n.address, n.id));
  return c;
}

ClusterConfig load_cluster(const std::string& path) {
  if (!std::filesystem::exists(path)) raise(ErrorKind::Config, "cluster file '{}' does not exist", path);
  return parse_cluster(read_file(path), path);
}

std::vector<std::vector<int>> assign_experts(const ClusterConfig& c, std::int64_t n_experts) {
  const auto n = static_cast<std::int64_t>(c.nodes.size());
  std::vector<std::vector<int>> owned(c.nodes.size());
  if (c.experts_per_layer != 0 && c.experts_per_layer != n_experts)
    raise(ErrorKind::Config, "{}: experts_per_layer is {} but the base config's model.n_experts is {}",
          c.where("experts_per_layer"), c.experts_per_layer, n_experts);
  switch (c.assignment) {
    case AssignmentStrategy::Contiguous:
      if (n_experts % n != 0)
        raise(ErrorKind::Config, "{}: {} experts cannot be split into {} equal contiguous blocks; use round_robin or "
              "explicit", c.where("assignment"), n_experts, n);
      for (std::int64_t e = 0; e < n_experts; ++e) owned[static_cast<std::size_t>(e / (n_experts / n))].push_back(static_cast<int>(e));
      break;
    case AssignmentStrategy::RoundRobin:
      if (n_experts < n)
        raise(ErrorKind::Config, "{}: {} experts for {} nodes: some node would train no expert", c.where("nodes"),
              n_experts, n);
      for (std::int64_t e = 0; e < n_experts; ++e) owned[static_cast<std::size_t>(e % n)].push_back(static_cast<int>(e));
      break;
    case AssignmentStrategy::Explicit: {
      std::vector<int> owner(static_cast<std::size_t>(n_experts), -1);
      for (std::size_t i = 0; i < c.nodes.size(); ++i) {
        if (c.nodes[i].experts.empty())
          raise(ErrorKind::Config, "{}: node {} lists no experts (explicit assignment)", c.where("nodes"), c.nodes[i].id);
        for (int e : c.nodes[i].experts) {
          if (e < 0 || e >= n_experts)
            raise(ErrorKind::Config, "{}: node {}: expert {} is out of range: the model has experts 0..{}",
                  c.where("nodes"), c.nodes[i].id, e, n_experts - 1);
          if (owner[e] >= 0)
            raise(ErrorKind::Config, "{}: expert {} is owned by nodes {} and {} (replication is not supported)",
                  c.where("nodes"), e, owner[e], c.nodes[i].id);
          owner[e] = c.nodes[i].id;
          owned[i].push_back(e);
        }
        std::sort(owned[i].begin(), owned[i].end());
      }
      for (std::int64_t e = 0; e < n_experts; ++e)
        if (owner[e] < 0) raise(ErrorKind::Config, "{}: expert {} is owned by no node", c.where("nodes"), e);
      break;
    }
  }
  return owned;
}

std::map<int, std::vector<int>> reassign_experts(const std::map<int, std::vector<int>>& planned,
                                                 const std::map<int, std::vector<int>>& current,
                                                 const std::vector<int>& live, std::int64_t n_experts) {
  SPES_CHECK(!live.empty(), "reassignment needs a live node");
  auto owner_in = [](const std::map<int, std::vector<int>>& m, int e) {
    for (const auto& [id, experts] : m)
      if (std::find(experts.begin(), experts.end(), e) != experts.end()) return id;
    return -1;
  };
  auto is_live = [&](int id) { return std::binary_search(live.begin(), live.end(), id); };
  std::map<int, std::vector<int>> out;
  for (int id : live) out[id];
  std::vector<int> homeless;
  for (int e = 0; e < n_experts; ++e) {
    int p = owner_in(planned, e), c = owner_in(current, e);
    if (p >= 0 && is_live(p)) out[p].push_back(e);
    else if (c >= 0 && is_live(c)) out[c].push_back(e);
    else homeless.push_back(e);
  }
  for (int e : homeless) {
    int best = live.front();
    for (int id : live)
      if (out[id].size() < out[best].size()) best = id;
    out[best].push_back(e);
  }
  for (auto& [id, experts] : out) std::sort(experts.begin(), experts.end());
  return out;
}

namespace {

YAML::Node flow_list(const std::vector<int>& values) {
  YAML::Node list(YAML::NodeType::Sequence);
  for (int v : values) list.push_back(v);
  list.SetStyle(YAML::EmitterStyle::Flow);
  return list;
}

std::string node_yaml(const ClusterConfig& c, YAML::Node root, std::size_t index,
                      const std::vector<std::vector<int>>& owned) {
  const ClusterNode& me = c.nodes[index];
  root["run"]["name"] = c.run;
  root["run"]["node_id"] = me.id;
  root["run"]["out_dir"] = c.out_dir + "/node" + std::to_string(me.id);
  YAML::Node sync = root["sync"];
  if (!sync["every"])
    raise(ErrorKind::Config, "{}: sync.every is set neither in the base config nor in `set:`", c.where("set"));
  sync["run_id"] = c.run;
  YAML::Node peers(YAML::NodeType::Sequence);
  for (std::size_t i = 0; i < c.nodes.size(); ++i) {
    YAML::Node peer(YAML::NodeType::Map);
    peer["id"] = c.nodes[i].id;
    peer["address"] = c.nodes[i].address;
    peer["experts"] = flow_list(owned[i]);
    peer.SetStyle(YAML::EmitterStyle::Flow);
    peers.push_back(peer);
  }
  sync["peers"] = peers;
  for (const char* key : {"token", "token_file", "insecure", "tls"}) sync.remove(key);
  if (!c.token.empty()) sync["token"] = c.token;
  else sync["token_file"] = c.token_file;
  if (c.insecure) {
    sync["insecure"] = true;
  } else {
    sync["tls"]["ca"] = c.tls_ca;
    sync["tls"]["cert"] = c.node_cert(me.id);
    sync["tls"]["key"] = c.node_key(me.id);
  }
  root["train"].remove("owned_experts");
  if (!me.metrics.empty()) root["metrics"]["listen"] = me.metrics;
  if (!c.coordinator.address.empty()) {
    root["coordinator"]["address"] = c.coordinator.address;
    root["coordinator"]["heartbeat_s"] = c.coordinator.heartbeat_s;
  }
  YAML::Emitter out;
  out << root;
  return fmt::format("# node {} of run '{}', written by `spes coordinator plan` from {}\n{}\n", me.id, c.run, c.source,
                     out.c_str());
}

}  // namespace

static std::vector<std::string> override_list(const ClusterConfig& c) {
  std::vector<std::string> overrides;
  for (const auto& [key, value] : c.overrides) overrides.push_back(key + "=" + value);
  return overrides;
}

Config load_base_config(const ClusterConfig& c) {
  auto overrides = override_list(c);
  overrides.push_back("sync.every=0");
  overrides.push_back("coordinator.address=''");
  return load_config(c.config, overrides);
}

PlanFiles write_plan(const ClusterConfig& c, const std::string& out_dir) {
  const auto overrides = override_list(c);
  const Config base = load_base_config(c);
  const auto owned = assign_experts(c, base.model.n_experts);

  std::vector<std::pair<std::string, std::string>> files;  // path, text: all built before any is written
  PlanFiles plan;
  for (std::size_t i = 0; i < c.nodes.size(); ++i) {
    YAML::Node root = YAML::Load(read_file(c.config));
    for (const auto& o : overrides) config_detail::apply_override(root, o);
    const std::string path = out_dir + "/node" + std::to_string(c.nodes[i].id) + ".yaml";
    std::string text = node_yaml(c, root, i, owned);
    try {
      parse_config(text, path);
    } catch (const Error& e) {
      raise(ErrorKind::Config, "the config planned for node {} is not valid: {}", c.nodes[i].id, e.what());
    }
    files.emplace_back(path, std::move(text));
    plan.node_configs.push_back(path);
  }
  std::string table = fmt::format("# run '{}': {} nodes, {} experts per layer, assignment {}\n# node  address  experts\n",
                                  c.run, c.nodes.size(), base.model.n_experts, assignment_strategy_name(c.assignment));
  for (std::size_t i = 0; i < c.nodes.size(); ++i) {
    std::string experts;
    for (int e : owned[i]) experts += (experts.empty() ? "" : ",") + std::to_string(e);
    table += fmt::format("{}  {}  {}\n", c.nodes[i].id, c.nodes[i].address, experts);
  }
  plan.assignment_table = out_dir + "/assignment.txt";
  files.emplace_back(plan.assignment_table, table);
  ensure_directory(out_dir);
  for (const auto& [path, text] : files) write_file_atomic(path, text);
  return plan;
}

}  // namespace spes
