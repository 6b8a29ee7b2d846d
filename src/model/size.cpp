#include "spes/model/size.h"

namespace spes {

namespace {
std::int64_t qk_norm_size(const ModelConfig& m, std::int64_t heads) {
  switch (m.qk_norm) {
    case QkNorm::None: return 0;
    case QkNorm::Full: return heads * m.head_dim();
    case QkNorm::PerHead: return m.head_dim();
  }
  return 0;
}
}  // namespace

ParamCounts count_params(const ModelConfig& m, std::int64_t owned_experts) {
  const std::int64_t d = m.d_model, L = m.n_layers, hd = m.head_dim();
  const std::int64_t q_dim = m.n_heads * hd, kv_dim = m.kv_heads() * hd;
  ParamCounts c;
  c.embedding = m.vocab_size * d;
  c.lm_head = m.vocab_size * d;
  c.attention = L * (d * q_dim + 2 * d * kv_dim + q_dim * d);
  c.norms = L * (2 * d + qk_norm_size(m, m.n_heads) + qk_norm_size(m, m.kv_heads())) + d;
  c.router = L * m.n_experts * d;
  c.one_expert = 3 * d * m.d_ff;
  c.experts = L * m.n_experts * c.one_expert;
  c.shared = c.embedding + c.lm_head + c.attention + c.norms + c.router;
  c.total = c.shared + c.experts;
  c.active = c.shared + L * m.top_k * c.one_expert;
  c.trainable = c.shared + L * owned_experts * c.one_expert;
  return c;
}

StepFlops count_train_flops(const ModelConfig& m, std::int64_t seq_len, std::int64_t tokens,
                            double frozen_share) {
  const double d = static_cast<double>(m.d_model), L = static_cast<double>(m.n_layers);
  const double hd = static_cast<double>(m.head_dim());
  const double q_dim = m.n_heads * hd, kv_dim = m.kv_heads() * hd;
  const double T = static_cast<double>(tokens), S = static_cast<double>(seq_len);

  // Per token, forward.
  const double attn_proj = 2.0 * (d * q_dim + 2.0 * d * kv_dim + q_dim * d);
  const double attn_scores = 2.0 * 2.0 * S * q_dim;  // Q K^T and P V over the full window
  const double router = 2.0 * d * static_cast<double>(m.n_experts);
  const double experts = static_cast<double>(m.top_k) * 2.0 * 3.0 * d * static_cast<double>(m.d_ff);
  const double head = 2.0 * d * static_cast<double>(m.vocab_size);

  StepFlops f;
  f.forward = T * (L * (attn_proj + attn_scores + router + experts) + head);
  // Backward: input and weight gradient each cost one forward, except that frozen experts
  // produce only the input gradient.
  f.backward = 2.0 * f.forward - T * L * experts * frozen_share;
  return f;
}

}  // namespace spes
