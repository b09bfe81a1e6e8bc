// config.json parsing and the model-shape checks (model_config.hpp).

#include "engine/model_config.hpp"

#include <fstream>

#include <nlohmann/json.hpp>

#include "engine/errors.hpp"

namespace minimal_decoder {

void validate_model_config(const ModelConfig& c) {
  auto require = [&](bool ok, const std::string& msg) {
    if (!ok) throw DecoderError("unsupported model config (" + c.name + "): " + msg);
  };
  require(c.vocab_size > 0 && c.hidden_size > 0 && c.intermediate_size > 0 && c.num_layers > 0,
          "vocab_size, hidden_size, intermediate_size and num_hidden_layers must be > 0");
  require(c.num_q_heads > 0 && c.num_kv_heads > 0 && c.num_q_heads % c.num_kv_heads == 0,
          "num_attention_heads = " + std::to_string(c.num_q_heads) + " must be a positive multiple of num_key_value_heads = " +
              std::to_string(c.num_kv_heads));
  require(c.head_dim == 64 || c.head_dim == 128 || c.head_dim == 256,
          "head_dim = " + std::to_string(c.head_dim) + " (kvsift attention serves 64, 128 or 256)");
  require(c.rms_norm_eps > 0 && c.rope_theta > 0, "rms_norm_eps and rope_theta must be > 0");
  require(c.max_positions > 0, "max_position_embeddings must be > 0");
}

ModelConfig named_model_config(const std::string& name) {
  // In ModelConfig's order: name, vocab, hidden, intermediate, layers, q heads, KV heads, head_dim,
  // RMSNorm eps, RoPE theta, max positions, tied embeddings, q/k norm.
  if (name == "tiny") return ModelConfig{name, 512, 256, 512, 4, 4, 2, 64, 1e-5f, 10000.f, 16384, false, false};
  if (name == "llama3-8b")
    return ModelConfig{name, 128256, 4096, 14336, 32, 32, 8, 128, 1e-5f, 500000.f, 131072, false, false};
  throw DecoderError("unknown model shape \"" + name + "\" (known: tiny, llama3-8b)");
}

ModelConfig read_model_config(const std::string& dir) {
  const std::string path = dir + "/config.json";
  std::ifstream in(path);
  if (!in) throw DecoderError(path + ": cannot open (is " + dir + " a checkpoint directory?)");
  nlohmann::json j;
  try {
    in >> j;
  } catch (const nlohmann::json::exception& e) {
    throw DecoderError(path + ": malformed JSON (" + e.what() + ")");
  }
  ModelConfig c;
  c.name = path;
  auto field = [&](const char* key, auto fallback) {
    using V = decltype(fallback);
    if (!j.contains(key) || j[key].is_null()) return fallback;
    try {
      return j[key].get<V>();
    } catch (const nlohmann::json::exception&) {
      throw DecoderError(path + ": \"" + key + "\" has the wrong type");
    }
  };
  auto required_int = [&](const char* key) {
    if (!j.contains(key)) throw DecoderError(path + ": missing \"" + key + "\"");
    return field(key, 0);
  };
  const std::string model_type = field("model_type", std::string("llama"));
  if (model_type != "llama" && model_type != "qwen3")
    throw DecoderError("unsupported model config (" + path + "): model_type \"" + model_type + "\" (supported: llama, qwen3)");
  c.vocab_size = required_int("vocab_size");
  c.hidden_size = required_int("hidden_size");
  c.intermediate_size = required_int("intermediate_size");
  c.num_layers = required_int("num_hidden_layers");
  c.num_q_heads = required_int("num_attention_heads");
  c.num_kv_heads = field("num_key_value_heads", c.num_q_heads);
  c.head_dim = field("head_dim", c.num_q_heads > 0 ? c.hidden_size / c.num_q_heads : 0);
  c.rms_norm_eps = field("rms_norm_eps", 1e-6f);
  c.rope_theta = field("rope_theta", 10000.f);
  c.max_positions = field("max_position_embeddings", 4096);
  c.tie_word_embeddings = field("tie_word_embeddings", false);
  c.qk_norm = model_type == "qwen3";
  auto reject = [&](bool bad, const std::string& msg) {
    if (bad) throw DecoderError("unsupported model config (" + path + "): " + msg);
  };
  reject(field("hidden_act", std::string("silu")) != "silu", "hidden_act must be silu");
  reject(field("attention_bias", false), "attention_bias = true (q/k/v/o biases are not implemented)");
  reject(field("mlp_bias", false), "mlp_bias = true is not implemented");
  reject(j.contains("rope_scaling") && !j["rope_scaling"].is_null(), "rope_scaling is not implemented");
  reject(j.contains("sliding_window") && !j["sliding_window"].is_null() && field("use_sliding_window", model_type != "qwen3"),
         "sliding-window attention is not implemented");
  validate_model_config(c);
  return c;
}

}  // namespace minimal_decoder
