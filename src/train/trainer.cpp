#include "spes/train/trainer.h"

#include <spdlog/spdlog.h>
#include <torch/torch.h>

#include <chrono>
#include <cmath>
#include <thread>

#include "spes/data/prepare.h"
#include "spes/model/size.h"
#include "spes/train/inference.h"
#include "spes/train/peak.h"
#include "spes/train/schedule.h"
#include "spes/util/error.h"
#include "spes/util/failpoint.h"
#include "spes/util/fs.h"
#include "spes/util/process.h"
#include "spes/util/progress.h"

namespace spes {

int configure_threads(const RunConfig& run, int processes) {
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  int threads = run.threads > 0 ? run.threads : std::max(1, cores / std::max(1, processes));
  torch::set_num_threads(threads);
  return threads;
}

namespace {

// Rows [first_row, first_row + rows) of a batch's token matrix, on the device.
torch::Tensor to_tensor(const std::vector<std::int64_t>& values, std::int64_t first_row, std::int64_t rows,
                        std::int64_t cols, const c10::Device& device) {
  auto* start = const_cast<std::int64_t*>(values.data()) + first_row * cols;
  return torch::from_blob(start, {rows, cols}, torch::kInt64).to(device, false, true);
}

void check_shard_vocab(const TokenShard& shard, const Config& c) {
  if (shard.vocab_size() > c.model.vocab_size)
    raise(ErrorKind::Data, "token shard '{}' was made with a vocabulary of {} but model.vocab_size is {} "
          "({}): run `spes data prepare` again", shard.path().string(), shard.vocab_size(),
          c.model.vocab_size, c.where("model.vocab_size"));
}

}  // namespace

Trainer::Trainer(Config config, TrainerOptions options)
    : config_(std::move(config)),
      options_(options),
      plan_(resolve_device_plan(config_, options.grad_sync ? options.grad_sync->rank() : 0)),
      train_shard_(data_paths(config_.data).train),
      val_shard_(data_paths(config_.data).val) {
  check_shard_vocab(train_shard_, config_);
  check_shard_vocab(val_shard_, config_);
  sampler_.emplace(train_shard_, config_.data.seq_len, config_.run.seed, config_.run.node_id);

  // Initialized on the CPU from the seed (the same weights whatever the device), then moved.
  model_ = MoeTransformer(config_.model, config_.run.seed);
  model_->to(plan_.device);
  const auto owned = config_.owned_expert_list();
  owned_.assign(static_cast<std::size_t>(config_.model.n_experts), false);
  for (int e : owned) owned_[static_cast<std::size_t>(e)] = true;
  model_->set_owned_experts(owned, plan_.frozen_dtype);
  trainable_ = model_->trainable_parameters();
  optimizer_ = make_adamw(trainable_, config_.optim);
  if (options_.grad_sync) options_.grad_sync->attach(trainable_);

  if (options_.measure_peak) peak_flops_ = measure_matmul_peak_flops(1.5, plan_.device, plan_.bf16_autocast);
  if (options_.write_outputs) {
    ensure_directory(config_.run.out_dir);
    // A resumed run adds to the metrics of the run it continues.
    metrics_.emplace(config_.run.out_dir + "/metrics.jsonl", /*append=*/!config_.checkpoint.resume.empty());
  }
}

StepStats Trainer::step() {
  const auto t0 = std::chrono::steady_clock::now();
  const TrainConfig& tc = config_.train;
  const double lr = learning_rate(config_.optim.lr, config_.schedule, tc.steps, step_);
  set_learning_rate(*optimizer_, lr);
  optimizer_->zero_grad();

  StepStats s;
  const auto L = config_.model.n_layers, E = config_.model.n_experts;
  const auto on_device = torch::TensorOptions().device(plan_.device);
  // Loss terms and expert loads stay on the device until the step is done: one copy to the host.
  torch::Tensor terms = torch::zeros({5}, on_device.dtype(torch::kFloat64));
  torch::Tensor load = torch::zeros({L, E}, on_device.dtype(torch::kInt64));
  // With several ranks, every rank draws the node's micro-batch and trains on its own rows.
  GradientSync* dp = options_.grad_sync;
  const std::int64_t ranks = dp ? dp->ranks() : 1, first_row = dp ? dp->rank() * tc.batch_size : 0;
  for (std::int64_t micro = 0; micro < tc.grad_accum; ++micro) {
    TokenBatch batch = sampler_->next_batch(tc.batch_size * ranks);
    auto inputs = to_tensor(batch.inputs, first_row, tc.batch_size, batch.seq_len, plan_.device);
    auto targets = to_tensor(batch.targets, first_row, tc.batch_size, batch.seq_len, plan_.device);
    LossTerms loss;
    ModelOutput out;
    {
      AutocastScope autocast(plan_.bf16_autocast);
      out = model_->forward(inputs);
      loss = compute_loss(out, targets, config_.loss);
    }
    auto scaled = loss.total / static_cast<double>(tc.grad_accum);
    if (dp) dp->before_backward(micro + 1 == tc.grad_accum, scaled);
    scaled.backward();
    terms += torch::stack({loss.total, loss.ce, loss.z_loss, loss.load_balance, loss.router_z}).detach().to(torch::kFloat64) /
             static_cast<double>(tc.grad_accum);
    load += torch::stack(out.expert_counts);
    s.tokens += batch.batch * batch.seq_len;  // the node's tokens, all ranks together
  }
  if (dp) {
    dp->finish_gradients();
    // Loss terms (mean over ranks) and expert loads (sum) of the node's whole batch.
    torch::Tensor stats = torch::cat({terms, load.flatten().to(torch::kFloat64)});
    dp->sum(stats);
    terms = stats.narrow(0, 0, 5) / static_cast<double>(ranks);
    load = stats.narrow(0, 5, L * E).view({L, E}).round().to(torch::kInt64);
  }
  s.grad_norm = clip_grad_norm(trainable_, config_.optim.grad_clip);
  failpoint("step");
  optimizer_->step();
  ++step_;
  const auto terms_host = terms.cpu();
  const auto* t = terms_host.data_ptr<double>();
  s.loss = t[0];
  s.ce = t[1];
  s.z_loss = t[2];
  s.load_balance = t[3];
  s.router_z = t[4];
  load = load.cpu();
  synchronize_device(plan_.device);

  s.step = step_;
  s.lr = lr;
  s.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  s.tokens_per_s = static_cast<double>(s.tokens) / s.seconds;
  std::int64_t routed = 0, frozen = 0;
  auto acc = load.accessor<std::int64_t, 2>();
  s.expert_load.assign(static_cast<std::size_t>(L), std::vector<std::int64_t>(static_cast<std::size_t>(E)));
  for (std::int64_t l = 0; l < L; ++l)
    for (std::int64_t e = 0; e < E; ++e) {
      s.expert_load[l][e] = acc[l][e];
      routed += acc[l][e];
      if (!owned_[static_cast<std::size_t>(e)]) frozen += acc[l][e];
    }
  s.frozen_share = routed > 0 ? static_cast<double>(frozen) / static_cast<double>(routed) : 0.0;
  s.flops = count_train_flops(config_.model, config_.data.seq_len, s.tokens, s.frozen_share).total();
  s.mfu = peak_flops_ > 0 ? s.flops / s.seconds / (peak_flops_ * static_cast<double>(ranks)) : 0.0;
  s.peak_rss = peak_rss_bytes();
  s.peak_device_bytes = device_memory(plan_.device).peak_allocated;
  if (metrics_) metrics_->write(s);
  return s;
}

EvalStats Trainer::evaluate() {
  EvalStats e;
  {
    AutocastScope autocast(plan_.bf16_autocast);
    e = evaluate_model(model_, val_shard_, config_.data.seq_len, config_.train.batch_size, config_.train.eval_windows);
  }
  e.step = step_;
  if (metrics_) metrics_->write(e);
  return e;
}

std::vector<int> Trainer::set_owned_experts(const std::vector<int>& owned) {
  std::vector<int> added;
  for (int e : owned)
    if (e >= 0 && e < config_.model.n_experts && !owned_[static_cast<std::size_t>(e)]) added.push_back(e);
  model_->set_owned_experts(owned, plan_.frozen_dtype);
  for (auto& p : model_->parameters())
    if (!p.requires_grad() && p.grad().defined()) p.mutable_grad() = torch::Tensor();
  // AdamW keys its per-parameter state by the tensor's address, which does not change.
  auto old_state = std::move(optimizer_->state());
  trainable_ = model_->trainable_parameters();
  optimizer_ = make_adamw(trainable_, config_.optim);
  if (options_.grad_sync) options_.grad_sync->attach(trainable_);
  for (const auto& p : trainable_) {
    auto key = p.unsafeGetTensorImpl();
    auto it = old_state.find(key);
    if (it != old_state.end()) optimizer_->state()[key] = std::move(it->second);
  }
  owned_.assign(static_cast<std::size_t>(config_.model.n_experts), false);
  for (int e : owned) owned_[static_cast<std::size_t>(e)] = true;
  config_.train.owned_experts = owned;
  std::sort(config_.train.owned_experts.begin(), config_.train.owned_experts.end());
  return added;
}

TrainingMemory Trainer::memory() const { return training_memory(model_->parameters(), *optimizer_); }

EvalStats Trainer::run() {
  const TrainConfig& tc = config_.train;
  const auto counts = count_params(config_.model, static_cast<std::int64_t>(config_.owned_expert_list().size()));
  spdlog::info("{}: {} parameters ({} active per token, {} trainable on this node: {} of {} experts)",
               config_.run.name, format_count(static_cast<double>(counts.total)),
               format_count(static_cast<double>(counts.active)), format_count(static_cast<double>(counts.trainable)),
               config_.owned_expert_list().size(), config_.model.n_experts);
  spdlog::info("data: {} train tokens ({} windows of {}), {} validation tokens; node {} seed {}",
               train_shard_.size(), sampler_->windows_per_epoch(), config_.data.seq_len, val_shard_.size(),
               config_.run.node_id, node_data_seed(config_.run.seed, config_.run.node_id));
  spdlog::info("device: {}", plan_.describe());
  if (peak_flops_ > 0)
    spdlog::info("measured {} matmul peak: {:.1f} GFLOP/s", plan_.bf16_autocast ? "bf16" : "fp32", peak_flops_ / 1e9);

  const auto t_start = std::chrono::steady_clock::now();
  double window_seconds = 0, window_tokens = 0, window_flops = 0;
  EvalStats last_eval;
  stopped_early_ = false;
  while (step_ < tc.steps) {
    StepStats s = step();
    if (after_step_) after_step_(s);
    if (should_stop_ && should_stop_()) {
      stopped_early_ = true;
      spdlog::warn("stopped after step {} of {} (signal)", s.step, tc.steps);
      return last_eval;
    }
    window_seconds += s.seconds;
    window_tokens += static_cast<double>(s.tokens);
    window_flops += s.flops;
    if (!std::isfinite(s.loss))
      raise(ErrorKind::Internal, "loss became {} at step {} (lower optim.lr or check the data)", s.loss, s.step);
    if (options_.progress && (s.step % tc.log_every == 0 || s.step == tc.steps || s.step == 1)) {
      const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_start).count();
      const double eta = elapsed / static_cast<double>(s.step) * static_cast<double>(tc.steps - s.step);
      const double tps = window_tokens / window_seconds;
      const double ranks = options_.grad_sync ? options_.grad_sync->ranks() : 1;
      const double mfu = peak_flops_ > 0 ? window_flops / window_seconds / (peak_flops_ * ranks) : 0.0;
      spdlog::info("step {:>5}/{} | loss {:.4f} (ce {:.4f} lb {:.3f} rz {:.2f}) | lr {:.2e} | gnorm {:.2f} | "
                   "{} tok/s | MFU {:.1f}% | {} {} | ETA {}",
                   s.step, tc.steps, s.loss, s.ce, s.load_balance, s.router_z, s.lr, s.grad_norm,
                   format_count(tps), 100.0 * mfu, plan_.device.is_cuda() ? "gpu mem" : "rss",
                   format_bytes(static_cast<double>(plan_.device.is_cuda() ? s.peak_device_bytes : s.peak_rss)),
                   format_duration(eta));
      window_seconds = window_tokens = window_flops = 0;
    }
    if (options_.evaluate && tc.eval_every > 0 && s.step % tc.eval_every == 0 && s.step != tc.steps) {
      last_eval = evaluate();
      spdlog::info("eval  {:>5} | val loss {:.4f} | val ppl {:.2f}", last_eval.step, last_eval.loss, last_eval.perplexity);
    }
  }
  if (!options_.evaluate) return last_eval;
  last_eval = evaluate();
  spdlog::info("eval  {:>5} | val loss {:.4f} | val ppl {:.2f} | done in {}", last_eval.step, last_eval.loss,
               last_eval.perplexity,
               format_duration(std::chrono::duration<double>(std::chrono::steady_clock::now() - t_start).count()));
  return last_eval;
}

}  // namespace spes
