// `spes ckpt upcycle`: a dense model becomes an MoE (SPES.md, "Upcycling"): embeddings,
// attention, norms and LM head copied; the dense MLP copied into every expert, with N(0, std)
// noise added to a random fraction of each expert's entries; the router zeros or normal with the
// std of the dense down projection. Optimizer and schedule start fresh. Torch-free.
#pragma once

#include <cstdint>
#include <string>

#include "spes/ckpt/shard.h"

namespace spes {

struct UpcycleOptions {
  std::int64_t n_experts = 8;
  std::int64_t top_k = 2;
  bool norm_topk_prob = true;  // renormalize the top-k weights (the 9B recipe)
  double noise_fraction = 0.5;  // share of each expert's entries that get noise
  double noise_std = 0.02;
  std::string router = "normal";  // zeros | normal (std of the dense down projection)
  std::uint64_t seed = 6198;
};

// A dense model as a 1-expert folder in our names: a spes folder with model.n_experts 1, or a
// Hugging Face Llama / Mistral / Qwen3 dense folder (import_hf_dense). Error(Checkpoint) for
// anything else.
Shard read_dense_folder(const std::string& path);

// The MoE (kind "upcycled", step 0, no optimizer state) from a 1-expert `dense` model.
// Error(Usage) for impossible options.
Shard upcycle(const Shard& dense, const UpcycleOptions& options);

}  // namespace spes
