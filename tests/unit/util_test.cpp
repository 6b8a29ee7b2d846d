#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <optional>
#include <thread>

#include <arpa/inet.h>
#include <sys/socket.h>
#include <unistd.h>

#include "spes/util/log.h"
#include "spes/util/error.h"
#include "spes/util/metrics_server.h"
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

TEST(Fs, FileLockLetsOneHolderInAtATime) {
  auto p = std::filesystem::temp_directory_path() / ("spes-lock-" + std::to_string(::getpid()));
  std::atomic<int> order{0};
  int second_got_it_at = -1;
  bool second_waited = false;
  std::optional<FileLock> first(std::in_place, p);
  std::thread second([&] {
    FileLock again(p, [&] { second_waited = true; });
    second_got_it_at = order.fetch_add(1);
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  order.fetch_add(1);  // 0 -> 1 while the first still holds it
  first.reset();
  second.join();
  EXPECT_TRUE(second_waited);
  EXPECT_EQ(second_got_it_at, 1);  // only after the first let go
  std::filesystem::remove(p);
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

// GET /metrics from 127.0.0.1:port over a plain socket: the body as a scraper gets it.
std::string http_get_metrics(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<std::uint16_t>(port));
  ::inet_pton(AF_INET, "127.0.0.1", &addr.sin_addr);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    ::close(fd);
    return "";
  }
  const std::string request = "GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n";
  (void)!::write(fd, request.data(), request.size());
  std::string response;
  char buffer[4096];
  for (ssize_t n; (n = ::read(fd, buffer, sizeof buffer)) > 0;) response.append(buffer, static_cast<std::size_t>(n));
  ::close(fd);
  return response;
}

TEST(MetricsServer, ServesGaugesCountersAndCollectorsInTheTextFormat) {
  MetricsServer server("127.0.0.1:0", {{"run", "r1"}});
  const int port = std::stoi(server.address().substr(server.address().rfind(':') + 1));
  ASSERT_GT(port, 0);
  server.set_gauge("spes_test_loss", "a loss", 2.5, {{"node", "3"}});
  server.set_counter("spes_test_bytes_total", "bytes", 1024, {{"peer", "1"}});
  server.set_counter("spes_test_bytes_total", "bytes", 4096, {{"peer", "1"}});  // the newest total wins
  int scrapes = 0;
  server.add_collector([&](MetricsSink& sink) { sink.gauge("spes_test_scrapes", "scrapes", ++scrapes); });
  const std::string body = http_get_metrics(port);
  EXPECT_NE(body.find("# TYPE spes_test_loss gauge"), std::string::npos) << body;
  EXPECT_NE(body.find("spes_test_loss{node=\"3\",run=\"r1\"} 2.5"), std::string::npos) << body;
  EXPECT_NE(body.find("# TYPE spes_test_bytes_total counter"), std::string::npos) << body;
  EXPECT_NE(body.find("spes_test_bytes_total{peer=\"1\",run=\"r1\"} 4096"), std::string::npos) << body;
  EXPECT_NE(body.find("spes_test_scrapes{run=\"r1\"} 1"), std::string::npos) << body;
  EXPECT_NE(http_get_metrics(port).find("spes_test_scrapes{run=\"r1\"} 2"), std::string::npos);
}

TEST(MetricsServer, APortInUseIsAnIoErrorNamingTheAddress) {
  MetricsServer first("127.0.0.1:0", {});
  try {
    MetricsServer second(first.address(), {});
    FAIL() << "bound twice";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::Io);
    EXPECT_NE(std::string(e.what()).find(first.address()), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace spes

namespace spes {
namespace {
TEST(Log, PeerTextIsMadePrintableAndCut) {
  EXPECT_EQ(printable("round 3 is gone"), "round 3 is gone");
  EXPECT_EQ(printable(std::string("a\x01\nb\x1b[31m\xff", 10)), "a??b?[31m?");
  EXPECT_EQ(printable(std::string(300, 'x'), 10), std::string(10, 'x') + "...");
}
}  // namespace
}  // namespace spes
