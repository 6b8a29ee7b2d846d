#include <gtest/gtest.h>

#include <filesystem>

#include "spes/util/error.h"
#include "spes/util/fs.h"
#include "spes/util/process.h"
#include "spes/util/progress.h"

namespace spes {
namespace {

TEST(Progress, Formats) {
  EXPECT_EQ(format_duration(45.2), "45s");
  EXPECT_EQ(format_duration(723), "12m03s");
  EXPECT_EQ(format_duration(7500), "2h05m");
  EXPECT_EQ(format_count(950), "950");
  EXPECT_EQ(format_count(12345), "12.3k");
  EXPECT_EQ(format_count(1.17e9), "1.17B");
  EXPECT_EQ(format_bytes(512), "512 B");
  EXPECT_EQ(format_bytes(3 * 1024 * 1024), "3.00 MiB");
}

TEST(Fs, AtomicWriteReplacesWholeFile) {
  auto p = std::filesystem::temp_directory_path() / ("spes-atomic-" + std::to_string(::getpid()));
  write_file_atomic(p, "first version, long");
  write_file_atomic(p, "second");
  EXPECT_EQ(read_file(p), "second");
  EXPECT_FALSE(std::filesystem::exists(p.string() + ".tmp"));
  MappedFile m(p);
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(m.data()), m.size()), "second");
  std::filesystem::remove(p);
  try {
    read_file(p);
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::Io);
    EXPECT_NE(std::string(e.what()).find(p.string()), std::string::npos);
  }
}

TEST(Process, RunsCommandsAndReportsExitStatus) {
  CommandResult ok = run_command({"sh", "-c", "echo hello; echo err >&2"});
  EXPECT_EQ(ok.exit_status, 0);
  EXPECT_NE(ok.output.find("hello"), std::string::npos);
  EXPECT_NE(ok.output.find("err"), std::string::npos);
  EXPECT_EQ(run_command({"sh", "-c", "exit 3"}).exit_status, 3);
  EXPECT_EQ(run_command({"definitely-not-a-program-xyz"}).exit_status, 127);
  EXPECT_TRUE(program_exists("sh"));
  EXPECT_FALSE(program_exists("definitely-not-a-program-xyz"));
  EXPECT_GT(peak_rss_bytes(), 0);
  EXPECT_GT(current_rss_bytes(), 0);
}

TEST(Error, KindsMapToDistinctExitCodes) {
  EXPECT_EQ(exit_code(ErrorKind::Usage), 2);
  EXPECT_EQ(exit_code(ErrorKind::Config), 3);
  EXPECT_EQ(exit_code(ErrorKind::Data), 4);
  EXPECT_STREQ(kind_name(ErrorKind::Config), "config error");
}

}  // namespace
}  // namespace spes
