#include "spes/dist/node_group.h"

#include <spdlog/spdlog.h>
#include <torch/csrc/autograd/functions/accumulate_grad.h>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#include <torch/torch.h>
#ifdef USE_C10D_NCCL
#include <c10/cuda/CUDAFunctions.h>
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

#include <chrono>
#include <map>
#include <mutex>
#include <unordered_set>

#include "spes/util/error.h"

namespace spes {

namespace {

std::chrono::milliseconds to_ms(double seconds) {
  return std::chrono::milliseconds(static_cast<std::int64_t>(seconds * 1000));
}

}  // namespace

std::string resolve_backend(const Config& config, const c10::Device& device) {
  const std::string& want = config.node.backend;
  if (want == "auto") return device.is_cuda() ? "nccl" : "gloo";
  if (want == "nccl" && !device.is_cuda())
    raise(ErrorKind::Config, "{}: nccl needs CUDA devices, and this node trains on {} (train.device): use gloo or "
          "auto", config.where("node.backend"), device.str());
  return want;
}

// ---- RendezvousServer ----

struct RendezvousServer::Impl {
  c10::intrusive_ptr<c10d::TCPStore> store;
};

RendezvousServer::RendezvousServer(double timeout_s) : impl_(std::make_unique<Impl>()) {
  c10d::TCPStoreOptions options;
  options.port = 0;  // a free port, read back below
  options.isServer = true;
  options.waitWorkers = false;
  options.timeout = to_ms(timeout_s);
  try {
    impl_->store = c10::make_intrusive<c10d::TCPStore>("127.0.0.1", options);
  } catch (const std::exception& e) {
    raise(ErrorKind::Io, "cannot start the node's rendezvous store on 127.0.0.1: {}", e.what());
  }
}

RendezvousServer::~RendezvousServer() = default;

int RendezvousServer::port() const { return impl_->store->getPort(); }

// ---- NodeGroup ----

struct NodeGroup::Impl {
  RankContext context;
  std::string backend_name;
  c10::Device device{c10::kCPU};
  c10::intrusive_ptr<c10d::Store> store;
  c10::intrusive_ptr<c10d::Backend> backend;

  // Waits for a collective; a timeout or a vanished peer becomes Error(Peer).
  void wait(const c10::intrusive_ptr<c10d::Work>& work, const char* what) const {
    try {
      work->wait();
    } catch (const std::exception& e) {
      raise(ErrorKind::Peer, "node-local {} failed on {} ({}): {} (another rank of this node died or hangs; the node "
            "stops, restart it with --resume)", what, context.describe(), backend_name, e.what());
    }
  }
  c10::intrusive_ptr<c10d::Work> all_reduce_async(torch::Tensor& tensor) {
    std::vector<torch::Tensor> list{tensor};
    return backend->allreduce(list, c10d::AllreduceOptions{});
  }
};

NodeGroup::NodeGroup(const RankContext& context, const std::string& backend, const c10::Device& device,
                     double timeout_s)
    : impl_(std::make_unique<Impl>()) {
  impl_->context = context;
  impl_->backend_name = backend;
  impl_->device = device;
  try {
    c10d::TCPStoreOptions options;
    options.port = static_cast<std::uint16_t>(context.store_port);
    options.isServer = false;
    options.waitWorkers = false;
    options.timeout = to_ms(timeout_s);
    impl_->store = c10::make_intrusive<c10d::TCPStore>(context.store_host, options);
    if (backend == "gloo") {
      auto gloo = c10d::ProcessGroupGloo::Options::create(to_ms(timeout_s));
      gloo->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1"));
      impl_->backend = c10::make_intrusive<c10d::ProcessGroupGloo>(impl_->store, context.rank, context.ranks, gloo);
    } else if (backend == "nccl") {
#ifdef USE_C10D_NCCL
      c10::cuda::set_device(device.index());
      auto nccl = c10d::ProcessGroupNCCL::Options::create();
      nccl->timeout = to_ms(timeout_s);
      impl_->backend = c10::make_intrusive<c10d::ProcessGroupNCCL>(impl_->store, context.rank, context.ranks, nccl);
#else
      raise(ErrorKind::Config, "this libtorch was built without NCCL: use node.backend gloo");
#endif
    } else {
      raise(ErrorKind::Config, "unknown node backend '{}'", backend);
    }
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {
    raise(ErrorKind::Peer, "{}: cannot join the node's {} process group at {}:{}: {}", context.describe(), backend,
          context.store_host, context.store_port, e.what());
  }
}

NodeGroup::~NodeGroup() = default;

int NodeGroup::rank() const { return impl_->context.rank; }
int NodeGroup::ranks() const { return impl_->context.ranks; }
const std::string& NodeGroup::backend() const { return impl_->backend_name; }

void NodeGroup::all_reduce_sum(torch::Tensor& tensor) { impl_->wait(impl_->all_reduce_async(tensor), "all-reduce"); }

void NodeGroup::broadcast(const std::vector<torch::Tensor>& tensors, int root, std::int64_t bucket_bytes) {
  torch::NoGradGuard no_grad;
  // Flat buckets of one dtype each, in list order: the same buckets on every rank.
  std::map<c10::ScalarType, std::vector<std::size_t>> by_dtype;
  for (std::size_t i = 0; i < tensors.size(); ++i) by_dtype[tensors[i].scalar_type()].push_back(i);
  for (const auto& [dtype, indices] : by_dtype) {
    std::size_t begin = 0;
    while (begin < indices.size()) {
      std::size_t end = begin;
      std::int64_t bytes = 0;
      while (end < indices.size() && (end == begin || bytes + tensors[indices[end]].nbytes() <= bucket_bytes))
        bytes += static_cast<std::int64_t>(tensors[indices[end++]].nbytes());
      std::vector<torch::Tensor> parts;
      for (std::size_t k = begin; k < end; ++k) parts.push_back(tensors[indices[k]].reshape(-1));
      std::vector<torch::Tensor> flat{torch::cat(parts)};
      c10d::BroadcastOptions options;
      options.rootRank = root;
      impl_->wait(impl_->backend->broadcast(flat, options), "broadcast");
      std::int64_t offset = 0;
      for (std::size_t k = begin; k < end; ++k) {
        const auto& t = tensors[indices[k]];
        t.copy_(flat[0].narrow(0, offset, t.numel()).view(t.sizes()));
        offset += t.numel();
      }
      begin = end;
    }
  }
}

std::int64_t NodeGroup::max(std::int64_t value) {
  auto t = torch::full({1}, value, torch::TensorOptions().dtype(torch::kInt64).device(impl_->device));
  std::vector<torch::Tensor> list{t};
  c10d::AllreduceOptions options;
  options.reduceOp = c10d::ReduceOp::MAX;
  impl_->wait(impl_->backend->allreduce(list, options), "all-reduce (max)");
  return t.cpu().item<std::int64_t>();
}

void NodeGroup::barrier() { impl_->wait(impl_->backend->barrier(c10d::BarrierOptions{}), "barrier"); }

// ---- gradient averaging ----

namespace {

// DDP's scheme, small: the trainable parameters in buckets (in reverse order, roughly the
// order backward produces their gradients); a hook on each parameter copies its finished
// gradient into its bucket, and a full bucket is all-reduced at once while backward goes on.
// Buckets start strictly in order, so every rank issues the same collectives in the same order
// whatever order its hooks fire in (routing differs between ranks).
class BucketedGradientSync final : public GradientSync {
 public:
  BucketedGradientSync(NodeGroup::Impl& group, double bucket_mb)
      : group_(group), bucket_bytes_(static_cast<std::int64_t>(bucket_mb * (1 << 20))) {}
  ~BucketedGradientSync() override { remove_hooks(); }

  int rank() const override { return group_.context.rank; }
  int ranks() const override { return group_.context.ranks; }

  void attach(const std::vector<torch::Tensor>& trainable) override {
    std::lock_guard lock(mutex_);
    remove_hooks();
    slots_.clear();
    buckets_.clear();
    std::int64_t bucket_used = 0;
    for (std::size_t k = trainable.size(); k-- > 0;) {
      const auto& p = trainable[k];
      const std::int64_t bytes = static_cast<std::int64_t>(p.nbytes());
      if (buckets_.empty() || bucket_used + bytes > bucket_bytes_ || buckets_.back().dtype != p.scalar_type()) {
        buckets_.push_back(Bucket{});
        buckets_.back().dtype = p.scalar_type();
        bucket_used = 0;
      }
      Bucket& b = buckets_.back();
      slots_.push_back(Slot{p, buckets_.size() - 1, b.numel});
      b.slots.push_back(slots_.size() - 1);
      b.numel += p.numel();
      bucket_used += bytes;
    }
    for (auto& b : buckets_)
      b.flat = torch::zeros({b.numel}, torch::TensorOptions().dtype(b.dtype).device(group_.device));
    for (std::size_t i = 0; i < slots_.size(); ++i) {
      auto& p = slots_[i].param;
      const unsigned id = p.register_hook([this, i](torch::Tensor grad) { on_gradient(i, grad); });
      hooks_.push_back({p, id});
    }
    reset();
  }

  void before_backward(bool last_micro, const torch::Tensor& loss) override {
    std::lock_guard lock(mutex_);
    armed_ = last_micro;
    if (!armed_) return;
    // Parameters this backward will not reach (an owned expert no token of this rank's batch
    // went to) are done already: mark them now, or their bucket would hold back every later one
    // until backward ends (DDP's find_unused_parameters).
    const auto reached = parameters_reached_from(loss);
    for (std::size_t i = 0; i < slots_.size(); ++i)
      if (!reached.count(slots_[i].param.unsafeGetTensorImpl())) {
        fill(i, torch::Tensor());
        --buckets_[slots_[i].bucket].pending;
      }
    launch_ready();
  }

  void finish_gradients() override {
    torch::NoGradGuard no_grad;
    std::lock_guard lock(mutex_);
    armed_ = false;
    // Parameters that got no gradient in the last micro-batch: what they have accumulated.
    for (std::size_t b = next_launch_; b < buckets_.size(); ++b)
      for (std::size_t i : buckets_[b].slots)
        if (!slots_[i].filled) fill(i, torch::Tensor());
    report_ = {static_cast<int>(buckets_.size()), static_cast<int>(next_launch_)};
    for (auto& b : buckets_) b.pending = 0;
    launch_ready();
    const double scale = 1.0 / static_cast<double>(group_.context.ranks);
    for (auto& b : buckets_) {
      group_.wait(b.work, "gradient all-reduce");
      b.work.reset();
      b.flat.mul_(scale);
    }
    for (auto& s : slots_) {
      auto averaged = buckets_[s.bucket].flat.narrow(0, s.offset, s.param.numel()).view(s.param.sizes());
      if (s.param.grad().defined()) s.param.mutable_grad().copy_(averaged);
      else s.param.mutable_grad() = averaged.clone();
    }
    reset();
  }

  void sum(torch::Tensor& values) override { group_.wait(group_.all_reduce_async(values), "all-reduce"); }

  StepReport last_step() const override { return report_; }

 private:
  struct Slot {
    torch::Tensor param;
    std::size_t bucket;
    std::int64_t offset;
    bool filled = false;
  };
  struct Bucket {
    c10::ScalarType dtype = c10::kFloat;
    std::vector<std::size_t> slots;
    std::int64_t numel = 0;
    torch::Tensor flat;
    std::size_t pending = 0;
    c10::intrusive_ptr<c10d::Work> work;
  };

  // The leaf tensors whose gradient backward from `loss` accumulates (its AccumulateGrad nodes).
  static std::unordered_set<const c10::TensorImpl*> parameters_reached_from(const torch::Tensor& loss) {
    std::unordered_set<const c10::TensorImpl*> reached;
    std::unordered_set<const torch::autograd::Node*> seen;
    std::vector<torch::autograd::Node*> stack{loss.grad_fn().get()};
    while (!stack.empty()) {
      torch::autograd::Node* node = stack.back();
      stack.pop_back();
      if (!node || !seen.insert(node).second) continue;
      if (auto* leaf = dynamic_cast<torch::autograd::AccumulateGrad*>(node))
        reached.insert(leaf->variable.unsafeGetTensorImpl());
      for (const auto& edge : node->next_edges()) stack.push_back(edge.function.get());
    }
    return reached;
  }

  // Runs in backward (autograd's thread for the device) when the gradient of slots_[i] for
  // this backward is complete; the parameter's .grad does not include it yet.
  void on_gradient(std::size_t i, const torch::Tensor& grad) {
    torch::NoGradGuard no_grad;
    std::lock_guard lock(mutex_);
    if (!armed_ || slots_[i].filled) return;
    fill(i, grad);
    if (--buckets_[slots_[i].bucket].pending == 0) launch_ready();
  }

  // This step's local gradient of slot i: what earlier micro-batches accumulated plus `grad`.
  void fill(std::size_t i, const torch::Tensor& grad) {
    Slot& s = slots_[i];
    auto view = buckets_[s.bucket].flat.narrow(0, s.offset, s.param.numel());
    const auto& accumulated = s.param.grad();
    if (accumulated.defined() && grad.defined()) view.copy_((accumulated + grad).reshape(-1));
    else if (grad.defined()) view.copy_(grad.reshape(-1));
    else if (accumulated.defined()) view.copy_(accumulated.reshape(-1));
    else view.zero_();
    s.filled = true;
  }

  void launch_ready() {
    while (next_launch_ < buckets_.size() && buckets_[next_launch_].pending == 0) {
      Bucket& b = buckets_[next_launch_++];
      b.work = group_.all_reduce_async(b.flat);
    }
  }

  void reset() {
    for (auto& s : slots_) s.filled = false;
    for (auto& b : buckets_) b.pending = b.slots.size();
    next_launch_ = 0;
    armed_ = false;
  }

  void remove_hooks() {
    for (auto& [param, id] : hooks_) param.remove_hook(id);
    hooks_.clear();
  }

  NodeGroup::Impl& group_;
  std::int64_t bucket_bytes_;
  std::mutex mutex_;
  std::vector<Slot> slots_;
  std::vector<Bucket> buckets_;
  std::vector<std::pair<torch::Tensor, unsigned>> hooks_;
  std::size_t next_launch_ = 0;
  bool armed_ = false;
  StepReport report_;
};

}  // namespace

std::unique_ptr<GradientSync> NodeGroup::make_gradient_sync(double bucket_mb) {
  return std::make_unique<BucketedGradientSync>(*impl_, bucket_mb);
}

}  // namespace spes
