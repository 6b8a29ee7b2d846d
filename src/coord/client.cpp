#include <grpcpp/grpcpp.h>
#include <spdlog/spdlog.h>

#include <chrono>
#include <thread>

#include "proto_convert.h"
#include "spes/coord/coordinator.h"
#include "spes/util/error.h"
#include "spes/util/log.h"
#include "spes/v1/coordinator.grpc.pb.h"

namespace spes {
using namespace coord_detail;

struct CoordinatorClient::Impl {
  sync_detail::TransportSettings transport;
  std::string address;
  std::unique_ptr<spes::v1::CoordinatorService::Stub> stub;

  Impl(sync_detail::TransportSettings t, std::string a) : transport(std::move(t)), address(std::move(a)) {
    grpc::ChannelArguments args;
    args.SetMaxReceiveMessageSize(4 << 20);
    // With per-node certificates, only the run's coordinator certificate is accepted from the server.
    if (!transport.identity.empty()) args.SetSslTargetNameOverride(holder_dns_name(kCoordinatorHolder));
    stub = spes::v1::CoordinatorService::NewStub(
        grpc::CreateCustomChannel(address, sync_detail::channel_credentials(transport), args));
  }

  void prepare(grpc::ClientContext& context, double timeout_s) const {
    context.AddMetadata(sync_detail::kTokenHeader, transport.token);
    context.set_deadline(std::chrono::system_clock::now() +
                         std::chrono::milliseconds(static_cast<std::int64_t>(timeout_s * 1000)));
  }

  // Calls `rpc` until it succeeds, fails for good, or wait_s passes while the coordinator is
  // unreachable (UNAVAILABLE / DEADLINE_EXCEEDED); back-off from 0.2 s doubling to 2 s.
  template <typename Call>
  grpc::Status with_retries(double wait_s, Call rpc) const {
    const auto give_up = std::chrono::steady_clock::now() + std::chrono::milliseconds(static_cast<std::int64_t>(wait_s * 1000));
    double backoff = 0.2;
    while (true) {
      grpc::ClientContext context;
      prepare(context, std::min(5.0, std::max(0.5, wait_s)));
      context.set_wait_for_ready(true);  // wait for the connection instead of failing fast
      grpc::Status s = rpc(context);
      const bool transient = s.error_code() == grpc::StatusCode::UNAVAILABLE ||
                             s.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED;
      const auto retry_at = std::chrono::steady_clock::now() + std::chrono::milliseconds(static_cast<std::int64_t>(backoff * 1000));
      if (s.ok() || !transient || retry_at >= give_up) return s;
      std::this_thread::sleep_until(retry_at);
      backoff = std::min(backoff * 2, 2.0);
    }
  }

  [[noreturn]] void fail(const char* what, const grpc::Status& s) const {
    raise(ErrorKind::Peer, "coordinator {}: {} failed: {} (gRPC status {})", address, what, s.error_message(),
          static_cast<int>(s.error_code()));
  }
};

CoordinatorClient::CoordinatorClient(const Config& c)
    : impl_(std::make_unique<Impl>(sync_detail::transport_settings(c), c.coordinator.address)) {}
CoordinatorClient::CoordinatorClient(const ClusterConfig& c)
    : impl_(std::make_unique<Impl>(cluster_transport(c), c.coordinator.address)) {
  if (c.coordinator.address.empty())
    raise(ErrorKind::Config, "{}: coordinator.address is not set", c.where("coordinator"));
}
CoordinatorClient::~CoordinatorClient() = default;

std::pair<MembershipPlan, std::uint64_t> CoordinatorClient::join(int node_id, const std::string& address, double wait_s,
                                                                 std::uint64_t resumed_round) {
  spes::v1::JoinRequest request;
  request.set_run_id(impl_->transport.run_id);
  request.set_node_id(static_cast<std::uint32_t>(node_id));
  request.set_address(address);
  request.set_resumed_round(resumed_round);
  spes::v1::JoinReply reply;
  auto s = impl_->with_retries(wait_s, [&](grpc::ClientContext& ctx) { return impl_->stub->Join(&ctx, request, &reply); });
  if (!s.ok()) impl_->fail("join", s);
  return {from_proto(reply.plan()), reply.round()};
}

std::optional<std::uint64_t> CoordinatorClient::heartbeat(int node_id, const NodeProgress& progress) {
  spes::v1::HeartbeatRequest request;
  request.set_run_id(impl_->transport.run_id);
  request.set_node_id(static_cast<std::uint32_t>(node_id));
  to_proto(progress, *request.mutable_report());
  spes::v1::HeartbeatReply reply;
  grpc::ClientContext context;
  impl_->prepare(context, 5.0);
  auto s = impl_->stub->Heartbeat(&context, request, &reply);
  if (!s.ok()) {
    spdlog::debug("coordinator heartbeat failed: {}", s.error_message());
    return std::nullopt;
  }
  return reply.plan_version();
}

std::optional<MembershipPlan> CoordinatorClient::plan_for(int node_id, std::uint64_t round, double wait_s) {
  spes::v1::PlanRequest request;
  request.set_run_id(impl_->transport.run_id);
  request.set_node_id(static_cast<std::uint32_t>(node_id));
  request.set_round(round);
  spes::v1::PlanReply reply;
  auto s = impl_->with_retries(wait_s, [&](grpc::ClientContext& ctx) { return impl_->stub->GetPlan(&ctx, request, &reply); });
  if (s.error_code() == grpc::StatusCode::UNAVAILABLE || s.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED)
    return std::nullopt;
  if (!s.ok()) impl_->fail("plan request", s);
  return from_proto(reply.plan());
}

ClusterStatus CoordinatorClient::status(double timeout_s) {
  spes::v1::StatusRequest request;
  request.set_run_id(impl_->transport.run_id);
  spes::v1::StatusReply reply;
  auto s = impl_->with_retries(timeout_s, [&](grpc::ClientContext& ctx) { return impl_->stub->Status(&ctx, request, &reply); });
  if (!s.ok()) impl_->fail("status", s);
  ClusterStatus out;
  out.run_id = reply.run_id();
  out.round = reply.round();
  out.plan = from_proto(reply.plan());
  out.refused_calls = reply.refused_calls();
  out.last_refusal = printable(reply.last_refusal(), 300);
  for (const auto& n : reply.nodes())
    out.nodes.push_back({static_cast<int>(n.id()), n.address(), n.alive(), n.member(), n.silent_s(), from_proto(n.report()),
                         printable(n.removed(), 300)});
  return out;
}

MembershipPlan CoordinatorClient::remove(int node_id, const std::string& reason, bool readmit, double timeout_s) {
  spes::v1::RemoveRequest request;
  request.set_run_id(impl_->transport.run_id);
  request.set_node_id(static_cast<std::uint32_t>(node_id));
  request.set_reason(reason);
  request.set_readmit(readmit);
  spes::v1::RemoveReply reply;
  auto s = impl_->with_retries(timeout_s, [&](grpc::ClientContext& ctx) { return impl_->stub->Remove(&ctx, request, &reply); });
  if (!s.ok()) impl_->fail(readmit ? "readmit" : "remove", s);
  return from_proto(reply.plan());
}

}  // namespace spes
