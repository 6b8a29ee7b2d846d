// What the trainer needs from data parallelism inside a node, without knowing how it is done
// (spes/dist implements it with c10d): which slice of the node's batch this rank reads, the
// trainable gradients averaged over the node's ranks (reduced while backward still runs where
// it can), and the step's statistics summed over the ranks.
#pragma once

#include <torch/types.h>

#include <vector>

namespace spes {

class GradientSync {
 public:
  virtual ~GradientSync() = default;
  virtual int rank() const = 0;
  virtual int ranks() const = 0;
  // The trainable set changed (start, a plan change): buckets and hooks follow it. Every rank
  // attaches the same set in the same order.
  virtual void attach(const std::vector<torch::Tensor>& trainable) = 0;
  // Called before each micro-batch's backward from `loss`. Gradients of the last micro-batch are
  // reduced as backward produces them; earlier ones only accumulate locally.
  virtual void before_backward(bool last_micro, const torch::Tensor& loss) = 0;
  // After the last backward: every attached parameter's .grad holds the mean over the ranks.
  virtual void finish_gradients() = 0;
  // Sums `values` (a 1-D fp64 tensor on the training device) over the ranks, in place.
  virtual void sum(torch::Tensor& values) = 0;

  // How the last step's reduction went: buckets, and how many started while backward still ran
  // (the rest started in finish_gradients()).
  struct StepReport {
    int buckets = 0;
    int started_in_backward = 0;
  };
  virtual StepReport last_step() const = 0;
};

}  // namespace spes
