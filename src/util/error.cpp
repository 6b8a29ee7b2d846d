#include "spes/util/error.h"

namespace spes {

const char* kind_name(ErrorKind kind) {
  switch (kind) {
    case ErrorKind::Usage: return "usage error";
    case ErrorKind::Config: return "config error";
    case ErrorKind::Data: return "data error";
    case ErrorKind::Checkpoint: return "checkpoint error";
    case ErrorKind::Peer: return "peer error";
    case ErrorKind::Io: return "I/O error";
    case ErrorKind::Internal: return "internal error";
  }
  return "error";
}

int exit_code(ErrorKind kind) {
  switch (kind) {
    case ErrorKind::Usage: return 2;
    case ErrorKind::Config: return 3;
    case ErrorKind::Data: return 4;
    case ErrorKind::Checkpoint: return 5;
    case ErrorKind::Peer: return 6;
    case ErrorKind::Io: return 7;
    case ErrorKind::Internal: return 70;
  }
  return 1;
}

}  // namespace spes
