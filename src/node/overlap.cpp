#include "spes/node/overlap.h"

#include <torch/torch.h>

#include <chrono>

#include "spes/util/error.h"

namespace spes {

RoundInFlight::RoundInFlight(SyncEngine& engine, ModelParamMirror& mirror, std::uint64_t round, std::int64_t step,
                             std::int64_t land_step, double timeout_s, int fragment)
    : mirror_(mirror), tensors_(engine.tensors_of(fragment)), round_(round), step_(step), land_step_(land_step), fragment_(fragment) {
  SPES_CHECK(mirror.staged(), "an overlapped round needs sync buffers apart from the parameters");
  torch::NoGradGuard no_grad;
  mirror_.to_host(subset());
  for (std::size_t i : tensors_) {
    const at::Tensor& p = mirror_.parameter(i);
    if (p.requires_grad()) {
      trained_.push_back(p);
      snapshot_.push_back(p.detach().clone());
    }
  }
  result_ = std::async(std::launch::async, [&engine, round, step, timeout_s, fragment] {
    return engine.run_round(round, step, timeout_s, fragment);
  });
}

RoundInFlight::~RoundInFlight() {
  if (!result_.valid()) return;
  try {
    result_.get();
  } catch (...) {
    // Dropped with the round: land() is where a failure is reported.
  }
}

const std::vector<std::size_t>* RoundInFlight::subset() const {
  return tensors_.size() == mirror_.params().size() ? nullptr : &tensors_;  // the whole model: one transfer
}

bool RoundInFlight::done() const {
  return result_.valid() && result_.wait_for(std::chrono::seconds(0)) == std::future_status::ready;
}

RoundInFlight::Landed RoundInFlight::land(std::int64_t step) {
  using Clock = std::chrono::steady_clock;
  SPES_CHECK(result_.valid(), fmt::format("round {} landed twice", round_));
  SPES_CHECK(step >= step_, fmt::format("round {} of step {} cannot land at step {}", round_, step_, step));
  Landed out;
  out.step = step;
  out.delay = step - step_;
  const auto t0 = Clock::now();
  out.report = result_.get();
  const auto t1 = Clock::now();
  torch::NoGradGuard no_grad;
  if (out.delay == 0) {
    mirror_.to_model(subset());  // nothing trained since the snapshot: exactly the blocking round
  } else {
    // snapshot <- theta_now - theta_snap (in place; a - b == -b + a exactly), then R, then R + it.
    for (std::size_t i = 0; i < trained_.size(); ++i) snapshot_[i].neg_().add_(trained_[i].detach());
    mirror_.to_model(subset());
    for (std::size_t i = 0; i < trained_.size(); ++i) trained_[i].detach().add_(snapshot_[i]);
  }
  snapshot_.clear();
  trained_.clear();
  out.wait_seconds = std::chrono::duration<double>(t1 - t0).count();
  out.apply_seconds = std::chrono::duration<double>(Clock::now() - t1).count();
  return out;
}

std::int64_t RoundInFlight::snapshot_bytes() const {
  std::int64_t bytes = 0;
  for (const auto& t : snapshot_) bytes += static_cast<std::int64_t>(t.nbytes());
  return bytes;
}

}  // namespace spes
