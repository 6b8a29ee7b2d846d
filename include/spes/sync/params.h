// The model's parameters as the sync module sees them: named, shaped fp32 buffers that the
// model owns, classified as shared or as one expert's. Torch-free, so the whole sync module
// (and its tests) works on plain float arrays; src/sync/model_params.cpp builds a ParamSet
// from a MoeTransformer.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace spes {

struct ParamRef {
  std::string name;
  std::vector<std::int64_t> shape;
  float* data = nullptr;   // contiguous, row-major; written in place by a sync round
  std::int64_t numel = 0;
  int layer = -1;          // experts only
  int expert = -1;         // experts only; -1 = shared parameter
  bool is_expert() const { return expert >= 0; }
  // Row length (last dimension), used as the int8 block size.
  std::int64_t row() const { return shape.empty() ? 1 : shape.back(); }
};

// A contiguous flat range of one parameter.
struct ParamRange {
  std::size_t param = 0;  // index into ParamSet::params()
  std::int64_t offset = 0;
  std::int64_t count = 0;
};

class ParamSet {
 public:
  ParamSet() = default;
  explicit ParamSet(std::vector<ParamRef> params);

  const std::vector<ParamRef>& params() const { return params_; }
  const ParamRef& operator[](std::size_t i) const { return params_[i]; }
  std::size_t size() const { return params_.size(); }
  // Index of the parameter with this name, or -1.
  long find(const std::string& name) const;

  std::int64_t shared_numel() const { return shared_numel_; }
  std::int64_t expert_numel(int expert) const;  // all layers
  int n_experts() const { return n_experts_; }
  // Whole tensors of expert e, all layers, in registration order.
  std::vector<ParamRange> expert_ranges(int expert) const;
  // Slice k of n of the shared parameters: the flat concatenation of every shared tensor in
  // registration order, cut into n nearly equal element ranges.
  std::vector<ParamRange> shared_slice(int k, int n) const;
  // The same over some of the shared tensors only (indices into params(), in registration order).
  std::vector<ParamRange> shared_slice(int k, int n, const std::vector<std::size_t>& tensors) const;
  // The model cut into `count` fragments for staggered rounds (sync.fragments): per fragment the
  // indices of its tensors. Shared tensors go whole, in registration order, into fragments of
  // nearly equal element counts; experts by layer (layer l into fragment l * count / n_layers).
  // Every tensor is in exactly one fragment; with count 1 all are in fragment 0.
  std::vector<std::vector<std::size_t>> fragments(int count) const;
  // The tensors of expert e in layer l (gate/up/down order as registered).
  std::vector<std::size_t> expert_tensors(int layer, int expert) const;
  int n_layers() const { return n_layers_; }

 private:
  std::vector<ParamRef> params_;
  std::vector<std::size_t> shared_;  // indices of shared params
  std::int64_t shared_numel_ = 0;
  int n_experts_ = 0, n_layers_ = 0;
};

}  // namespace spes
