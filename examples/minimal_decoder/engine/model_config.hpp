#pragma once
// The decoder's model shape: read from a Hugging Face config.json, or one of the named shapes used
// with random weights. Anything the decoder would silently get wrong (biases, RoPE scaling, another
// activation, a head_dim kvsift's attention does not serve) is rejected here with one line.

#include <cstdint>
#include <string>

namespace minimal_decoder {

struct ModelConfig {
  std::string name = "custom";
  int vocab_size = 0;
  int hidden_size = 0;
  int intermediate_size = 0;
  int num_layers = 0;
  int num_q_heads = 0;
  int num_kv_heads = 0;
  int head_dim = 0;
  float rms_norm_eps = 1e-5f;
  float rope_theta = 10000.f;
  int max_positions = 0;
  bool tie_word_embeddings = false;
  bool qk_norm = false;  // Qwen3: an RMSNorm over each head's q and k before RoPE

  std::int64_t q_dim() const { return std::int64_t(num_q_heads) * head_dim; }
  std::int64_t kv_dim() const { return std::int64_t(num_kv_heads) * head_dim; }
  std::int64_t parameter_count() const {
    const std::int64_t per_layer = 2 * hidden_size + hidden_size * (q_dim() + 2 * kv_dim()) + q_dim() * hidden_size +
                                   3 * std::int64_t(hidden_size) * intermediate_size + (qk_norm ? 2 * head_dim : 0);
    return std::int64_t(vocab_size) * hidden_size * (tie_word_embeddings ? 1 : 2) + hidden_size + num_layers * per_layer;
  }
};

// Rejects a shape the decoder cannot serve, naming the field.
void validate_model_config(const ModelConfig& c);

// Named shapes for random weights: `tiny` runs the CPU demo in seconds; `llama3-8b` is the benchmark
// shape of the issue (Llama-3-8B: GQA 32/8, head_dim 128, RoPE theta 500000).
ModelConfig named_model_config(const std::string& name);

// config.json of a Llama-architecture checkpoint (LlamaForCausalLM, or Qwen3ForCausalLM for q/k norm).
ModelConfig read_model_config(const std::string& dir);

}  // namespace minimal_decoder
