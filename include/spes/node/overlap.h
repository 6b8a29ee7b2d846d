// A sync round that runs on background threads while training goes on (sync.overlap; the math is
// in docs/protocol.md, "Overlapped rounds"). At the snapshot the model's weights go to the sync
// buffers (the engine works on those alone) and the parameters this node trains are copied on
// their device; the round lands later, at a step boundary, as
//   trained parameters:  theta <- R + (theta_now - theta_snap)
//   the others:          theta <- R            (they did not change since the snapshot)
// where R is the round's result. Landing at the snapshot's own step writes R as a blocking
// round does, bit for bit. The optimizer state is not touched. A round of one fragment
// (sync.fragments) snapshots, and lands on, that fragment's parameters only.
#pragma once

#include <cstdint>
#include <future>
#include <vector>

#include <ATen/core/Tensor.h>

#include "spes/sync/engine.h"
#include "spes/sync/model_params.h"

namespace spes {

class RoundInFlight {
 public:
  // Takes the snapshot and starts engine.run_round(round, step, timeout_s, fragment) on its own
  // thread. The mirror must be staged (its buffers a copy, not the parameters). It lands at
  // step `land_step`.
  RoundInFlight(SyncEngine& engine, ModelParamMirror& mirror, std::uint64_t round, std::int64_t step,
                std::int64_t land_step, double timeout_s = 0, int fragment = kWholeModel);
  // Waits for the round (its result is dropped) so the engine is free again.
  ~RoundInFlight();
  RoundInFlight(const RoundInFlight&) = delete;
  RoundInFlight& operator=(const RoundInFlight&) = delete;

  std::uint64_t round() const { return round_; }
  std::int64_t snapshot_step() const { return step_; }
  std::int64_t land_step() const { return land_step_; }
  int fragment() const { return fragment_; }
  bool done() const;

  struct Landed {
    SyncRoundReport report;
    std::int64_t step = 0;      // the step boundary it landed at
    std::int64_t delay = 0;     // steps trained since the snapshot
    double wait_seconds = 0;    // how long training waited for the network here
    double apply_seconds = 0;   // writing the result into the model
  };
  // Waits for the round if it has not finished, then writes its result into the model as above,
  // at step `step` (>= the snapshot's). Rethrows what the round threw. Call once.
  Landed land(std::int64_t step);

  // Bytes the overlap keeps besides the sync buffers: the device copy of the trained parameters.
  std::int64_t snapshot_bytes() const;

 private:
  // The round's tensors for the mirror's copies; null for the whole model (one transfer).
  const std::vector<std::size_t>* subset() const;

  ModelParamMirror& mirror_;
  std::vector<std::size_t> tensors_;   // what the round reads and writes (ParamSet indices)
  std::uint64_t round_;
  std::int64_t step_, land_step_;
  int fragment_;
  std::vector<at::Tensor> trained_;    // the round's parameters that require grad
  std::vector<at::Tensor> snapshot_;   // their values at the snapshot, same device and dtype
  std::future<SyncRoundReport> result_;
};

}  // namespace spes
