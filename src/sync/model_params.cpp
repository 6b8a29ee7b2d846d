#include "spes/sync/model_params.h"

#include <torch/torch.h>

#include <regex>

#include "spes/util/error.h"

namespace spes {

ParamSet model_param_set(MoeTransformer& model) {
  static const std::regex expert_name(R"(layers\.(\d+)\.mlp\.experts\.(\d+)\..*)");
  std::vector<ParamRef> refs;
  for (auto& p : model->named_parameters()) {
    torch::Tensor t = p.value();
    SPES_CHECK(t.is_contiguous() && t.scalar_type() == torch::kFloat32 && t.device().is_cpu(), p.key());
    ParamRef r;
    r.name = p.key();
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
  return ParamSet(std::move(refs));
}

}  // namespace spes
