// Registration of the `spes` subcommands. Each add_* function adds its subcommands to the
// app with callbacks that run the command; library errors (spes::Error) propagate to main.
#pragma once

#include <CLI/CLI.hpp>

#include <string>
#include <vector>

namespace spes {
struct ClusterStatus;
}

namespace spes::cli {

// Options every config-driven command shares.
struct ConfigOptions {
  std::string config;
  std::vector<std::string> overrides;  // --set section.key=value
  std::string log_level = "info";
};
void add_config_options(CLI::App& cmd, ConfigOptions& options);

void add_data_commands(CLI::App& app);
void add_train_command(CLI::App& app);
void add_node_command(CLI::App& app);
void add_model_commands(CLI::App& app);
void add_ckpt_commands(CLI::App& app);
void add_eval_commands(CLI::App& app);  // spes eval, spes generate
void add_coordinator_commands(CLI::App& app);
void add_ca_commands(CLI::App& app);  // spes ca: per-node certificates
// The table `spes coordinator status` prints (also used by launch-local).
void print_cluster_status(const ClusterStatus& status);
void add_launch_command(CLI::App& app);
void add_bench_commands(CLI::App& app);
void add_bench_sync(CLI::App& bench);  // tests/bench/bench_sync.cpp
void add_bench_generate(CLI::App& bench);  // tests/bench/bench_generate.cpp
void add_bench_tls(CLI::App& bench);  // tests/bench/bench_tls.cpp

}  // namespace spes::cli
