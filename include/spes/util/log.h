// Logging set-up. Code logs with spdlog's free functions (spdlog::info, ...); this sets
// the default logger to print to the terminal and, optionally, also to a file.
#pragma once

#include <string>

namespace spes {

// level: trace|debug|info|warn|error. file: empty for terminal only.
// Throws Error(Usage) on an unknown level, Error(Io) when the file cannot be opened.
void init_logging(const std::string& level, const std::string& file = "");

}  // namespace spes
