#include "spes/coord/dashboard.h"

#include <CivetServer.h>
#include <fmt/format.h>

#include <cstring>
#include <nlohmann/json.hpp>

#include "proto_convert.h"
#include "sync/transport.h"
#include "spes/util/error.h"

namespace spes {

extern const char* const kDashboardPage;  // src/coord/dashboard_page.cpp

std::string cluster_status_json(const ClusterStatus& s, bool curves, int indent) {
  nlohmann::json nodes = nlohmann::json::array();
  for (const auto& n : s.nodes) {
    const NodeProgress& p = n.progress;
    nlohmann::json node{{"id", n.id}, {"address", n.address}, {"alive", n.alive}, {"member", n.member},
                        {"done", p.done}, {"removed", n.removed}, {"silent_s", n.silent_s}, {"experts", p.experts}, {"step", p.step},
                        {"round", p.round}, {"loss", p.loss}, {"tokens_per_s", p.tokens_per_s},
                        {"last_sync_unix_s", p.last_sync_unix_s}, {"last_sync_bytes_in", p.last_sync_bytes_in},
                        {"bytes_in_total", p.bytes_in_total}, {"bytes_out_total", p.bytes_out_total},
                        {"peak_rss_bytes", p.peak_rss_bytes}, {"round_in_flight", p.round_in_flight},
                        {"round_delay", p.round_delay}, {"rejected_payloads", p.rejected_payloads},
                        {"refused_calls", p.refused_calls}, {"last_refusal", p.last_refusal}};
    if (curves) {
      nlohmann::json curve = nlohmann::json::array();
      for (const auto& [step, loss] : n.loss_curve) curve.push_back({step, loss});
      node["loss_curve"] = curve;
    }
    nodes.push_back(node);
  }
  return nlohmann::json{{"run", s.run_id}, {"round", s.round}, {"plan_version", s.plan.version},
                        {"plan_effective_round", s.plan.effective_round}, {"nodes", nodes},
                        {"refused_calls", s.refused_calls}, {"last_refusal", s.last_refusal}}
      .dump(indent);
}

namespace {

// The run token from ?token= or an "Authorization: Bearer" header, compared in constant time.
bool authorized(mg_connection* conn, const std::string& token) {
  const mg_request_info* info = mg_get_request_info(conn);
  if (const char* auth = mg_get_header(conn, "Authorization")) {
    const std::string_view value(auth);
    if (value.rfind("Bearer ", 0) == 0 && sync_detail::same_token(token, value.substr(7))) return true;
  }
  if (info->query_string) {
    char given[512];
    const int n = mg_get_var(info->query_string, std::strlen(info->query_string), "token", given, sizeof given);
    if (n > 0 && sync_detail::same_token(token, std::string_view(given, static_cast<std::size_t>(n)))) return true;
  }
  return false;
}

void reply(mg_connection* conn, int code, const char* type, const std::string& body) {
  mg_printf(conn,
            "HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %zu\r\nCache-Control: no-store\r\n"
            "X-Content-Type-Options: nosniff\r\nConnection: close\r\n\r\n",
            code, code == 200 ? "OK" : code == 401 ? "Unauthorized" : "Method Not Allowed", type, body.size());
  mg_write(conn, body.data(), body.size());
}

class Page final : public CivetHandler {
 public:
  explicit Page(const std::string& token) : token_(token) {}
  bool handleGet(CivetServer*, mg_connection* conn) override {
    if (!authorized(conn, token_)) reply(conn, 401, "text/plain", "the run token is needed: open /?token=RUN_TOKEN\n");
    else reply(conn, 200, "text/html; charset=utf-8", kDashboardPage);
    return true;
  }

 private:
  std::string token_;
};

class StatusApi final : public CivetHandler {
 public:
  StatusApi(const std::string& token, CoordinatorServer& coordinator) : token_(token), coordinator_(coordinator) {}
  bool handleGet(CivetServer*, mg_connection* conn) override {
    if (!authorized(conn, token_)) reply(conn, 401, "application/json", R"({"error":"the run token is needed"})");
    else reply(conn, 200, "application/json", cluster_status_json(coordinator_.status()));
    return true;
  }

 private:
  std::string token_;
  CoordinatorServer& coordinator_;
};

}  // namespace

struct DashboardServer::Impl {
  std::unique_ptr<CivetServer> server;
  std::unique_ptr<Page> page;
  std::unique_ptr<StatusApi> api;
  std::string host;
};

DashboardServer::DashboardServer(const ClusterConfig& cluster, CoordinatorServer& coordinator, const std::string& listen)
    : impl_(std::make_unique<Impl>()) {
  const auto colon = listen.rfind(':');
  if (colon == std::string::npos) raise(ErrorKind::Config, "dashboard address '{}' is not host:port", listen);
  impl_->host = listen.substr(0, colon);
  const std::string token = coord_detail::cluster_transport(cluster).token;
  try {
    impl_->server = std::make_unique<CivetServer>(std::vector<std::string>{"listening_ports", listen, "num_threads", "2"});
  } catch (const std::exception& e) {
    raise(ErrorKind::Io, "cannot serve the dashboard on {}: {} (port in use? another address?)", listen, e.what());
  }
  impl_->page = std::make_unique<Page>(token);
  impl_->api = std::make_unique<StatusApi>(token, coordinator);
  impl_->server->addHandler("/api/status", *impl_->api);
  impl_->server->addHandler("/", *impl_->page);
}

DashboardServer::~DashboardServer() {
  if (impl_->server) impl_->server->close();  // handlers stop before they are destroyed
}

std::string DashboardServer::address() const {
  const auto ports = impl_->server->getListeningPorts();
  return fmt::format("{}:{}", impl_->host, ports.empty() ? 0 : ports.front());
}

}  // namespace spes
