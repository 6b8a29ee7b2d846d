#include "proto_convert.h"

#include "spes/util/error.h"
#include "spes/util/fs.h"
#include "spes/util/log.h"

namespace spes {

const PlanMember* MembershipPlan::find(int id) const {
  for (const auto& m : members)
    if (m.id == id) return &m;
  return nullptr;
}

namespace coord_detail {

void to_proto(const MembershipPlan& plan, spes::v1::Plan& out) {
  out.set_version(plan.version);
  out.set_effective_round(plan.effective_round);
  for (const auto& m : plan.members) {
    auto* member = out.add_members();
    member->set_id(static_cast<std::uint32_t>(m.id));
    member->set_address(m.address);
    for (int e : m.experts) member->add_experts(static_cast<std::uint32_t>(e));
  }
  for (int id : plan.observers) out.add_observers(static_cast<std::uint32_t>(id));
}

MembershipPlan from_proto(const spes::v1::Plan& plan) {
  MembershipPlan out;
  out.version = plan.version();
  out.effective_round = plan.effective_round();
  for (const auto& m : plan.members()) {
    PlanMember member;
    member.id = static_cast<int>(m.id());
    member.address = m.address();
    for (auto e : m.experts()) member.experts.push_back(static_cast<int>(e));
    out.members.push_back(std::move(member));
  }
  for (auto id : plan.observers()) out.observers.push_back(static_cast<int>(id));
  return out;
}

void to_proto(const NodeProgress& p, spes::v1::NodeReport& out) {
  out.set_step(p.step);
  out.set_round(p.round);
  out.set_loss(p.loss);
  out.set_tokens_per_s(p.tokens_per_s);
  out.set_last_sync_unix_s(p.last_sync_unix_s);
  out.set_last_sync_bytes_in(p.last_sync_bytes_in);
  out.set_bytes_in_total(p.bytes_in_total);
  out.set_bytes_out_total(p.bytes_out_total);
  out.set_peak_rss_bytes(p.peak_rss_bytes);
  out.set_done(p.done);
  out.set_stopped(p.stopped);
  out.set_round_in_flight(p.round_in_flight);
  out.set_round_delay(p.round_delay);
  out.set_rejected_payloads(p.rejected_payloads);
  out.set_refused_calls(p.refused_calls);
  out.set_last_refusal(p.last_refusal);
  for (int e : p.experts) out.add_experts(static_cast<std::uint32_t>(e));
}

NodeProgress from_proto(const spes::v1::NodeReport& r) {
  NodeProgress p;
  p.step = r.step();
  p.round = r.round();
  p.loss = r.loss();
  p.tokens_per_s = r.tokens_per_s();
  p.last_sync_unix_s = r.last_sync_unix_s();
  p.last_sync_bytes_in = r.last_sync_bytes_in();
  p.bytes_in_total = r.bytes_in_total();
  p.bytes_out_total = r.bytes_out_total();
  p.peak_rss_bytes = r.peak_rss_bytes();
  p.done = r.done();
  p.stopped = r.stopped();
  p.round_in_flight = r.round_in_flight();
  p.round_delay = r.round_delay();
  p.rejected_payloads = r.rejected_payloads();
  p.refused_calls = r.refused_calls();
  p.last_refusal = printable(r.last_refusal(), 300);  // the node's text, shown on terminals
  for (auto e : r.experts()) p.experts.push_back(static_cast<int>(e));
  return p;
}

sync_detail::TransportSettings cluster_transport(const ClusterConfig& c) {
  auto s = sync_detail::read_credential_files(c, [&c](const std::string& key) { return c.where(key); }, "");
  s.run_id = c.run;
  if (!s.identity.empty() && (s.identity.run != c.run || s.identity.is_node()))
    raise(ErrorKind::Config, "{}: '{}' is the certificate of {}; the coordinator and its operators use the run's "
          "coordinator or admin certificate (`spes ca issue --coordinator` / `--admin`) of run '{}'",
          c.where("tls.cert"), c.tls_cert, s.identity.describe(), c.run);
  return s;
}

}  // namespace coord_detail
}  // namespace spes
