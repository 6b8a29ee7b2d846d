// The single-node training loop: model, AdamW over the trainable set, LR schedule, data
// sampler, validation and metrics. Trainer::step() is the whole step in one function:
// schedule, zero grads, micro-batches (forward, loss, backward), clip, update.
//
// Experts not in train.owned_experts are frozen (no gradient, no optimizer state); tokens
// still pass through them and their input gradients reach the router and earlier layers.
#pragma once

#include <torch/optim/adamw.h>

#include <functional>
#include <memory>
#include <optional>

#include "spes/config/config.h"
#include "spes/data/loader.h"
#include "spes/data/shard.h"
#include "spes/model/transformer.h"
#include "spes/train/device.h"
#include "spes/train/grad_sync.h"
#include "spes/train/metrics.h"
#include "spes/train/optimizer.h"

namespace spes {

struct TrainerOptions {
  bool write_outputs = true;   // train.log and metrics.jsonl under run.out_dir
  bool measure_peak = true;    // measure the matmul peak at start, for MFU
  bool progress = true;        // progress lines on the terminal every train.log_every steps
  bool evaluate = true;        // validation during and after run() (rank 0 of a node only)
  // Data parallelism inside the node (node.ranks > 1): this rank trains on its slice of the
  // node's batch (train.batch_size sequences per micro-batch per rank) and averages gradients
  // with the other ranks through it. Null: one process, the whole batch.
  GradientSync* grad_sync = nullptr;
};

class Trainer {
 public:
  // Opens the prepared token shards of config.data (Error(Data) if missing or not matching
  // the model's vocabulary), builds the model from run.seed and the optimizer.
  explicit Trainer(Config config, TrainerOptions options = {});

  StepStats step();
  EvalStats evaluate();
  // Runs until train.steps, with progress lines, periodic evaluation and metrics.
  // Returns the final evaluation.
  EvalStats run();

  // Called by run() after every optimizer step, before the progress line (the node daemon
  // runs its sync rounds here).
  void set_after_step(std::function<void(const StepStats&)> hook) { after_step_ = std::move(hook); }
  // Checked by run() after every step: when it returns true, run() stops after that step
  // without the final evaluation (SIGTERM in the node daemon).
  void set_should_stop(std::function<bool()> should_stop) { should_stop_ = std::move(should_stop); }
  bool stopped_early() const { return stopped_early_; }
  // Changes which experts this node trains, between steps. Experts it keeps keep their AdamW
  // moments; newly owned ones start with zero moments from their current (last synced) weights;
  // dropped ones lose gradient and optimizer state. Returns the newly owned experts.
  std::vector<int> set_owned_experts(const std::vector<int>& owned);
  // Moves the step counter (LR schedule position) for a node joining a run in progress.
  void set_step(std::int64_t step) { step_ = step; }
  // The run's JSONL metrics file, or null when outputs are off.
  MetricsLog* metrics() { return metrics_ ? &*metrics_ : nullptr; }

  MoeTransformer& model() { return model_; }
  torch::optim::AdamW& optimizer() { return *optimizer_; }
  std::int64_t step_count() const { return step_; }
  WindowSampler& sampler() { return *sampler_; }
  TrainingMemory memory() const;
  const Config& config() const { return config_; }
  double peak_flops() const { return peak_flops_; }
  const DevicePlan& device_plan() const { return plan_; }

 private:
  Config config_;
  TrainerOptions options_;
  DevicePlan plan_;
  TokenShard train_shard_, val_shard_;
  std::optional<WindowSampler> sampler_;
  MoeTransformer model_{nullptr};
  std::vector<torch::Tensor> trainable_;
  std::vector<bool> owned_;  // per expert index
  std::unique_ptr<torch::optim::AdamW> optimizer_;
  std::optional<MetricsLog> metrics_;
  std::int64_t step_ = 0;
  double peak_flops_ = 0;
  std::function<void(const StepStats&)> after_step_;
  std::function<bool()> should_stop_;
  bool stopped_early_ = false;
};

// Sets libtorch's intra-op threads from run.threads (0 = all cores, shared evenly by the
// `processes` of a node with several ranks); returns the count.
int configure_threads(const RunConfig& run, int processes = 1);

}  // namespace spes
