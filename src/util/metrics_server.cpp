#include "spes/util/metrics_server.h"

#include <prometheus/collectable.h>
#include <prometheus/exposer.h>
#include <prometheus/metric_family.h>

#include <fmt/format.h>

#include <mutex>
#include <vector>

#include "spes/util/error.h"

namespace spes {

namespace {

struct Sample {
  prometheus::MetricType type;
  std::string help;
  double value;
};
using SampleKey = std::pair<std::string, MetricLabels>;  // name, labels

}  // namespace

// The values and collectors; prometheus-cpp asks it for the families on every scrape.
struct MetricsServer::Impl final : prometheus::Collectable, MetricsSink {
  MetricLabels constant;
  mutable std::mutex mutex;
  std::map<SampleKey, Sample> values;
  std::vector<std::function<void(MetricsSink&)>> collectors;
  mutable std::map<SampleKey, Sample>* scrape = nullptr;  // where collectors write during Collect()

  void put(prometheus::MetricType type, const std::string& name, const std::string& help, double value,
           const MetricLabels& labels, std::map<SampleKey, Sample>& into) const {
    into[{name, labels}] = Sample{type, help, value};
  }
  void gauge(const std::string& name, const std::string& help, double value, const MetricLabels& labels) override {
    put(prometheus::MetricType::Gauge, name, help, value, labels, *scrape);
  }
  void counter(const std::string& name, const std::string& help, double total, const MetricLabels& labels) override {
    put(prometheus::MetricType::Counter, name, help, total, labels, *scrape);
  }

  std::vector<prometheus::MetricFamily> Collect() const override {
    std::lock_guard lock(mutex);
    std::map<SampleKey, Sample> all = values;
    scrape = &all;
    for (const auto& c : collectors) c(const_cast<Impl&>(*this));
    scrape = nullptr;
    std::vector<prometheus::MetricFamily> families;
    for (const auto& [key, sample] : all) {  // sorted by name: one family per name
      if (families.empty() || families.back().name != key.first)
        families.push_back(prometheus::MetricFamily{key.first, sample.help, sample.type, {}});
      prometheus::ClientMetric m;
      MetricLabels labels = constant;
      for (const auto& [k, v] : key.second) labels[k] = v;
      for (const auto& [k, v] : labels) m.label.push_back({k, v});
      if (sample.type == prometheus::MetricType::Counter) m.counter.value = sample.value;
      else m.gauge.value = sample.value;
      families.back().metric.push_back(std::move(m));
    }
    return families;
  }
};

struct MetricsServer::Http {
  std::unique_ptr<prometheus::Exposer> exposer;
  std::string host;
};

MetricsServer::MetricsServer(const std::string& listen, MetricLabels constant_labels)
    : impl_(std::make_shared<Impl>()), http_(std::make_unique<Http>()) {
  impl_->constant = std::move(constant_labels);
  const auto colon = listen.rfind(':');
  if (colon == std::string::npos)
    raise(ErrorKind::Config, "metrics.listen '{}' is not host:port (e.g. 127.0.0.1:9400)", listen);
  http_->host = listen.substr(0, colon);
  try {
    http_->exposer = std::make_unique<prometheus::Exposer>(listen, 2);
  } catch (const std::exception& e) {
    raise(ErrorKind::Io, "cannot serve metrics on {}: {} (port in use? another address?)", listen, e.what());
  }
  http_->exposer->RegisterCollectable(impl_);
}

MetricsServer::~MetricsServer() {
  http_->exposer.reset();  // no scrape runs past this point
}

std::string MetricsServer::address() const {
  const auto ports = http_->exposer->GetListeningPorts();
  return fmt::format("{}:{}", http_->host, ports.empty() ? 0 : ports.front());
}

void MetricsServer::set_gauge(const std::string& name, const std::string& help, double value, const MetricLabels& labels) {
  std::lock_guard lock(impl_->mutex);
  impl_->put(prometheus::MetricType::Gauge, name, help, value, labels, impl_->values);
}

void MetricsServer::set_counter(const std::string& name, const std::string& help, double total, const MetricLabels& labels) {
  std::lock_guard lock(impl_->mutex);
  impl_->put(prometheus::MetricType::Counter, name, help, total, labels, impl_->values);
}

void MetricsServer::add_collector(std::function<void(MetricsSink&)> collector) {
  std::lock_guard lock(impl_->mutex);
  impl_->collectors.push_back(std::move(collector));
}

}  // namespace spes
