// Loading a checkpoint's weights, or drawing random ones (checkpoint.hpp).

#include "engine/checkpoint.hpp"

#include <cmath>
#include <random>

#include "engine/safetensors.hpp"

namespace minimal_decoder {

Checkpoint load_checkpoint(const std::string& dir) {
  Checkpoint ck;
  ck.config = read_model_config(dir);
  const ModelConfig& c = ck.config;
  const SafetensorsArchive st = SafetensorsArchive::open_directory(dir);
  const std::int64_t H = c.hidden_size, I = c.intermediate_size, V = c.vocab_size, D = c.head_dim;
  HostWeights& w = ck.weights;
  w.embed = st.read("model.embed_tokens.weight", {V, H});
  w.final_norm = st.read("model.norm.weight", {H});
  w.lm_head = c.tie_word_embeddings ? w.embed : st.read("lm_head.weight", {V, H});
  w.layers.resize(std::size_t(c.num_layers));
  for (int l = 0; l < c.num_layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    LayerWeights& lw = w.layers[std::size_t(l)];
    lw.attn_norm = st.read(p + "input_layernorm.weight", {H});
    lw.wq = st.read(p + "self_attn.q_proj.weight", {c.q_dim(), H});
    lw.wk = st.read(p + "self_attn.k_proj.weight", {c.kv_dim(), H});
    lw.wv = st.read(p + "self_attn.v_proj.weight", {c.kv_dim(), H});
    lw.wo = st.read(p + "self_attn.o_proj.weight", {H, c.q_dim()});
    if (c.qk_norm) {
      lw.q_norm = st.read(p + "self_attn.q_norm.weight", {D});
      lw.k_norm = st.read(p + "self_attn.k_norm.weight", {D});
    }
    lw.mlp_norm = st.read(p + "post_attention_layernorm.weight", {H});
    lw.w_gate = st.read(p + "mlp.gate_proj.weight", {I, H});
    lw.w_up = st.read(p + "mlp.up_proj.weight", {I, H});
    lw.w_down = st.read(p + "mlp.down_proj.weight", {H, I});
  }
  return ck;
}

HostWeights random_weights(const ModelConfig& c, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  auto matrix = [&](std::int64_t rows, std::int64_t cols) {
    std::normal_distribution<float> dist(0.f, 1.f / std::sqrt(float(cols)));
    std::vector<float> m(std::size_t(rows * cols));
    for (float& x : m) x = dist(rng);
    return m;
  };
  auto ones = [](std::int64_t n) { return std::vector<float>(std::size_t(n), 1.f); };
  const std::int64_t H = c.hidden_size, I = c.intermediate_size, V = c.vocab_size, D = c.head_dim;
  HostWeights w;
  // Embedding elements of unit scale, as a trained model's are after the first RMSNorm.
  w.embed.resize(std::size_t(V * H));
  std::normal_distribution<float> unit(0.f, 1.f);
  for (float& x : w.embed) x = unit(rng);
  w.final_norm = ones(H);
  w.lm_head = c.tie_word_embeddings ? w.embed : matrix(V, H);
  w.layers.resize(std::size_t(c.num_layers));
  for (LayerWeights& lw : w.layers) {
    lw.attn_norm = ones(H);
    lw.wq = matrix(c.q_dim(), H);
    lw.wk = matrix(c.kv_dim(), H);
    lw.wv = matrix(c.kv_dim(), H);
    lw.wo = matrix(H, c.q_dim());
    if (c.qk_norm) lw.q_norm = ones(D), lw.k_norm = ones(D);
    lw.mlp_norm = ones(H);
    lw.w_gate = matrix(I, H);
    lw.w_up = matrix(I, H);
    lw.w_down = matrix(H, I);
  }
  return w;
}

}  // namespace minimal_decoder
