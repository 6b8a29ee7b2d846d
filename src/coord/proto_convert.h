// Conversions between the coordinator's protobuf messages and the plain structs of
// spes/coord/coordinator.h, and the transport settings it shares with sync. Internal to coord.
#pragma once

#include "spes/coord/coordinator.h"
#include "spes/v1/coordinator.pb.h"
#include "sync/transport.h"

namespace spes::coord_detail {

void to_proto(const MembershipPlan& plan, spes::v1::Plan& out);
MembershipPlan from_proto(const spes::v1::Plan& plan);
void to_proto(const NodeProgress& progress, spes::v1::NodeReport& out);
NodeProgress from_proto(const spes::v1::NodeReport& report);

// Token and TLS files of a cluster file, read (Error(Config) naming the key).
sync_detail::TransportSettings cluster_transport(const ClusterConfig& cluster);

}  // namespace spes::coord_detail
