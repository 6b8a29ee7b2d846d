#include "spes/util/fs.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <csignal>
#include <cerrno>
#include <regex>
#include <cstring>
#include <fstream>
#include <sstream>

#include "spes/util/error.h"

namespace spes {
namespace fs = std::filesystem;

std::string read_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) raise(ErrorKind::Io, "cannot open '{}': {}", path.string(), std::strerror(errno));
  std::ostringstream buffer;
  buffer << in.rdbuf();
  if (in.bad()) raise(ErrorKind::Io, "error while reading '{}'", path.string());
  return buffer.str();
}

namespace {
void fsync_path(const fs::path& path, int flags) {
  int fd = ::open(path.c_str(), flags);
  if (fd < 0) return;  // best effort for directories on filesystems that refuse O_RDONLY
  ::fsync(fd);
  ::close(fd);
}
}  // namespace

void write_file_atomic(const fs::path& path, std::string_view data) {
  fs::path tmp = path;
  tmp += ".tmp";
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) raise(ErrorKind::Io, "cannot create '{}': {}", tmp.string(), std::strerror(errno));
  std::size_t written = 0;
  while (written < data.size()) {
    ssize_t n = ::write(fd, data.data() + written, data.size() - written);
    if (n < 0) {
      if (errno == EINTR) continue;
      int err = errno;
      ::close(fd);
      ::unlink(tmp.c_str());
      raise(ErrorKind::Io, "cannot write '{}': {}", tmp.string(), std::strerror(err));
    }
    written += static_cast<std::size_t>(n);
  }
  if (::fsync(fd) != 0 || ::close(fd) != 0) {
    ::unlink(tmp.c_str());
    raise(ErrorKind::Io, "cannot flush '{}': {}", tmp.string(), std::strerror(errno));
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    int err = errno;
    ::unlink(tmp.c_str());
    raise(ErrorKind::Io, "cannot rename '{}' to '{}': {}", tmp.string(), path.string(),
          std::strerror(err));
  }
  fsync_path(path.has_parent_path() ? path.parent_path() : fs::path("."), O_RDONLY | O_DIRECTORY);
}

void rename_durably(const fs::path& from, const fs::path& to) {
  if (::rename(from.c_str(), to.c_str()) != 0)
    raise(ErrorKind::Io, "cannot rename '{}' to '{}': {}", from.string(), to.string(), std::strerror(errno));
  fsync_path(to.has_parent_path() ? to.parent_path() : fs::path("."), O_RDONLY | O_DIRECTORY);
}

void ensure_directory(const fs::path& path) {
  std::error_code ec;
  fs::create_directories(path, ec);
  if (ec) raise(ErrorKind::Io, "cannot create directory '{}': {}", path.string(), ec.message());
}

void write_folder_atomic(const fs::path& target, const std::function<void(const fs::path& tmp)>& fill) {
  if (fs::exists(target)) raise(ErrorKind::Io, "'{}' exists already: choose another folder or remove it", target.string());
  const fs::path parent = target.has_parent_path() ? target.parent_path() : fs::path(".");
  ensure_directory(parent);
  const fs::path tmp = parent / ("." + target.filename().string() + ".tmp-" + std::to_string(::getpid()));
  std::error_code ec;
  fs::remove_all(tmp, ec);
  ensure_directory(tmp);
  try {
    fill(tmp);
  } catch (...) {
    fs::remove_all(tmp, ec);
    throw;
  }
  rename_durably(tmp, target);
}

std::vector<std::string> remove_abandoned_temporaries(const fs::path& dir) {
  static const std::regex temporary(R"(\..+\.tmp-([0-9]+))");
  std::vector<std::string> removed;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    std::smatch m;
    if (!std::regex_match(name, m, temporary)) continue;
    const long pid = std::strtol(m[1].str().c_str(), nullptr, 10);
    // kill(pid, 0): ESRCH means no such process; anything else (alive, or not ours) keeps it.
    if (pid <= 0 || pid == ::getpid() || ::kill(static_cast<pid_t>(pid), 0) == 0 || errno != ESRCH) continue;
    std::error_code rm;
    fs::remove_all(entry.path(), rm);
    if (!rm) removed.push_back(name);
  }
  return removed;
}

MappedFile::MappedFile(const fs::path& path) : path_(path) {
  int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) raise(ErrorKind::Io, "cannot open '{}': {}", path.string(), std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    int err = errno;
    ::close(fd);
    raise(ErrorKind::Io, "cannot stat '{}': {}", path.string(), std::strerror(err));
  }
  size_ = static_cast<std::size_t>(st.st_size);
  if (size_ > 0) {
    void* p = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      int err = errno;
      ::close(fd);
      raise(ErrorKind::Io, "cannot map '{}': {}", path.string(), std::strerror(err));
    }
    data_ = static_cast<const std::uint8_t*>(p);
  }
  ::close(fd);
}

MappedFile::~MappedFile() { reset(); }

MappedFile::MappedFile(MappedFile&& other) noexcept
    : path_(std::move(other.path_)), data_(other.data_), size_(other.size_) {
  other.data_ = nullptr;
  other.size_ = 0;
}

MappedFile& MappedFile::operator=(MappedFile&& other) noexcept {
  if (this != &other) {
    reset();
    path_ = std::move(other.path_);
    data_ = other.data_;
    size_ = other.size_;
    other.data_ = nullptr;
    other.size_ = 0;
  }
  return *this;
}

void MappedFile::reset() {
  if (data_ != nullptr) ::munmap(const_cast<std::uint8_t*>(data_), size_);
  data_ = nullptr;
  size_ = 0;
}

FileLock::FileLock(const fs::path& path, const std::function<void()>& waiting) {
  fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd_ < 0) raise(ErrorKind::Io, "cannot open the lock file '{}': {}", path.string(), std::strerror(errno));
  if (::flock(fd_, LOCK_EX | LOCK_NB) == 0) return;
  if (waiting) waiting();
  while (::flock(fd_, LOCK_EX) != 0) {
    if (errno == EINTR) continue;
    const int err = errno;
    ::close(fd_);
    raise(ErrorKind::Io, "cannot lock '{}': {}", path.string(), std::strerror(err));
  }
}

FileLock::~FileLock() {
  if (fd_ >= 0) ::close(fd_);  // closing releases the lock
}

}  // namespace spes
