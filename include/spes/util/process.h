// Process-level facts and child processes: resident memory, and running a helper program
// (bible, tar) without a shell, with its output captured.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

namespace spes {

// Peak resident set size of this process so far, in bytes (getrusage).
std::int64_t peak_rss_bytes();
// Current resident set size in bytes (/proc/self/statm).
std::int64_t current_rss_bytes();

struct CommandResult {
  int exit_status = -1;  // the child's exit code; 128+signal if it was killed
  std::string output;    // stdout and stderr together
};

// Runs argv[0] (looked up in PATH) with the given arguments in `cwd`, waits for it.
// Throws Error(Io) only when the program cannot be started at all.
CommandResult run_command(const std::vector<std::string>& argv,
                          const std::filesystem::path& cwd = {});

// Starts argv[0] (a path) in its own process group (so a terminal's Ctrl-C reaches only the
// caller, which decides how to stop it) with stdout and stderr appended to `log_path`.
// Returns the child's pid; Error(Io) when it cannot be started.
int spawn_logged(const std::vector<std::string>& argv, const std::filesystem::path& log_path);
// The path of the running executable (/proc/self/exe).
std::filesystem::path self_executable();

// Keeps freed memory in the heap instead of returning it to the kernel: a training step frees
// and reallocates the same large activation buffers every step, and with glibc's defaults each
// one is a fresh mmap whose pages the kernel zeroes again (a fifth of the step time on `small`).
// Peak RSS is unchanged; call once at start, before threads start.
void keep_freed_memory_for_reuse();

// True when `program` is found in PATH.
bool program_exists(const std::string& program);

}  // namespace spes
