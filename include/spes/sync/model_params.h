// The bridge from the libtorch model to the torch-free sync module: every parameter of a
// MoeTransformer as a named fp32 buffer, experts tagged with their layer and index.
//
// On the CPU with fp32 parameters the buffers are the parameters themselves. On a GPU, or with
// bf16 frozen experts, they are a page-locked fp32 host copy that to_host() fills before a round
// (one device-to-host transfer) and to_model() writes back after it (one transfer the other way);
// so are they, on request, for overlapped rounds.
#pragma once

#include <memory>
#include <vector>

#include <ATen/core/Tensor.h>

#include "spes/model/transformer.h"
#include "spes/sync/params.h"

namespace spes {

class ModelParamMirror {
 public:
  // The model must outlive the mirror. Fills the buffers once. `always_staged`: a host copy even
  // where the parameters could serve as the buffers (overlapped rounds train while the round
  // works on the buffers).
  explicit ModelParamMirror(MoeTransformer& model, bool always_staged = false);
  ~ModelParamMirror();

  ParamSet& params() { return params_; }
  const ParamSet& params() const { return params_; }
  // True when the buffers are a host copy (GPU, or non-fp32 parameters), false when they are
  // the parameters' own storage.
  bool staged() const;
  // Model → buffers (before a round); a no-op when not staged. `only`: just these parameters
  // (ParamSet indices; a round of one fragment), each its own transfer; null = all at once.
  void to_host(const std::vector<std::size_t>* only = nullptr);
  // Buffers → model (after a round), converting to each parameter's dtype; a no-op when not
  // staged. `only` as for to_host().
  void to_model(const std::vector<std::size_t>* only = nullptr);
  // The model parameter behind params()[i].
  const at::Tensor& parameter(std::size_t i) const;

 private:
  struct Host;
  MoeTransformer model_;
  std::unique_ptr<Host> host_;
  ParamSet params_;
};

}  // namespace spes
