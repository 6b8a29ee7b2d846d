// The bridge from the libtorch model to the torch-free sync module: every parameter of a
// MoeTransformer as a named fp32 buffer, experts tagged with their layer and index.
#pragma once

#include "spes/model/transformer.h"
#include "spes/sync/params.h"

namespace spes {

// The model must outlive the ParamSet (it points into the parameters' storage).
ParamSet model_param_set(MoeTransformer& model);

}  // namespace spes
