// A node's ranks as one c10d process group (PyTorch's distributed engine): a TCPStore
// rendezvous on loopback and ProcessGroupNCCL on CUDA or ProcessGroupGloo on the CPU, with the
// collectives a node needs: gradient averaging in buckets overlapped with backward
// (GradientSync), sums, broadcasts of the weights from rank 0, and an agreed stop.
//
// c10d's own headers stay in src/dist/node_group.cpp.
#pragma once

#include <c10/core/Device.h>
#include <torch/types.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "spes/config/config.h"
#include "spes/dist/rank_context.h"
#include "spes/train/grad_sync.h"

namespace spes {

// node.backend resolved for the device a rank trains on: auto = nccl on CUDA, gloo on the CPU.
// Error(Config) naming node.backend for nccl without a CUDA device.
std::string resolve_backend(const Config& config, const c10::Device& device);

// The store the ranks meet at, served by the process that launches them (bound to 127.0.0.1
// on a free port).
class RendezvousServer {
 public:
  explicit RendezvousServer(double timeout_s);
  ~RendezvousServer();
  int port() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

class NodeGroup {
 public:
  // Joins the node's rendezvous and builds the process group; every collective gives up after
  // timeout_s (a rank that died or hangs), throwing Error(Peer) that names the node's ranks.
  NodeGroup(const RankContext& context, const std::string& backend, const c10::Device& device, double timeout_s);
  ~NodeGroup();
  NodeGroup(const NodeGroup&) = delete;
  NodeGroup& operator=(const NodeGroup&) = delete;

  int rank() const;
  int ranks() const;
  const std::string& backend() const;

  // In place, over all ranks.
  void all_reduce_sum(torch::Tensor& tensor);
  // Rank `root`'s values into every rank's tensors, in place (any dtypes and shapes, the same
  // list on every rank), in flat buckets of about bucket_bytes.
  void broadcast(const std::vector<torch::Tensor>& tensors, int root = 0, std::int64_t bucket_bytes = 64 << 20);
  // The largest of the ranks' values (e.g. "a stop was requested here").
  std::int64_t max(std::int64_t value);
  void barrier();

  // Gradient averaging for the Trainer (TrainerOptions::grad_sync) in buckets of bucket_mb MiB.
  std::unique_ptr<GradientSync> make_gradient_sync(double bucket_mb);

  struct Impl;  // c10d's store and backend (src/dist/node_group.cpp)

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace spes
