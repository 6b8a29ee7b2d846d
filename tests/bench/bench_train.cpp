// spes bench train — training throughput, MFU and memory, with all experts trainable, with a
// fraction of them owned (the rest frozen, fp32), and the same with the frozen ones stored in
// bf16. Each case runs in its own child process so its peak RSS / GPU memory is its own; the
// parent measures the device's matmul peak (fp32 on the CPU, bf16 under CUDA autocast) and reports.
#include <spdlog/spdlog.h>
#include <torch/torch.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "../../src/cli/commands.h"
#include "spes/config/config.h"
#include "spes/data/prepare.h"
#include "spes/model/size.h"
#include "spes/train/peak.h"
#include "spes/train/trainer.h"
#include "spes/util/error.h"
#include "spes/util/fs.h"
#include "spes/util/log.h"
#include "spes/util/process.h"
#include "spes/util/progress.h"

namespace spes::cli {
namespace {

struct BenchOptions {
  ConfigOptions config;
  std::int64_t steps = 6;
  std::int64_t warmup = 2;
  double owned_fraction = 0.25;
  std::string child_case;  // internal: "all", "owned" or "owned-bf16" runs one case and prints JSON
  std::string json_out;
};

std::vector<int> owned_for_case(const Config& c, const std::string& which, double fraction) {
  std::vector<int> owned;
  const auto E = c.model.n_experts;
  const auto n = which == "all" ? E : std::max<std::int64_t>(1, std::llround(static_cast<double>(E) * fraction));
  for (int e = 0; e < n; ++e) owned.push_back(e);
  return owned;
}

// One case, in this process: warm-up steps, then timed steps; JSON on stdout.
void run_case(const BenchOptions& o) {
  init_logging("warn");
  std::vector<std::string> overrides = o.config.overrides;
  if (o.child_case == "owned-bf16") overrides.push_back("train.frozen_dtype=bf16");
  Config c = load_config(o.config.config, overrides);
  c.train.owned_experts = owned_for_case(c, o.child_case, o.owned_fraction);
  c.train.steps = o.warmup + o.steps;
  prepare_data(c);
  configure_threads(c.run);
  TrainerOptions topts;
  topts.write_outputs = false;
  topts.measure_peak = false;
  topts.progress = false;
  Trainer trainer(c, topts);
  for (std::int64_t i = 0; i < o.warmup; ++i) trainer.step();
  double seconds = 0, flops = 0, frozen_share = 0;
  std::int64_t tokens = 0;
  for (std::int64_t i = 0; i < o.steps; ++i) {
    StepStats s = trainer.step();
    seconds += s.seconds;
    flops += s.flops;
    tokens += s.tokens;
    frozen_share += s.frozen_share / static_cast<double>(o.steps);
  }
  TrainingMemory mem = trainer.memory();
  nlohmann::json j = {{"case", o.child_case},
                      {"device", trainer.device_plan().describe()},
                      {"weight_bytes", mem.weight_bytes},
                      {"peak_device_bytes", device_memory(trainer.device_plan().device).peak_allocated},
                      {"owned_experts", c.train.owned_experts.size()},
                      {"seconds_per_step", seconds / static_cast<double>(o.steps)},
                      {"flops_per_step", flops / static_cast<double>(o.steps)},
                      {"tokens_per_s", static_cast<double>(tokens) / seconds},
                      {"frozen_share", frozen_share},
                      {"trainable_params", mem.trainable_params},
                      {"grad_bytes", mem.grad_bytes},
                      {"optimizer_bytes", mem.optimizer_bytes},
                      {"frozen_grad_bytes", mem.frozen_grad_bytes},
                      {"peak_rss", peak_rss_bytes()}};
  std::printf("BENCH_JSON %s\n", j.dump().c_str());
}

nlohmann::json spawn_case(const BenchOptions& o, const std::string& which) {
  std::vector<std::string> argv = {"/proc/self/exe", "bench", "train", "--config", o.config.config,
                                   "--case", which, "--steps", std::to_string(o.steps),
                                   "--warmup", std::to_string(o.warmup),
                                   "--owned-fraction", std::to_string(o.owned_fraction)};
  for (const auto& s : o.config.overrides) {
    argv.push_back("--set");
    argv.push_back(s);
  }
  CommandResult r = run_command(argv);
  auto pos = r.output.rfind("BENCH_JSON ");
  if (r.exit_status != 0 || pos == std::string::npos)
    raise(ErrorKind::Internal, "bench case '{}' failed (exit {}):\n{}", which, r.exit_status, r.output);
  auto end = r.output.find('\n', pos);
  return nlohmann::json::parse(r.output.substr(pos + 11, end - pos - 11));
}

void run_bench(const BenchOptions& o) {
  init_logging(o.config.log_level);
  Config c = load_config(o.config.config, o.config.overrides);
  prepare_data(c);  // once, before the children, so they do not race to build it
  const int threads = configure_threads(c.run);
  const DevicePlan plan = resolve_device_plan(c);
  const double peak = measure_matmul_peak_flops(3.0, plan.device, plan.bf16_autocast);
  std::printf("spes bench train: %s, %d threads, %lld timed steps of %lld tokens (after %lld warm-up)\n",
              c.source.c_str(), threads, (long long)o.steps,
              (long long)(c.train.batch_size * c.train.grad_accum * c.data.seq_len), (long long)o.warmup);
  std::printf("device: %s\nmeasured %s matmul peak: %.1f GFLOP/s\n\n", plan.describe().c_str(),
              plan.bf16_autocast ? "bf16" : "fp32", peak / 1e9);

  nlohmann::json all = spawn_case(o, "all");
  nlohmann::json part = spawn_case(o, "owned");
  nlohmann::json part_bf16 = spawn_case(o, "owned-bf16");
  const auto E = c.model.n_experts;
  const bool gpu = plan.device.is_cuda();
  std::printf("%-24s %10s %12s %9s %10s %7s %11s %11s %14s %9s\n", "case", "trainable", "GFLOP/step", "s/step",
              "tok/s", "MFU", "weights", gpu ? "GPU peak" : "peak RSS", "grad+opt B", "B/param");
  nlohmann::json report = {{"config", c.source}, {"threads", threads}, {"device", plan.describe()},
                           {"peak_flops", peak}, {"cases", nlohmann::json::array()}};
  for (auto* j : {&all, &part, &part_bf16}) {
    auto& r = *j;
    const double mfu = r["flops_per_step"].get<double>() / r["seconds_per_step"].get<double>() / peak;
    const double opt_bytes = r["grad_bytes"].get<double>() + r["optimizer_bytes"].get<double>();
    const double per_param = opt_bytes / r["trainable_params"].get<double>();
    r["mfu"] = mfu;
    r["bytes_per_trainable_param"] = per_param;
    std::string name = r["case"] == "all" ? "all experts"
                       : fmt::format("{}/{} owned, frozen {}", r["owned_experts"].get<int>(), E,
                                     r["case"] == "owned-bf16" ? "bf16" : "fp32");
    const double memory = gpu ? r["peak_device_bytes"].get<double>() : r["peak_rss"].get<double>();
    std::printf("%-24s %10s %12.2f %9.3f %10s %6.1f%% %11s %11s %14s %9.3f\n", name.c_str(),
                format_count(r["trainable_params"].get<double>()).c_str(), r["flops_per_step"].get<double>() / 1e9,
                r["seconds_per_step"].get<double>(), format_count(r["tokens_per_s"].get<double>()).c_str(),
                100 * mfu, format_bytes(r["weight_bytes"].get<double>()).c_str(), format_bytes(memory).c_str(),
                format_bytes(opt_bytes).c_str(), per_param);
    report["cases"].push_back(r);
  }
  const double predicted = all["flops_per_step"].get<double>() / part["flops_per_step"].get<double>();
  const double measured = part["tokens_per_s"].get<double>() / all["tokens_per_s"].get<double>();
  const double ratio = measured / predicted;
  const double mem_dev = std::fabs(part["bytes_per_trainable_param"].get<double>() / 12.0 - 1.0);
  const double mfu_all = all["mfu"].get<double>();
  auto verdict = [](bool ok) { return ok ? "met" : "MISSED"; };
  std::printf("\nFLOPs of one step by count: all %.3f GFLOP, owned %.3f GFLOP (frozen share of routed pairs %.3f)\n",
              all["flops_per_step"].get<double>() / 1e9, part["flops_per_step"].get<double>() / 1e9,
              part["frozen_share"].get<double>());
  std::printf("speed-up with %d/%lld owned: predicted by FLOPs %.3fx, measured %.3fx, ratio %.2f (target >= 0.80: %s)\n",
              part["owned_experts"].get<int>(), (long long)E, predicted, measured, ratio, verdict(ratio >= 0.8));
  std::printf("MFU with all experts: %.1f%% of the measured matmul peak (target >= 40%%: %s)\n", 100 * mfu_all,
              verdict(mfu_all >= 0.40));
  const auto node_bytes = [&](const nlohmann::json& r) {
    return gpu ? r["peak_device_bytes"].get<double>() : r["weight_bytes"].get<double>() + r["grad_bytes"].get<double>() +
                                                            r["optimizer_bytes"].get<double>();
  };
  std::printf("memory per node (%s): all experts %s, 1/%.0f owned %s (%.2fx), with bf16 frozen copies %s (%.2fx)\n",
              gpu ? "GPU peak" : "weights + gradients + AdamW moments", format_bytes(node_bytes(all)).c_str(),
              1.0 / o.owned_fraction, format_bytes(node_bytes(part)).c_str(), node_bytes(part) / node_bytes(all),
              format_bytes(node_bytes(part_bf16)).c_str(), node_bytes(part_bf16) / node_bytes(all));
  std::printf("gradient + optimizer memory: %.3f bytes per trainable parameter (target 12 within 2%%: %s); "
              "gradient bytes on frozen experts: %lld\n",
              part["bytes_per_trainable_param"].get<double>(), verdict(mem_dev <= 0.02),
              part["frozen_grad_bytes"].get<long long>());
  report["predicted_speedup"] = predicted;
  report["measured_speedup"] = measured;
  if (!o.json_out.empty()) write_file_atomic(o.json_out, report.dump(2) + "\n");
}

}  // namespace

void add_bench_commands(CLI::App& app) {
  auto* bench = app.add_subcommand("bench", "benchmarks (results belong in docs/benchmarks.md)");
  bench->require_subcommand(1);
  auto* train = bench->add_subcommand("train", "tokens/s, MFU and memory: all experts vs a fraction owned");
  auto o = std::make_shared<BenchOptions>();
  add_config_options(*train, o->config);
  train->add_option("--steps", o->steps, "timed steps per case")->check(CLI::PositiveNumber);
  train->add_option("--warmup", o->warmup, "untimed steps before timing")->check(CLI::NonNegativeNumber);
  train->add_option("--owned-fraction", o->owned_fraction, "share of experts owned in the second case")
      ->check(CLI::Range(0.01, 1.0));
  train->add_option("--json", o->json_out, "also write the report as JSON to this file");
  train->add_option("--case", o->child_case, "run one case only (internal)")->check(CLI::IsMember({"all", "owned", "owned-bf16"}))
      ->group("");
  train->callback([o] {
    if (o->child_case.empty()) run_bench(*o);
    else run_case(*o);
  });
  add_bench_sync(*bench);
  add_bench_generate(*bench);
  add_bench_tls(*bench);
}

}  // namespace spes::cli
