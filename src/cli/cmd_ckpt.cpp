// spes ckpt: what checkpoint shards hold.
#include <cstdio>
#include <filesystem>

#include "commands.h"
#include "spes/train/checkpoint.h"
#include "spes/util/error.h"
#include "spes/util/progress.h"

namespace spes::cli {
namespace {

void print_shard(const Shard& s) {
  const ShardInfo& i = s.info;
  std::printf("%s: verified (%zu tensors, %s)\n", i.path.c_str(), s.model.size() + s.optimizer.size(),
              format_bytes(static_cast<double>(i.bytes)).c_str());
  std::printf("  node %d, step %lld, sync round %llu, data position epoch %llu window %llu\n", i.node_id,
              static_cast<long long>(i.step), static_cast<unsigned long long>(i.sync_round),
              static_cast<unsigned long long>(i.loader.epoch), static_cast<unsigned long long>(i.loader.cursor));
  std::printf("  owned experts: %s; weights: %zu tensors; AdamW moments: %zu tensors; config hash %s\n",
              format_list(i.owned_experts).c_str(), s.model.size(), s.optimizer.size(), i.config_hash.c_str());
}

}  // namespace

void add_ckpt_commands(CLI::App& app) {
  auto* ckpt = app.add_subcommand("ckpt", "inspect checkpoint shards");
  ckpt->require_subcommand(1);
  auto* inspect = ckpt->add_subcommand("inspect", "verify a shard (or every shard in a folder) and print what it holds");
  auto path = std::make_shared<std::string>();
  inspect->add_option("PATH", *path, "a shard folder (step-NNNNNNNN) or a checkpoint folder")->required();
  inspect->callback([path] {
    namespace fs = std::filesystem;
    if (fs::exists(fs::path(*path) / "manifest.json")) {
      print_shard(read_shard(*path));
      return;
    }
    auto shards = list_shards(*path);
    if (shards.empty()) raise(ErrorKind::Checkpoint, "'{}' is neither a shard nor a folder of shards", *path);
    int broken = 0;
    for (const auto& name : shards) {
      try {
        print_shard(read_shard((fs::path(*path) / name).string()));
      } catch (const Error& e) {
        std::printf("%s: BROKEN: %s\n", (fs::path(*path) / name).c_str(), e.what());
        ++broken;
      }
    }
    if (broken > 0) raise(ErrorKind::Checkpoint, "{} of {} shard(s) in '{}' are broken", broken, shards.size(), *path);
  });
}

}  // namespace spes::cli
