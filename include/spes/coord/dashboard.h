// The run's live page (`spes coordinator serve --http ADDR`, or coordinator.http in the cluster
// file): one read-only HTML page (plain HTML, JavaScript and SVG, nothing fetched from elsewhere)
// with the nodes, their experts, step, tokens/s, last round, bytes, alive/dead and the loss curves,
// refreshed every 2 s from the JSON at /api/status. Both need the run token (?token=... on the
// page, which passes it on as an Authorization: Bearer header).
#pragma once

#include <memory>
#include <string>

#include "spes/coord/cluster.h"
#include "spes/coord/coordinator.h"

namespace spes {

// The run's status as JSON: what /api/status serves and `spes coordinator status --json` prints
// (the loss curves only with `curves`; `indent` >= 0 pretty-prints).
std::string cluster_status_json(const ClusterStatus& status, bool curves = true, int indent = -1);

class DashboardServer {
 public:
  // Serves on `listen` (host:port; port 0 = a free one); Error(Io) naming it when it cannot bind.
  DashboardServer(const ClusterConfig& cluster, CoordinatorServer& coordinator, const std::string& listen);
  ~DashboardServer();
  DashboardServer(const DashboardServer&) = delete;
  DashboardServer& operator=(const DashboardServer&) = delete;
  std::string address() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace spes
