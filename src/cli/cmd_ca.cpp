// spes ca — the run's certificate authority and a certificate per node (docs/security.md).
//   spes ca init DIR --run RUN              DIR/ca.pem, DIR/ca.key
//   spes ca issue DIR --node 0,1,2 --host 10.0.0.5    DIR/node-0.pem, DIR/node-0.key, ...
//   spes ca issue DIR --coordinator | --admin
//   spes ca show FILE.pem
#include <spdlog/spdlog.h>
#include <sys/stat.h>

#include <cstdio>
#include <filesystem>

#include "commands.h"
#include "spes/sync/identity.h"
#include "spes/util/error.h"
#include "spes/util/fs.h"

namespace spes::cli {
namespace {
namespace fs = std::filesystem;

// Writes a PEM pair as DIR/<holder>.pem and DIR/<holder>.key (owner-only).
void write_pair(const fs::path& dir, const std::string& holder, const PemPair& pair, bool force) {
  const fs::path cert = dir / (holder + ".pem"), key = dir / (holder + ".key");
  for (const auto& p : {cert, key})
    if (fs::exists(p) && !force)
      raise(ErrorKind::Usage, "'{}' exists: pass --force to replace it (the old certificate stays valid until it expires; "
            "remove the node from the run to shut it out)", p.string());
  write_file_atomic(key, pair.key_pem);
  ::chmod(key.c_str(), 0600);
  write_file_atomic(cert, pair.cert_pem);
  std::printf("wrote %s and %s\n", cert.c_str(), key.c_str());
}

void init_ca(const std::string& dir, const std::string& run, int days) {
  const fs::path d(dir);
  if (fs::exists(d / "ca.pem") || fs::exists(d / "ca.key"))
    raise(ErrorKind::Usage, "'{}' already holds a CA (ca.pem / ca.key): every certificate of the run comes from one CA; "
          "use another folder for another run", dir);
  ensure_directory(d);
  const PemPair ca = make_run_ca(run, days);
  write_pair(d, "ca", ca, false);
  std::printf("CA of run '%s', valid %d days. Keep %s/ca.key off the nodes: it issues identities.\n", run.c_str(), days,
              dir.c_str());
}

PemPair read_ca(const fs::path& dir) {
  PemPair ca;
  for (auto [name, out] : {std::pair{"ca.pem", &ca.cert_pem}, {"ca.key", &ca.key_pem}}) {
    const fs::path p = dir / name;
    if (!fs::exists(p)) raise(ErrorKind::Usage, "'{}' does not exist: make the run's CA first (`spes ca init {} --run RUN`)",
                              p.string(), dir.string());
    *out = read_file(p);
  }
  return ca;
}

std::vector<int> parse_nodes(const std::string& list) {
  std::vector<int> out;
  std::size_t start = 0;
  while (start <= list.size()) {
    const std::size_t comma = std::min(list.find(',', start), list.size());
    const std::string item = list.substr(start, comma - start);
    std::size_t used = 0;
    int id = -1;
    try {
      id = std::stoi(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (item.empty() || used != item.size() || id < 0)
      raise(ErrorKind::Usage, "--node '{}': '{}' is not a node id (e.g. --node 0,1,2)", list, item);
    out.push_back(id);
    start = comma + 1;
  }
  return out;
}

void show(const std::string& path) {
  const std::string pem = read_file(path);
  const CertIdentity id = certificate_identity(pem);
  std::printf("%s: %s\n", path.c_str(), id.describe().c_str());
  if (!id.empty()) std::printf("  peers check the TLS name %s\n", holder_dns_name(id.name).c_str());
}

}  // namespace

void add_ca_commands(CLI::App& app) {
  auto* ca = app.add_subcommand("ca", "the run's certificate authority: a certificate per node (docs/security.md)");
  ca->require_subcommand(1);

  auto* init = ca->add_subcommand("init", "make the run's CA: DIR/ca.pem and DIR/ca.key");
  static std::string init_dir, run;
  static int init_days = 365;
  init->add_option("dir", init_dir, "folder for the CA files")->required();
  init->add_option("--run", run, "the run id every certificate will name")->required();
  init->add_option("--days", init_days, "validity in days")->check(CLI::PositiveNumber);
  init->callback([] { init_ca(init_dir, run, init_days); });

  auto* issue = ca->add_subcommand("issue", "issue certificates from DIR's CA: DIR/<holder>.pem and .key");
  static std::string issue_dir, nodes;
  static bool coordinator = false, admin = false, force = false;
  static std::vector<std::string> hosts;
  static int issue_days = 365;
  issue->add_option("dir", issue_dir, "folder holding ca.pem and ca.key")->required();
  auto* node_opt = issue->add_option("--node", nodes, "node ids, e.g. 0,1,2: node-<id>.pem / .key");
  auto* coord_opt = issue->add_flag("--coordinator", coordinator, "the coordinator's certificate");
  auto* admin_opt = issue->add_flag("--admin", admin, "an operator's certificate (spes coordinator status)");
  node_opt->excludes(coord_opt)->excludes(admin_opt);
  coord_opt->excludes(admin_opt);
  issue->add_option("--host", hosts, "also valid for this address or DNS name (repeatable)");
  issue->add_option("--days", issue_days, "validity in days")->check(CLI::PositiveNumber);
  issue->add_flag("--force", force, "replace existing files");
  issue->callback([] {
    std::vector<std::string> holders;
    if (coordinator) holders.push_back(kCoordinatorHolder);
    if (admin) holders.push_back(kAdminHolder);
    if (!nodes.empty())
      for (int id : parse_nodes(nodes)) holders.push_back(node_holder_name(id));
    if (holders.empty()) raise(ErrorKind::Usage, "spes ca issue: say whose certificate: --node IDS, --coordinator or --admin");
    const PemPair ca = read_ca(issue_dir);
    for (const auto& h : holders) write_pair(issue_dir, h, issue_certificate(ca, h, hosts, issue_days), force);
  });

  auto* show_cmd = ca->add_subcommand("show", "whose certificate a PEM file is");
  static std::string show_path;
  show_cmd->add_option("file", show_path, "certificate (.pem)")->required();
  show_cmd->callback([] { show(show_path); });
}

}  // namespace spes::cli
