// The SPES expert-merging warm-up (SPES.md): per layer, every expert is blended with the mean of
// its K most similar experts (cosine similarity of the flattened gate_proj W1), all computed from
// the pre-merge weights (a simultaneous update):
//   theta_i <- (1 - alpha) * theta_i + alpha * mean_{j in N_i} theta_j.
// Every node runs it on the same synced weights; the arithmetic is plain sequential loops in
// double precision with a fixed order and index tie-breaks, so every machine gets the same bits.
#pragma once

#include <cstdint>
#include <vector>

#include "spes/config/config.h"
#include "spes/sync/params.h"

namespace spes {

// alpha(t) = alpha_0 * (1 - min(t / T, 1)); 0 when the warm-up is over or off.
double merge_alpha(const MergeConfig& config, std::int64_t step);
// True when a sync at `step` also merges: step is a multiple of merge.every and alpha(step) > 0.
bool merge_due(const MergeConfig& config, std::int64_t step);

// For each expert of one layer, its top-k most similar other experts by cosine similarity of
// `gate` (one flattened W1 per expert), most similar first; ties go to the lower index.
std::vector<std::vector<int>> most_similar_experts(const std::vector<const float*>& gate, std::int64_t numel,
                                                   int top_k);

// The latest step in (after, upto] at which a merge is due, or 0. A fragment's round (sync.fragments)
// merges its layers for the merge step that fell since that fragment's previous round.
std::int64_t merge_step_in(const MergeConfig& config, std::int64_t after, std::int64_t upto);

// Applies the merge in place to the given layers of `params` (empty: every layer). top_k is
// capped at n_experts - 1.
void merge_experts(const ParamSet& params, double alpha, int top_k, const std::vector<int>& layers = {});

}  // namespace spes
