// Checks the parameter dumps of a multi-process SPES run (sync.dump_dir), computed
// independently of the sync module: after each round every node holds bit-identical
// parameters, equal to shared = fp32 mean of the nodes' pre-round copies (summed in node-id
// order, then divided), expert e = its owner's pre-round copy (contiguous ownership).
// --landed (sync.overlap): also that each node, where the round landed, holds
//   trained tensors (shared, its own experts):  post + (landing - pre)
//   the other experts:                          post
//   tensors the round did not carry:            unchanged (landing)
// from the weights it landed on (roundR_landing) and left (roundR_landed).
// With sync.fragments a round's dumps hold the tensors it carried only; --fragments F also checks
// that rounds 1..F carried every tensor of the model exactly once.
// usage: sync_check DUMP_DIR N_NODES ROUNDS [--identical-only | --landed] [--fragments F]
#include <cstdio>
#include <cstring>
#include <regex>
#include <string>

#include "spes/util/error.h"
#include "spes/util/safetensors.h"

using spes::LoadedTensor;
using Dump = std::map<std::string, LoadedTensor>;

int main(int argc, char** argv) {
  if (argc < 4) {
    std::fprintf(stderr, "usage: sync_check DUMP_DIR N_NODES ROUNDS [--identical-only | --landed]\n");
    return 2;
  }
  const std::string dir = argv[1];
  const int n = std::stoi(argv[2]), rounds = std::stoi(argv[3]);
  bool identical_only = false, landed = false;
  int fragments = 0;
  for (int a = 4; a < argc; ++a) {
    if (std::strcmp(argv[a], "--identical-only") == 0) identical_only = true;
    else if (std::strcmp(argv[a], "--landed") == 0) landed = true;
    else if (std::strcmp(argv[a], "--fragments") == 0 && a + 1 < argc) fragments = std::stoi(argv[++a]);
    else {
      std::fprintf(stderr, "sync_check: unknown argument '%s'\n", argv[a]);
      return 2;
    }
  }
  std::map<std::string, int> carried;  // tensor -> rounds among 1..fragments that carried it
  static const std::regex expert_name(R"(layers\.\d+\.mlp\.experts\.(\d+)\..*)");
  int failures = 0;
  try {
    for (int r = 1; r <= rounds; ++r) {
      std::vector<Dump> pre, post;
      for (int i = 0; i < n; ++i) {
        pre.push_back(spes::read_safetensors(dir + "/node" + std::to_string(i) + "/round" + std::to_string(r) + "_pre.safetensors"));
        post.push_back(spes::read_safetensors(dir + "/node" + std::to_string(i) + "/round" + std::to_string(r) + "_post.safetensors"));
      }
      int n_experts = 0;
      std::smatch m;
      for (const auto& [name, t] : pre[0])
        if (std::regex_match(name, m, expert_name)) n_experts = std::max(n_experts, std::stoi(m[1]) + 1);
      const int per_node = n_experts / n;
      std::size_t checked = 0;
      for (const auto& [name, t0] : post[0]) {
        if (r <= fragments) ++carried[name];
        for (int i = 1; i < n; ++i)
          if (post[i].at(name).values != t0.values) {
            std::printf("round %d: %s differs between node 0 and node %d\n", r, name.c_str(), i);
            ++failures;
          }
        if (identical_only) continue;
        std::vector<float> want;
        if (std::regex_match(name, m, expert_name)) {
          want = pre[static_cast<std::size_t>(std::stoi(m[1]) / per_node)].at(name).values;
        } else {
          want = pre[0].at(name).values;
          for (int i = 1; i < n; ++i) {
            const auto& v = pre[i].at(name).values;
            for (std::size_t x = 0; x < want.size(); ++x) want[x] += v[x];
          }
          for (auto& v : want) v /= static_cast<float>(n);
        }
        if (want != t0.values) {
          std::printf("round %d: %s is not the SPES result\n", r, name.c_str());
          ++failures;
        }
        ++checked;
      }
      for (int i = 0; landed && i < n; ++i) {
        const std::string base = dir + "/node" + std::to_string(i) + "/round" + std::to_string(r);
        const Dump before = spes::read_safetensors(base + "_landing.safetensors");
        const Dump after = spes::read_safetensors(base + "_landed.safetensors");
        for (const auto& [name, got] : after) {
          const bool trained = !std::regex_match(name, m, expert_name) || std::stoi(m[1]) / per_node == i;
          if (!post[i].count(name)) {  // not in this round's fragment: the landing leaves it alone
            if (before.at(name).values != got.values) {
              std::printf("round %d: node %d landing changed %s, which the round did not carry\n", r, i, name.c_str());
              ++failures;
            }
            continue;
          }
          std::vector<float> want = post[i].at(name).values;
          if (trained) {
            const auto &now = before.at(name).values, &snap = pre[i].at(name).values;
            for (std::size_t x = 0; x < want.size(); ++x) want[x] += now[x] - snap[x];
          }
          if (want != got.values) {
            std::printf("round %d: node %d landed %s at the wrong value\n", r, i, name.c_str());
            ++failures;
          }
        }
      }
      std::printf("round %d: %zu tensors on %d nodes %s%s\n", r, post[0].size(), n,
                  failures ? "MISMATCH" : (identical_only ? "identical" : "identical and equal to the SPES result"),
                  landed && !failures ? "; landed as R + (theta_now - theta_snap)" : "");
    }
    if (fragments > 0) {
      const Dump all = spes::read_safetensors(dir + "/node0/round" + std::to_string(rounds) + "_landed.safetensors");
      for (const auto& [name, t] : all)
        if (carried[name] != 1) {
          std::printf("rounds 1..%d carried %s %d times (once expected)\n", fragments, name.c_str(), carried[name]);
          ++failures;
        }
      if (failures == 0)
        std::printf("rounds 1..%d carried each of the %zu tensors exactly once\n", fragments, all.size());
    }
  } catch (const spes::Error& e) {
    std::printf("error: %s\n", e.what());
    return 1;
  }
  return failures == 0 ? 0 : 1;
}
