// Logging set-up. Code logs with spdlog's free functions (spdlog::info, ...); this sets
// the default logger to print to the terminal and, optionally, also to a file.
#pragma once

#include <cstdint>
#include <mutex>
#include <string>
#include <string_view>

namespace spes {

// level: trace|debug|info|warn|error. file: empty for terminal only.
// Throws Error(Usage) on an unknown level, Error(Io) when the file cannot be opened.
void init_logging(const std::string& level, const std::string& file = "");

// Text that came from the network (a peer's error message) made safe to log: control bytes and
// bytes outside printable ASCII become '?', and it is cut at max_chars.
std::string printable(std::string_view text, std::size_t max_chars = 200);

// Calls a service refused because the caller looked hostile or misconfigured (wrong token, run,
// node, arguments): each is logged as a warning with its reason, counted, and the last one kept
// (made printable) for status pages. Thread-safe.
class RefusalLog {
 public:
  // Logs "<who>: <why>" and counts it.
  void record(const std::string& who, const std::string& why);
  std::uint64_t count() const;
  std::string last() const;  // "" before the first

 private:
  mutable std::mutex mutex_;
  std::uint64_t count_ = 0;
  std::string last_;
};

}  // namespace spes
