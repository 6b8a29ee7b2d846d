#include "spes/util/log.h"

#include <algorithm>

#include <spdlog/sinks/basic_file_sink.h>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include <vector>

#include "spes/util/error.h"

namespace spes {

void init_logging(const std::string& level, const std::string& file) {
  auto parsed = spdlog::level::from_str(level);
  if (parsed == spdlog::level::off && level != "off")
    raise(ErrorKind::Usage, "unknown log level '{}' (use trace, debug, info, warn or error)", level);
  std::vector<spdlog::sink_ptr> sinks;
  sinks.push_back(std::make_shared<spdlog::sinks::stderr_color_sink_mt>());
  if (!file.empty()) {
    try {
      sinks.push_back(std::make_shared<spdlog::sinks::basic_file_sink_mt>(file, false));
    } catch (const spdlog::spdlog_ex& e) {
      raise(ErrorKind::Io, "cannot open log file '{}': {}", file, e.what());
    }
  }
  auto logger = std::make_shared<spdlog::logger>("spes", sinks.begin(), sinks.end());
  logger->set_level(parsed);
  logger->set_pattern("%Y-%m-%d %H:%M:%S.%e %^%-5l%$ %v");
  logger->flush_on(spdlog::level::info);
  spdlog::set_default_logger(logger);
}

std::string printable(std::string_view text, std::size_t max_chars) {
  std::string out;
  out.reserve(std::min(text.size(), max_chars) + 3);
  for (const char c : text.substr(0, max_chars)) out += (c >= 0x20 && c < 0x7f) ? c : '?';
  if (text.size() > max_chars) out += "...";
  return out;
}

void RefusalLog::record(const std::string& who, const std::string& why) {
  const std::string text = printable(who + ": " + why, 300);
  spdlog::warn("{}", text);
  std::lock_guard lock(mutex_);
  ++count_;
  last_ = text;
}

std::uint64_t RefusalLog::count() const {
  std::lock_guard lock(mutex_);
  return count_;
}

std::string RefusalLog::last() const {
  std::lock_guard lock(mutex_);
  return last_;
}

}  // namespace spes
