// File helpers: whole-file reads, atomic writes (temp file, fsync, rename — never a
// half-written file), and read-only memory maps. All throw Error(Io) naming the path.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

namespace spes {

std::string read_file(const std::filesystem::path& path);
// Writes `data` to path.tmp, fsyncs it, renames it over `path` and fsyncs the directory.
void write_file_atomic(const std::filesystem::path& path, std::string_view data);
void ensure_directory(const std::filesystem::path& path);
// Renames a file or folder (same filesystem) and fsyncs the parent, so the rename survives a crash.
void rename_durably(const std::filesystem::path& from, const std::filesystem::path& to);

// Builds a folder under a hidden temporary sibling name (`fill` writes into it), then renames it
// to `target`, fsyncing the parent: a crash or an error leaves the whole folder or none (the
// temporary one is removed on error). Error(Io) when `target` exists already.
void write_folder_atomic(const std::filesystem::path& target,
                         const std::function<void(const std::filesystem::path& tmp)>& fill);
// Removes the temporary folders in `dir` that write_folder_atomic left behind in a process that
// no longer runs (killed mid-write: ".NAME.tmp-PID"); returns their names.
std::vector<std::string> remove_abandoned_temporaries(const std::filesystem::path& dir);

// An exclusive advisory lock (flock) on `path`, created if missing, held until destruction: one
// process at a time (e.g. preparing a data folder that several nodes on one machine share).
// `waiting` is called once if another process holds it, before this one blocks for it.
class FileLock {
 public:
  explicit FileLock(const std::filesystem::path& path, const std::function<void()>& waiting = {});
  ~FileLock();
  FileLock(const FileLock&) = delete;
  FileLock& operator=(const FileLock&) = delete;

 private:
  int fd_ = -1;
};

// A read-only memory map of a whole file. Movable, not copyable. Thread-safe for reads.
class MappedFile {
 public:
  MappedFile() = default;
  explicit MappedFile(const std::filesystem::path& path);
  ~MappedFile();
  MappedFile(MappedFile&& other) noexcept;
  MappedFile& operator=(MappedFile&& other) noexcept;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const std::uint8_t* data() const { return data_; }
  std::size_t size() const { return size_; }
  const std::filesystem::path& path() const { return path_; }

 private:
  void reset();
  std::filesystem::path path_;
  const std::uint8_t* data_ = nullptr;
  std::size_t size_ = 0;
};

}  // namespace spes
