// Using a trained model outside training: build it from a checkpoint folder, measure its
// validation loss on a token shard (`spes eval`), and sample text from it with a KV cache
// (`spes generate`).
#pragma once

#include <cstdint>
#include <random>
#include <vector>

#include "spes/ckpt/shard.h"
#include "spes/config/config.h"
#include "spes/data/shard.h"
#include "spes/model/transformer.h"
#include "spes/train/metrics.h"

namespace spes {

// The model a folder describes, with its weights (Error(Checkpoint) for a missing or misshaped one).
MoeTransformer build_model(const Shard& folder);

// Mean cross-entropy per token (and perplexity) over the first `windows` validation windows of
// seq_len tokens of `shard` (0, or more than it holds: every whole window once), run in forward
// passes of up to `batch_size` windows. The batch size changes only the speed, not which tokens
// count. Error(Data) when the shard is shorter than one window.
EvalStats evaluate_model(MoeTransformer& model, const TokenShard& shard, std::int64_t seq_len,
                         std::int64_t batch_size, std::int64_t windows);

struct SamplingOptions {
  double temperature = 1.0;  // 0 = greedy (argmax)
  std::int64_t top_k = 0;    // keep the k most likely tokens; 0 = all
  double top_p = 1.0;        // keep the smallest set whose probability reaches p; 1 = all
};

// One token drawn from `logits` (one row, fp32) after temperature, top-k and top-p. Ties in
// ranking go to the lower id, so a draw depends on the logits and the generator only.
std::uint32_t sample_token(const std::vector<float>& logits, const SamplingOptions& options, std::mt19937_64& rng);

struct GenerateOptions {
  SamplingOptions sampling;
  std::int64_t max_tokens = 64;
  std::uint64_t seed = 6198;
  bool use_cache = true;  // false: rerun the whole sequence for every token (the reference)
  std::int64_t stop_token = -1;  // end early after this token (eos); -1 = never
};

// The prompt's continuation: up to max_tokens new ids (fewer when stop_token comes, which is
// included, or the context is full).
std::vector<std::uint32_t> generate(MoeTransformer& model, const std::vector<std::uint32_t>& prompt,
                                    const GenerateOptions& options);

}  // namespace spes
