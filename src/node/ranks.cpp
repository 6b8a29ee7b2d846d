#include "spes/node/ranks.h"

#include <spdlog/spdlog.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstring>
#include <optional>
#include <thread>

#include "spes/dist/node_group.h"
#include "spes/dist/rank_context.h"
#include "spes/util/error.h"
#include "spes/util/signals.h"

extern char** environ;

namespace spes {

namespace {

using Clock = std::chrono::steady_clock;

// How long the other ranks get to stop by themselves after one failed, before SIGKILL (they may
// sit in a collective waiting for the dead rank).
constexpr std::chrono::seconds kStopGrace{5};

struct Rank {
  pid_t pid = -1;
  bool running = false;
  int status = 0;  // exit code, or 128 + signal
};

std::string exit_text(int raw_status) {
  if (WIFSIGNALED(raw_status)) return fmt::format("was killed by signal {} ({})", WTERMSIG(raw_status), strsignal(WTERMSIG(raw_status)));
  return fmt::format("exited with status {}", WEXITSTATUS(raw_status));
}

// fork + execve with everything allocated before the fork (the parent has threads).
pid_t start_rank(const std::vector<std::string>& argv, const RankContext& context) {
  std::vector<std::string> env_strings;
  for (char** e = environ; *e; ++e)
    if (std::strncmp(*e, "SPES_NODE_", 10) != 0) env_strings.emplace_back(*e);
  for (auto& entry : context.environment()) env_strings.push_back(entry);
  std::vector<char*> args, env;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  for (const auto& e : env_strings) env.push_back(const_cast<char*>(e.c_str()));
  env.push_back(nullptr);
  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  if (pid < 0) raise(ErrorKind::Io, "cannot start {} of the node: fork failed: {}", context.describe(), std::strerror(errno));
  if (pid == 0) {
    ::setpgid(0, 0);                       // terminal signals reach the launcher only; it forwards them once
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);    // no orphaned rank if the launcher dies
    if (::getppid() != parent) ::_exit(1);  // it died before prctl
    ::execve(args[0], args.data(), env.data());
    ::_exit(127);
  }
  return pid;
}

}  // namespace

void run_node_ranks(const std::vector<std::string>& argv, const Config& config) {
  const int n = config.node.ranks;
  RendezvousServer store(config.node.timeout_s);
  std::vector<Rank> ranks(static_cast<std::size_t>(n));
  std::string pids;
  for (int r = 0; r < n; ++r) {
    RankContext context{r, n, "127.0.0.1", store.port()};
    ranks[static_cast<std::size_t>(r)] = {start_rank(argv, context), true, 0};
    pids += (r ? "," : "") + std::to_string(ranks[static_cast<std::size_t>(r)].pid);
  }
  spdlog::info("node {}: started {} ranks (pids {}), rendezvous 127.0.0.1:{}; rank 0 logs to {}/node.log",
               config.run.node_id, n, pids, store.port(), config.run.out_dir);

  auto signal_running = [&](int sig) {
    for (auto& r : ranks)
      if (r.running) ::kill(r.pid, sig);
  };
  int running = n;
  bool forwarded = false;
  std::optional<int> failed;  // the first rank that failed
  std::optional<Clock::time_point> kill_at;
  while (running > 0) {
    int raw = 0;
    const pid_t pid = ::waitpid(-1, &raw, WNOHANG);
    if (pid > 0) {
      for (int r = 0; r < n; ++r) {
        Rank& rank = ranks[static_cast<std::size_t>(r)];
        if (rank.pid != pid || !rank.running) continue;
        rank.running = false;
        --running;
        rank.status = WIFSIGNALED(raw) ? 128 + WTERMSIG(raw) : WEXITSTATUS(raw);
        if (rank.status != 0 && !failed) {
          failed = r;
          spdlog::error("node {}: rank {} (pid {}) {}: stopping the node's other {} rank(s)", config.run.node_id, r,
                        pid, exit_text(raw), running);
          signal_running(SIGTERM);
          kill_at = Clock::now() + kStopGrace;
        }
      }
      continue;
    }
    if (pid < 0 && errno != EINTR && errno != ECHILD) break;
    if (stop_requested() && !forwarded) {
      forwarded = true;
      spdlog::info("node {}: stopping its ranks (signal {}): they finish the step together, rank 0 writes a shard",
                   config.run.node_id, stop_signal());
      signal_running(SIGTERM);
    }
    if (kill_at && Clock::now() >= *kill_at) {
      signal_running(SIGKILL);
      kill_at.reset();
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  if (failed) {
    const Rank& r = ranks[static_cast<std::size_t>(*failed)];
    raise(ErrorKind::Peer, "node {}: rank {} of {} (pid {}) failed with status {}{}; the node's other ranks were "
          "stopped. Its log: {}; restart the node with --resume", config.run.node_id, *failed, n, r.pid, r.status,
          r.status > 128 ? fmt::format(" (signal {})", r.status - 128) : "",
          *failed == 0 ? config.run.out_dir + "/node.log" : fmt::format("{}/rank{}.log", config.run.out_dir, *failed));
  }
  spdlog::info("node {}: all {} ranks finished", config.run.node_id, n);
}

}  // namespace spes
