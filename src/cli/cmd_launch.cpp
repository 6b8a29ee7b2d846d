// spes launch-local CLUSTER.yaml — a whole SPES cluster on this machine: the coordinator and one
// node per cluster entry on 127.0.0.1, with live progress, a summary and the loss plot. Every
// process it starts runs in its own process group and is stopped by pid (SIGTERM, then SIGKILL)
// when the run ends, fails or is interrupted with Ctrl-C.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <spdlog/spdlog.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <thread>

#include "commands.h"
#include "spes/ckpt/shard.h"
#include "spes/config/config.h"
#include "spes/coord/cluster.h"
#include "spes/coord/coordinator.h"
#include "spes/data/prepare.h"
#include "spes/model/size.h"
#include "spes/sync/traffic.h"
#include "spes/util/error.h"
#include "spes/util/fs.h"
#include "spes/util/log.h"
#include "spes/util/process.h"
#include "spes/util/progress.h"
#include "spes/util/signals.h"

namespace spes::cli {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

struct Child {
  std::string name;
  int pid = 0;
  fs::path log;
  bool running = true;
  int exit_code = 0;  // 128 + signal when killed
};

std::pair<std::string, int> split_address(const std::string& address) {
  auto colon = address.rfind(':');
  return {address.substr(0, colon), std::stoi(address.substr(colon + 1))};
}

// Free means nothing listens there. Connections of a run that just ended (TIME_WAIT) do not
// count: SO_REUSEADDR, as gRPC sets on its own listeners, lets the services bind past them.
bool port_free(int port) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  const int one = 1;
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(static_cast<std::uint16_t>(port));
  const bool ok = ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0;
  ::close(fd);
  return ok;
}

// Every address must be this machine's loopback, and free, before anything starts.
void check_addresses(const ClusterConfig& c) {
  if (c.coordinator.address.empty())
    raise(ErrorKind::Config, "{}: launch-local needs coordinator.address (e.g. 127.0.0.1:7000)", c.where("coordinator"));
  auto check_port = [&](const std::string& who, int port) {
    if (port != 0 && !port_free(port))
      raise(ErrorKind::Io, "port {} ({} in {}) is in use: stop what holds it or pick another port; nothing was started",
            port, who, c.source);
  };
  std::vector<std::pair<std::string, std::string>> services{{"the coordinator", c.coordinator.address}};
  for (const auto& n : c.nodes) services.emplace_back("node " + std::to_string(n.id), n.address);
  for (const auto& [who, address] : services) {
    auto [host, port] = split_address(address);
    if (host != "127.0.0.1" && host != "localhost")
      raise(ErrorKind::Config, "{}: {} is at {}: launch-local runs every process on 127.0.0.1", c.source, who, address);
    check_port(who, port);
  }
  // The optional HTTP endpoints: any host (a scraper may be elsewhere), a free port (0 = any).
  std::vector<std::pair<std::string, std::string>> http{{"the coordinator's metrics", c.coordinator.metrics},
                                                         {"the coordinator's live page", c.coordinator.http}};
  for (const auto& n : c.nodes) http.emplace_back("node " + std::to_string(n.id) + "'s metrics", n.metrics);
  for (const auto& [who, address] : http)
    if (!address.empty()) check_port(who, split_address(address).second);
}

// A fresh random token in token_file when the cluster names one that does not exist yet.
void ensure_token(const ClusterConfig& c) {
  if (!c.token.empty() || fs::exists(c.token_file)) return;
  std::random_device rd;
  std::string token;
  for (int i = 0; i < 32; ++i) token += "0123456789abcdef"[rd() % 16];
  if (fs::path(c.token_file).has_parent_path()) ensure_directory(fs::path(c.token_file).parent_path());
  write_file_atomic(c.token_file, token + "\n");
  ::chmod(c.token_file.c_str(), 0600);
  spdlog::info("wrote a new run token to {}", c.token_file);
}

void reap(std::vector<Child>& children) {
  for (auto& ch : children) {
    if (!ch.running) continue;
    int status = 0;
    if (::waitpid(ch.pid, &status, WNOHANG) == ch.pid) {
      ch.running = false;
      ch.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    }
  }
}

// The launcher's children: the coordinator first, then the nodes in cluster order.
constexpr std::size_t kCoordinator = 0;
constexpr std::size_t kFirstNode = 1;
constexpr std::size_t kAll = std::numeric_limits<std::size_t>::max();

// Whether any child with index in [first, last) is still running.
bool any_running(const std::vector<Child>& children, std::size_t first = 0, std::size_t last = kAll) {
  for (std::size_t i = first; i < std::min(last, children.size()); ++i)
    if (children[i].running) return true;
  return false;
}

// SIGTERM (each finishes its step and leaves its round), then SIGKILL after `patience_s`; only
// the children with index in [first, last).
void stop_all(std::vector<Child>& children, double patience_s, std::size_t first = 0, std::size_t last = kAll) {
  last = std::min(last, children.size());
  for (std::size_t i = first; i < last; ++i)
    if (children[i].running) ::kill(children[i].pid, SIGTERM);
  const auto give_up = Clock::now() + std::chrono::milliseconds(static_cast<std::int64_t>(patience_s * 1000));
  while (any_running(children, first, last) && Clock::now() < give_up) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    reap(children);
  }
  for (std::size_t i = first; i < last; ++i)
    if (auto& ch = children[i]; ch.running) {
      spdlog::warn("{} (pid {}) did not stop in {:.0f} s: killing it", ch.name, ch.pid, patience_s);
      ::kill(ch.pid, SIGKILL);
      int status = 0;
      ::waitpid(ch.pid, &status, 0);
      ch.running = false;
      ch.exit_code = 128 + SIGKILL;
    }
}

std::string tail(const fs::path& path, std::size_t lines) {
  std::ifstream in(path);
  std::vector<std::string> all;
  for (std::string line; std::getline(in, line);) all.push_back(line);
  std::string out;
  for (std::size_t i = all.size() > lines ? all.size() - lines : 0; i < all.size(); ++i) out += "    " + all[i] + "\n";
  return out;
}

// The progress block: a header, one line per node, the cluster's totals.
std::vector<std::string> progress_lines(CoordinatorClient& client, const Config& base, double elapsed) {
  std::vector<std::string> lines;
  try {
    ClusterStatus s = client.status(2.0);
    lines.push_back(fmt::format("[{}] round {}, plan {}", format_duration(elapsed), s.round, s.plan.version));
    double tokens_per_s = 0;
    std::uint64_t bytes_in = 0;
    int alive = 0;
    for (const auto& n : s.nodes) {
      const auto& p = n.progress;
      const char* state = !n.member ? "out" : p.done ? "done" : n.alive ? "alive" : n.silent_s < 0 ? "starting" : "dead";
      lines.push_back(fmt::format("  node {} | step {:>5}/{} | loss {:7.4f} | round {:>3} | last round in {:>10} | total in "
                                  "{:>10} | {:>8} tok/s | {}", n.id, p.step, base.train.steps, p.loss, p.round,
                                  format_bytes(static_cast<double>(p.last_sync_bytes_in)),
                                  format_bytes(static_cast<double>(p.bytes_in_total)), format_count(p.tokens_per_s), state));
      if (n.alive && !p.done) {
        ++alive;
        tokens_per_s += p.tokens_per_s;
      }
      bytes_in += p.bytes_in_total;
    }
    lines.push_back(fmt::format("  cluster | {} of {} nodes training | {} tok/s | {} received in all", alive, s.nodes.size(),
                                format_count(tokens_per_s), format_bytes(static_cast<double>(bytes_in))));
  } catch (const Error& e) {
    lines.push_back(fmt::format("[{}] coordinator not answering: {}", format_duration(elapsed), e.what()));
  }
  return lines;
}

// Prints progress blocks: on a terminal each block replaces the last one in place (ANSI cursor
// movement); elsewhere (a pipe, a log file) blocks follow each other as plain lines.
class ProgressView {
 public:
  ProgressView() {
    const char* term = std::getenv("TERM");
    live_ = ::isatty(STDOUT_FILENO) && term && std::string(term) != "dumb";
  }
  bool live() const { return live_; }
  void show(const std::vector<std::string>& lines) {
    if (live_ && drawn_ > 0) std::printf("\x1b[%dA\x1b[J", drawn_);  // back to the block's first line, clear below
    for (const auto& line : lines) std::printf("%s\n", line.c_str());
    drawn_ = static_cast<int>(lines.size());
    std::fflush(stdout);
  }

 private:
  bool live_ = false;
  int drawn_ = 0;
};

struct NodeSummary {
  int id = 0;
  double val_loss = 0, tokens_per_s = 0;
  double goodput = -1;  // time in training steps / wall time (-1: not reported)
  std::int64_t peak_rss = 0, steps = 0;
  std::map<std::uint64_t, std::uint64_t> bytes_in;  // round → bytes
};

NodeSummary read_node_metrics(int id, const fs::path& path) {
  NodeSummary s;
  s.id = id;
  std::ifstream in(path);
  if (!in) raise(ErrorKind::Io, "node {} wrote no metrics file at {}", id, path.string());
  double tps_sum = 0;
  for (std::string line; std::getline(in, line);) {
    if (line.empty()) continue;
    auto j = nlohmann::json::parse(line, nullptr, false);
    if (j.is_discarded()) continue;
    const std::string type = j.value("type", "");
    if (type == "train") {
      ++s.steps;
      tps_sum += j.value("tokens_per_s", 0.0);
      s.peak_rss = std::max<std::int64_t>(s.peak_rss, j.value("peak_rss", std::int64_t{0}));
    } else if (type == "eval") {
      s.val_loss = j.value("val_loss", 0.0);
    } else if (type == "sync") {
      s.bytes_in[j.value("round", std::uint64_t{0})] += j.value("bytes_in", std::uint64_t{0});
    } else if (type == "goodput") {
      s.goodput = j.value("ratio", -1.0);
    }
  }
  s.tokens_per_s = s.steps > 0 ? tps_sum / static_cast<double>(s.steps) : 0;
  return s;
}

void print_summary(const ClusterConfig& c, const Config& base, const std::vector<NodeSummary>& nodes, double seconds) {
  const int N = static_cast<int>(nodes.size()), E = static_cast<int>(base.model.n_experts);
  const ParamCounts all = count_params(base.model, E);
  // Training state: fp32 weights of the whole model + grads and two AdamW moments of what it
  // trains; shown for the node with the most experts under the initial assignment.
  int most = 0;
  for (const auto& experts : assign_experts(c, E)) most = std::max(most, static_cast<int>(experts.size()));
  const ParamCounts mine = count_params(base.model, most);
  const double node_state = 4.0 * static_cast<double>(mine.total) + 12.0 * static_cast<double>(mine.trainable);
  const double whole_state = 16.0 * static_cast<double>(all.total);
  std::map<std::uint64_t, std::uint64_t> per_round;
  double tps = 0;
  std::printf("\n== run '%s': %d nodes, %lld steps, done in %s ==\n", c.run.c_str(), N,
              static_cast<long long>(base.train.steps), format_duration(seconds).c_str());
  std::printf("%-5s %10s %10s %12s %12s %9s\n", "node", "val loss", "tok/s", "peak RSS", "bytes in", "goodput");
  for (const auto& n : nodes) {
    std::uint64_t in = 0;
    for (const auto& [round, b] : n.bytes_in) {
      per_round[round] += b;
      in += b;
    }
    tps += n.tokens_per_s;
    const std::string goodput = n.goodput < 0 ? "-" : fmt::format("{:.1f}%", 100 * n.goodput);
    std::printf("%-5d %10.4f %10s %12s %12s %9s\n", n.id, n.val_loss, format_count(n.tokens_per_s).c_str(),
                format_bytes(static_cast<double>(n.peak_rss)).c_str(), format_bytes(static_cast<double>(in)).c_str(),
                goodput.c_str());
  }
  std::printf("cluster: %s tok/s in all\n", format_count(tps).c_str());
  std::printf("memory: training state per node %s (weights + grads and AdamW moments of %d of %d experts) vs %s to "
              "train the whole model: %.2f×\n", format_bytes(node_state).c_str(), most, E,
              format_bytes(whole_state).c_str(), node_state / whole_state);
  const Traffic ref = reference_star_traffic(static_cast<double>(all.shared),
                                             static_cast<double>(all.one_expert * base.model.n_layers), N, E);
  if (!per_round.empty()) {
    double sum = 0;
    std::uint64_t last = 0;
    for (const auto& [round, b] : per_round) {
      sum += static_cast<double>(b);
      last = b;
    }
    const double mean = sum / static_cast<double>(per_round.size());
    std::printf("bytes per round (all nodes, received): mean %s over %zu rounds, last %s; reference star protocol "
                "%s: %.3f× (last round %.3f×)\n", format_bytes(mean).c_str(), per_round.size(),
                format_bytes(static_cast<double>(last)).c_str(), format_bytes(ref.total).c_str(), mean / ref.total,
                static_cast<double>(last) / ref.total);
  }
}

// --resume: every node needs a complete shard in its checkpoint folder (it resumes from the
// newest that verifies); names each node's newest. Nothing has been started yet.
void check_resumable(const ClusterConfig& cluster, const PlanFiles& plan) {
  for (std::size_t i = 0; i < cluster.nodes.size(); ++i) {
    const Config c = load_config(plan.node_configs[i]);
    const std::string dir = c.checkpoint.effective_dir(c.run);
    const auto shards = list_shards(dir);
    if (shards.empty())
      raise(ErrorKind::Checkpoint, "--resume: node {} has no checkpoint shard in {}, so there is nothing to resume "
            "(without --resume the run starts afresh); nothing was started", cluster.nodes[i].id, dir);
    spdlog::info("node {} resumes from its newest shard that verifies (newest: {}/{})", cluster.nodes[i].id, dir,
                 shards.back());
  }
}

void run_launch(const std::string& cluster_path, double refresh_s, bool plot, bool resume, double stop_timeout_s) {
  install_stop_signals();
  init_logging("info");
  ClusterConfig cluster = load_cluster(cluster_path);
  check_addresses(cluster);
  ensure_token(cluster);
  Config base = load_base_config(cluster);
  prepare_data(base);  // once, before the nodes start: they would race on the same files
  const std::string plan_dir = cluster.out_dir + "/plan";
  PlanFiles plan = write_plan(cluster, plan_dir);
  std::printf("%s", read_file(plan.assignment_table).c_str());
  if (resume) {
    check_resumable(cluster, plan);
    // The coordinator keeps its plans; each node rejoins at its shard's round (one behind the
    // run's latest round catches up from the others).
    if (!fs::exists(cluster.state_path()))
      spdlog::info("no coordinator state at {}: the coordinator starts afresh", cluster.state_path());
  } else if (fs::exists(cluster.state_path())) {
    fs::remove(cluster.state_path());
    spdlog::info("removed the previous coordinator state {}: this launch starts the run afresh", cluster.state_path());
  }

  const std::string exe = self_executable().string();
  std::vector<Child> children;
  auto start = [&](const std::string& name, std::vector<std::string> args, const fs::path& log) {
    ensure_directory(log.parent_path());
    args.insert(args.begin(), exe);
    Child ch{name, spawn_logged(args, log), log};
    spdlog::info("started {} (pid {}), log {}", name, ch.pid, log.string());
    children.push_back(ch);
  };
  const auto t0 = Clock::now();
  try {
    start("coordinator", {"coordinator", "serve", "--cluster", cluster_path, "--exit-when-done"},
          cluster.out_dir + "/coordinator/console.log");
    CoordinatorClient client(cluster);
    client.status(20.0);  // the coordinator is up
    if (!cluster.coordinator.http.empty())
      spdlog::info("live page: http://{}/?token=$(cat {})", cluster.coordinator.http,
                   cluster.token_file.empty() ? "<the run token>" : cluster.token_file);
    for (std::size_t i = 0; i < cluster.nodes.size(); ++i) {
      std::vector<std::string> args{"node", "--config", plan.node_configs[i]};
      if (resume) args.push_back("--resume");
      start("node " + std::to_string(cluster.nodes[i].id), args,
            cluster.out_dir + "/node" + std::to_string(cluster.nodes[i].id) + "/console.log");
    }

    ProgressView view;
    // On a terminal the block updates in place every second; in a log every refresh_s.
    const double every_s = view.live() ? std::min(refresh_s, 1.0) : refresh_s;
    auto next_print = Clock::now();
    while (any_running(children, kFirstNode)) {
      if (stop_requested()) break;
      for (std::size_t i = kFirstNode; i < children.size(); ++i)
        if (!children[i].running && children[i].exit_code != 0)
          raise(ErrorKind::Internal, "{} failed (exit {}); the end of {}:\n{}", children[i].name, children[i].exit_code,
                children[i].log.string(), tail(children[i].log, 15));
      if (Clock::now() >= next_print) {
        view.show(progress_lines(client, base, std::chrono::duration<double>(Clock::now() - t0).count()));
        next_print = Clock::now() + std::chrono::milliseconds(static_cast<std::int64_t>(every_s * 1000));
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
      reap(children);
    }
  } catch (...) {
    stop_all(children, 30);
    throw;
  }
  if (stop_requested()) {
    // The coordinator first: one still running would hand the experts of a node that stopped
    // early to a node still finishing its step (after grace_s), and --resume would find that plan.
    // Then the nodes: each finishes its step (and a round in progress) and writes its shard.
    std::printf("\ninterrupted: stopping the coordinator, then %zu nodes (each finishes its step and writes a "
                "checkpoint shard; up to %.0f s)\n", children.size() - 1, stop_timeout_s);
    std::fflush(stdout);
    stop_all(children, 10, kCoordinator, kFirstNode);
    stop_all(children, stop_timeout_s, kFirstNode);
    raise(ErrorKind::Usage, "launch-local interrupted by signal {}; every process it started has exited; continue "
          "with: spes launch-local {} --resume", stop_signal(), cluster_path);
  }
  // The coordinator leaves by itself once every member reported done.
  const auto give_up = Clock::now() + std::chrono::seconds(10);
  while (children[kCoordinator].running && Clock::now() < give_up) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    reap(children);
  }
  stop_all(children, 10);
  for (std::size_t i = kFirstNode; i < children.size(); ++i)
    if (children[i].exit_code != 0)
      raise(ErrorKind::Internal, "{} failed (exit {}); the end of {}:\n{}", children[i].name, children[i].exit_code,
            children[i].log.string(), tail(children[i].log, 15));

  std::vector<NodeSummary> summaries;
  std::vector<std::string> plot_args{"bash", "scripts/plot_loss.sh"};
  for (const auto& n : cluster.nodes) {
    const std::string metrics = cluster.out_dir + "/node" + std::to_string(n.id) + "/metrics.jsonl";
    summaries.push_back(read_node_metrics(n.id, metrics));
    plot_args.push_back(metrics);
  }
  print_summary(cluster, base, summaries, std::chrono::duration<double>(Clock::now() - t0).count());
  if (plot) {
    const std::string png = cluster.out_dir + "/loss.png";
    plot_args.push_back(png);
    if (!fs::exists("scripts/plot_loss.sh")) {
      std::printf("no loss plot: scripts/plot_loss.sh is not here (run from the spes checkout)\n");
    } else if (CommandResult r = run_command(plot_args); r.exit_status != 0) {
      std::printf("the loss plot failed:\n%s", r.output.c_str());
    } else {
      std::printf("loss curves: %s\n", png.c_str());
    }
  }
}

}  // namespace

void add_launch_command(CLI::App& app) {
  auto* launch = app.add_subcommand("launch-local", "run a whole cluster on this machine: coordinator + every node on 127.0.0.1");
  auto cluster = std::make_shared<std::string>();
  auto refresh = std::make_shared<double>(15.0);
  auto no_plot = std::make_shared<bool>(false);
  launch->add_option("cluster", *cluster, "cluster file (YAML), e.g. configs/cluster-local.yaml")->required();
  launch->add_option("--refresh", *refresh, "seconds between progress blocks when the output is not a terminal (on one, the block updates in place every second)")->check(CLI::PositiveNumber);
  launch->add_flag("--no-plot", *no_plot, "do not write the loss plot");
  auto resume = std::make_shared<bool>(false);
  auto stop_timeout = std::make_shared<double>(120.0);
  launch->add_flag("--resume", *resume, "continue a stopped run: every node from its newest checkpoint shard that "
                   "verifies, the coordinator from its state");
  launch->add_option("--stop-timeout", *stop_timeout, "on Ctrl-C, seconds each node gets to finish its step and write "
                     "its shard before it is killed (default 120)")->check(CLI::PositiveNumber);
  launch->callback([cluster, refresh, no_plot, resume, stop_timeout] {
    run_launch(*cluster, *refresh, !*no_plot, *resume, *stop_timeout);
  });
}

}  // namespace spes::cli
