// spes::Error — the one exception type library code throws on bad input.
//
// Every error has a kind (what part of the world was wrong) and a message that names the
// thing (file, key, peer) and says what to do. The CLI maps kinds to exit codes; the sync
// service will map them to gRPC status codes.
#pragma once

#include <fmt/format.h>

#include <stdexcept>
#include <string>

namespace spes {

enum class ErrorKind {
  Usage,       // bad command-line flags
  Config,      // bad YAML configuration
  Data,        // corpus, tokenizer or token shard problems
  Checkpoint,  // unreadable or mismatching checkpoints
  Peer,        // a network peer misbehaved
  Io,          // the operating system refused (files, sockets, processes)
  Internal,    // a bug in spes
};

const char* kind_name(ErrorKind kind);
// Exit code the CLI returns for an error of this kind (2 usage, 3 config, 4 data, ...).
int exit_code(ErrorKind kind);

class Error : public std::runtime_error {
 public:
  Error(ErrorKind kind, const std::string& message) : std::runtime_error(message), kind_(kind) {}
  ErrorKind kind() const { return kind_; }

 private:
  ErrorKind kind_;
};

template <typename... Args>
[[noreturn]] void raise(ErrorKind kind, fmt::format_string<Args...> format, Args&&... args) {
  throw Error(kind, fmt::format(format, std::forward<Args>(args)...));
}

}  // namespace spes

// Internal invariant check (not for user input): throws ErrorKind::Internal with the location.
#define SPES_CHECK(cond, msg)                                                              \
  do {                                                                                     \
    if (!(cond))                                                                           \
      ::spes::raise(::spes::ErrorKind::Internal, "internal check failed at {}:{}: {} ({})", \
                    __FILE__, __LINE__, #cond, msg);                                       \
  } while (0)
