// Prometheus metrics over HTTP (text format at /metrics, served by prometheus-cpp's Exposer)
// for a long-running daemon: `spes node` and `spes coordinator serve` at metrics.listen.
// Values are set where they are known (set_gauge, set_counter) or read at scrape time from
// collectors; the same figures stay in the JSONL metrics. prometheus-cpp stays in the .cpp.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>

namespace spes {

using MetricLabels = std::map<std::string, std::string>;

// What a collector writes at scrape time.
class MetricsSink {
 public:
  virtual ~MetricsSink() = default;
  virtual void gauge(const std::string& name, const std::string& help, double value, const MetricLabels& labels = {}) = 0;
  virtual void counter(const std::string& name, const std::string& help, double total, const MetricLabels& labels = {}) = 0;
};

class MetricsServer {
 public:
  // Serves on `listen` (host:port; port 0 picks a free one). `constant_labels` go on every sample
  // (e.g. run and node). Error(Io) naming the address when it cannot bind.
  MetricsServer(const std::string& listen, MetricLabels constant_labels);
  ~MetricsServer();
  MetricsServer(const MetricsServer&) = delete;
  MetricsServer& operator=(const MetricsServer&) = delete;

  // host:port it listens on (the real port when 0 was asked for).
  std::string address() const;
  // A gauge: the value now.
  void set_gauge(const std::string& name, const std::string& help, double value, const MetricLabels& labels = {});
  // A counter from a running total kept by the caller (names end in _total; it never goes down).
  void set_counter(const std::string& name, const std::string& help, double total, const MetricLabels& labels = {});
  // Called on every scrape, after the values above are taken.
  void add_collector(std::function<void(MetricsSink&)> collector);

 private:
  struct Impl;
  std::shared_ptr<Impl> impl_;
  struct Http;
  std::unique_ptr<Http> http_;
};

}  // namespace spes
