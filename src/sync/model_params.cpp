#include "spes/sync/model_params.h"

#include <torch/torch.h>

#include <regex>

#include "spes/train/host_copy.h"
#include "spes/util/error.h"

namespace spes {

struct ModelParamMirror::Host {
  std::vector<torch::Tensor> params;  // the model's, in registration order
  bool staged = false;
  HostCopy copy;                      // when staged
};

ModelParamMirror::ModelParamMirror(MoeTransformer& model, bool always_staged)
    : model_(model), host_(std::make_unique<Host>()) {
  host_->staged = always_staged;
  static const std::regex expert_name(R"(layers\.(\d+)\.mlp\.experts\.(\d+)\..*)");
  auto named = model->named_parameters();
  for (auto& p : named) {
    const torch::Tensor& t = p.value();
    host_->params.push_back(t);
    if (!(t.device().is_cpu() && t.scalar_type() == torch::kFloat32 && t.is_contiguous())) host_->staged = true;
  }
  if (host_->staged) host_->copy = copy_to_host(host_->params);
  std::vector<ParamRef> refs;
  for (std::size_t i = 0; i < named.size(); ++i) {
    const torch::Tensor& t = host_->staged ? host_->copy.views[i] : host_->params[i];
    ParamRef r;
    r.name = named[i].key();
    r.shape.assign(t.sizes().begin(), t.sizes().end());
    r.data = t.data_ptr<float>();
    r.numel = t.numel();
    std::smatch m;
    if (std::regex_match(r.name, m, expert_name)) {
      r.layer = std::stoi(m[1]);
      r.expert = std::stoi(m[2]);
    }
    refs.push_back(std::move(r));
  }
  params_ = ParamSet(std::move(refs));
}

ModelParamMirror::~ModelParamMirror() = default;

bool ModelParamMirror::staged() const { return host_->staged; }

void ModelParamMirror::to_host(const std::vector<std::size_t>* only) {
  if (!host_->staged) {
    // The buffers are the parameters: they must still be where the ParamSet points.
    for (std::size_t i = 0; i < host_->params.size(); ++i)
      SPES_CHECK(host_->params[i].data_ptr() == params_[i].data, "a parameter's storage moved under the sync buffers");
    return;
  }
  if (only) {
    torch::NoGradGuard no_grad;
    for (std::size_t i : *only) host_->copy.views[i].copy_(host_->params[i]);
    return;
  }
  host_->copy = copy_to_host(host_->params, std::move(host_->copy));
}

void ModelParamMirror::to_model(const std::vector<std::size_t>* only) {
  if (!host_->staged) return;
  if (only) {
    torch::NoGradGuard no_grad;
    for (std::size_t i : *only) host_->params[i].copy_(host_->copy.views[i]);
    return;
  }
  copy_from_host(host_->copy, host_->params);
}

const at::Tensor& ModelParamMirror::parameter(std::size_t i) const { return host_->params.at(i); }

}  // namespace spes
