// In-process helpers for the sync tests: a fake model (plain float buffers laid out like the
// real one) and node configs on loopback ports.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <fmt/format.h>

#include <random>
#include <string>
#include <vector>

#include "spes/config/config.h"
#include "spes/sync/params.h"

namespace spes::test {

// A free TCP port on 127.0.0.1 (bound, read, released).
inline int free_port() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr);
  socklen_t len = sizeof addr;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  ::close(fd);
  return ntohs(addr.sin_port);
}

// Shared tensors and experts with the model's names; values drawn from `seed`.
struct FakeModel {
  std::vector<std::vector<float>> storage;
  ParamSet params;

  FakeModel(int n_layers, int n_experts, int d, int f, int vocab, unsigned seed, float scale = 0.02f) {
    std::vector<ParamRef> refs;
    auto add = [&](std::string name, std::vector<std::int64_t> shape, int layer, int expert) {
      ParamRef r;
      r.name = std::move(name);
      r.shape = shape;
      r.numel = 1;
      for (auto s : shape) r.numel *= s;
      r.layer = layer;
      r.expert = expert;
      refs.push_back(r);
    };
    add("embed_tokens.weight", {vocab, d}, -1, -1);
    for (int l = 0; l < n_layers; ++l) {
      add(fmt::format("layers.{}.input_layernorm.weight", l), {d}, -1, -1);
      add(fmt::format("layers.{}.self_attn.q_proj.weight", l), {d, d}, -1, -1);
      add(fmt::format("layers.{}.mlp.gate.weight", l), {n_experts, d}, -1, -1);
      for (int e = 0; e < n_experts; ++e) {
        add(fmt::format("layers.{}.mlp.experts.{}.gate_proj.weight", l, e), {f, d}, l, e);
        add(fmt::format("layers.{}.mlp.experts.{}.up_proj.weight", l, e), {f, d}, l, e);
        add(fmt::format("layers.{}.mlp.experts.{}.down_proj.weight", l, e), {d, f}, l, e);
      }
    }
    add("lm_head.weight", {vocab, d}, -1, -1);
    std::mt19937 gen(seed);
    std::normal_distribution<float> normal(0.0f, scale);
    storage.resize(refs.size());
    for (std::size_t i = 0; i < refs.size(); ++i) {
      storage[i].resize(static_cast<std::size_t>(refs[i].numel));
      for (auto& v : storage[i]) v = 1.0f + normal(gen);  // away from 0: relative bounds stay meaningful
      refs[i].data = storage[i].data();
    }
    params = ParamSet(std::move(refs));
  }
  // Copy of every value, for before/after comparisons.
  std::vector<std::vector<float>> values() const { return storage; }
};

inline constexpr int kLayers = 2, kExperts = 4, kDim = 16, kFf = 32, kVocab = 40;

// YAML for node `id` of `ports.size()` nodes on loopback; `extra` is appended to the sync section.
inline std::string node_yaml(int id, const std::vector<int>& ports, const std::string& extra = "",
                             const std::string& top_extra = "") {
  std::string peers;
  for (std::size_t p = 0; p < ports.size(); ++p)
    peers += fmt::format("    - {{id: {}, address: \"127.0.0.1:{}\"}}\n", p, ports[p]);
  return fmt::format(
      "run: {{name: synctest, node_id: {}}}\n"
      "model: {{vocab_size: {}, d_model: {}, n_layers: {}, n_heads: 2, d_ff: {}, n_experts: {}, top_k: 2}}\n"
      "merge: {{alpha: 0}}\n{}"
      "sync:\n  every: 1\n  token: sesame\n  round_timeout_s: 20\n  peer_wait_s: 1\n  retry_backoff_s: 0.05\n"
      "  peers:\n{}{}",
      id, kVocab, kDim, kLayers, kFf, kExperts, top_extra, peers, extra);
}

}  // namespace spes::test
