#include "spes/train/inference.h"

#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <numeric>

#include "spes/data/loader.h"
#include "spes/util/error.h"

namespace spes {
namespace {

torch::Tensor ids_tensor(const std::vector<std::uint32_t>& ids, std::int64_t from) {
  std::vector<std::int64_t> v(ids.begin() + from, ids.end());
  return torch::tensor(v, torch::kInt64).view({1, static_cast<std::int64_t>(v.size())});
}

std::vector<float> last_row(const torch::Tensor& logits) {
  auto row = logits[0][logits.size(1) - 1].to(torch::kCPU, torch::kFloat32).contiguous();
  return std::vector<float>(row.data_ptr<float>(), row.data_ptr<float>() + row.numel());
}

}  // namespace

MoeTransformer build_model(const Shard& folder) {
  MoeTransformer model(model_config_of(folder.info), 0);
  torch::NoGradGuard no_grad;
  for (auto& item : model->named_parameters()) {
    auto it = folder.model.find(item.key());
    if (it == folder.model.end()) raise(ErrorKind::Checkpoint, "'{}' has no weight '{}'", folder.info.path, item.key());
    if (it->second.shape != item.value().sizes().vec())
      raise(ErrorKind::Checkpoint, "'{}': weight '{}' has another shape than its model config says", folder.info.path,
            item.key());
    item.value().copy_(torch::from_blob(const_cast<float*>(it->second.values.data()), item.value().sizes()));
    item.value().set_requires_grad(false);
  }
  model->eval();
  return model;
}

EvalStats evaluate_model(MoeTransformer& model, const TokenShard& shard, std::int64_t seq_len,
                         std::int64_t batch_size, std::int64_t windows) {
  const std::int64_t available = validation_windows(shard, seq_len);
  if (windows <= 0 || windows > available) windows = std::max<std::int64_t>(1, available);
  torch::NoGradGuard no_grad;
  double sum = 0.0;  // sum over windows of each window's mean cross-entropy
  EvalStats e;
  for (std::int64_t first = 0; first < windows; first += batch_size) {
    const std::int64_t count = std::min(batch_size, windows - first);
    TokenBatch batch = validation_batch(shard, seq_len, first, count);
    auto to_tensor = [&](const std::vector<std::int64_t>& v) {
      return torch::from_blob(const_cast<std::int64_t*>(v.data()), {batch.batch, batch.seq_len}, torch::kInt64)
          .to(model->device());
    };
    ModelOutput out = model->forward(to_tensor(batch.inputs));
    sum += compute_loss(out, to_tensor(batch.targets), LossConfig{}).ce.item<double>() * static_cast<double>(count);
    e.tokens += batch.batch * batch.seq_len;
  }
  e.loss = sum / static_cast<double>(windows);
  e.perplexity = std::exp(e.loss);
  return e;
}

std::uint32_t sample_token(const std::vector<float>& logits, const SamplingOptions& o, std::mt19937_64& rng) {
  if (logits.empty()) raise(ErrorKind::Internal, "sample_token: no logits");
  std::vector<std::uint32_t> order(logits.size());
  std::iota(order.begin(), order.end(), 0u);
  std::stable_sort(order.begin(), order.end(), [&](std::uint32_t a, std::uint32_t b) { return logits[a] > logits[b]; });
  if (o.temperature <= 0) return order.front();
  std::size_t keep = order.size();
  if (o.top_k > 0) keep = std::min(keep, static_cast<std::size_t>(o.top_k));
  // Softmax at the temperature over the kept tokens, in double.
  std::vector<double> p(keep);
  const double top = logits[order.front()];
  double total = 0;
  for (std::size_t i = 0; i < keep; ++i) total += p[i] = std::exp((logits[order[i]] - top) / o.temperature);
  if (o.top_p < 1.0) {
    double mass = 0;
    std::size_t n = 0;
    while (n < keep && mass < o.top_p * total) mass += p[n++];
    keep = std::max<std::size_t>(n, 1);
    total = std::accumulate(p.begin(), p.begin() + static_cast<std::ptrdiff_t>(keep), 0.0);
  }
  const double u = std::uniform_real_distribution<double>(0.0, total)(rng);
  double acc = 0;
  for (std::size_t i = 0; i < keep; ++i)
    if ((acc += p[i]) > u) return order[i];
  return order[keep - 1];
}

std::vector<std::uint32_t> generate(MoeTransformer& model, const std::vector<std::uint32_t>& prompt,
                                    const GenerateOptions& o) {
  if (prompt.empty()) raise(ErrorKind::Usage, "generate: the prompt has no tokens");
  const std::int64_t context = model->config().max_seq_len;
  if (static_cast<std::int64_t>(prompt.size()) >= context)
    raise(ErrorKind::Usage, "generate: the prompt has {} tokens, the model's context is {}", prompt.size(), context);
  torch::NoGradGuard no_grad;
  std::mt19937_64 rng(o.seed);
  std::vector<std::uint32_t> seq = prompt, out;
  KvCache cache;
  while (static_cast<std::int64_t>(out.size()) < o.max_tokens && static_cast<std::int64_t>(seq.size()) < context) {
    torch::Tensor logits = o.use_cache ? model->forward_cached(ids_tensor(seq, cache.length()).to(model->device()), cache)
                                       : model->forward(ids_tensor(seq, 0).to(model->device())).logits;
    const std::uint32_t next = sample_token(last_row(logits), o.sampling, rng);
    seq.push_back(next);
    out.push_back(next);
    if (o.stop_token >= 0 && next == static_cast<std::uint32_t>(o.stop_token)) break;
  }
  return out;
}

}  // namespace spes
