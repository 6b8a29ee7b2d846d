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

TensorShapes parameter_shapes(const ModelConfig& m) {
  const std::int64_t d = m.d_model, q_dim = m.n_heads * m.head_dim(), kv_dim = m.kv_heads() * m.head_dim();
  TensorShapes out{{"embed_tokens.weight", {m.vocab_size, d}}};
  for (std::int64_t l = 0; l < m.n_layers; ++l) {
    const std::string p = "layers." + std::to_string(l) + ".";
    out.push_back({p + "input_layernorm.weight", {d}});
    out.push_back({p + "self_attn.q_proj.weight", {q_dim, d}});
    out.push_back({p + "self_attn.k_proj.weight", {kv_dim, d}});
    out.push_back({p + "self_attn.v_proj.weight", {kv_dim, d}});
    out.push_back({p + "self_attn.o_proj.weight", {d, q_dim}});
    if (m.qk_norm == QkNorm::Full) {
      out.push_back({p + "self_attn.q_norm.weight", {q_dim}});
      out.push_back({p + "self_attn.k_norm.weight", {kv_dim}});
    } else if (m.qk_norm == QkNorm::PerHead) {
      out.push_back({p + "self_attn.q_norm.weight", {m.head_dim()}});
      out.push_back({p + "self_attn.k_norm.weight", {m.head_dim()}});
    }
    out.push_back({p + "post_attention_layernorm.weight", {d}});
    out.push_back({p + "mlp.gate.weight", {m.n_experts, d}});
    for (std::int64_t e = 0; e < m.n_experts; ++e) {
      const std::string x = p + "mlp.experts." + std::to_string(e) + ".";
      out.push_back({x + "gate_proj.weight", {m.d_ff, d}});
      out.push_back({x + "up_proj.weight", {m.d_ff, d}});
      out.push_back({x + "down_proj.weight", {d, m.d_ff}});
    }
  }
  out.push_back({"norm.weight", {d}});
  out.push_back({"lm_head.weight", {m.vocab_size, d}});
  return out;
}

}  // namespace spes
