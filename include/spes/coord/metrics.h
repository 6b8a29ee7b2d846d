// The coordinator's Prometheus metrics: the run and every node as the heartbeats report them
// (names and meanings in docs/operations.md).
#pragma once

#include "spes/coord/coordinator.h"
#include "spes/util/metrics_server.h"

namespace spes {

void write_cluster_metrics(const ClusterStatus& status, MetricsSink& sink);

}  // namespace spes
