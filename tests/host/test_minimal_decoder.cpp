// examples/minimal_decoder on the host backend: a tiny checkpoint written here (config.json + two
// safetensors shards + index, f32/bf16/f16 tensors) loads and gives the logits of a direct
// computation written below; every policy with a budget larger than the context gives exactly the
// dense logits; bad checkpoints and bad arguments fail with one clear message; --profile reports
// every part of a decode step, with shares that sum to 1.

#include <doctest/doctest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli/options.hpp"
#include "engine/checkpoint.hpp"
#include "engine/host_engine.hpp"
#include "support/decoder_test_helpers.hpp"
#include "support/synthetic_prefill_check.hpp"
#include "tools/step_profile_report.hpp"

namespace md = minimal_decoder;
namespace fs = std::filesystem;

namespace {

struct TensorSpec {
  std::string name;
  std::string dtype;  // F32, BF16, F16
  std::vector<std::int64_t> shape;
  std::vector<float> values;  // rounded to dtype by write_safetensors (in place)
};

void put_u16(std::string& out, std::uint16_t v) { out.append(reinterpret_cast<const char*>(&v), 2); }

// Writes one safetensors file; rounds each tensor's values to its dtype so the test's reference
// uses exactly what the file holds.
void write_safetensors(const fs::path& path, std::vector<TensorSpec*> tensors) {
  nlohmann::json header = nlohmann::json::object();
  std::string data;
  for (TensorSpec* t : tensors) {
    const std::size_t begin = data.size();
    for (float& x : t->values) {
      if (t->dtype == "F32") {
        data.append(reinterpret_cast<const char*>(&x), 4);
      } else if (t->dtype == "BF16") {
        const std::uint16_t b = kvsift::detail::float_to_bf16_bits(x);
        put_u16(data, b);
        x = kvsift::detail::bf16_bits_to_float(b);
      } else {
        const std::uint16_t h = kvsift::detail::float_to_half_bits(x);
        put_u16(data, h);
        x = kvsift::detail::half_bits_to_float(h);
      }
    }
    header[t->name] = {{"dtype", t->dtype}, {"shape", t->shape}, {"data_offsets", {begin, data.size()}}};
  }
  const std::string text = header.dump();
  const std::uint64_t n = text.size();
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(&n), 8);
  out << text << data;
}

md::ModelConfig tiny_config() {
  md::ModelConfig c;
  c.vocab_size = 40;
  c.hidden_size = 96;
  c.intermediate_size = 80;
  c.num_layers = 2;
  c.num_q_heads = 4;
  c.num_kv_heads = 2;
  c.head_dim = 64;
  c.rms_norm_eps = 1e-5f;
  c.rope_theta = 10000.f;
  c.max_positions = 512;
  return c;
}

nlohmann::json config_json(const md::ModelConfig& c) {
  return {{"model_type", "llama"},       {"vocab_size", c.vocab_size},
          {"hidden_size", c.hidden_size}, {"intermediate_size", c.intermediate_size},
          {"num_hidden_layers", c.num_layers}, {"num_attention_heads", c.num_q_heads},
          {"num_key_value_heads", c.num_kv_heads}, {"head_dim", c.head_dim},
          {"rms_norm_eps", c.rms_norm_eps}, {"rope_theta", c.rope_theta},
          {"max_position_embeddings", c.max_positions}, {"tie_word_embeddings", false},
          {"hidden_act", "silu"},         {"rope_scaling", nullptr}};
}

// A fresh directory per test case.
fs::path fresh_dir(const std::string& name) {
  const fs::path dir = fs::temp_directory_path() /
                       ("kvsift_md_" + name + "_" + std::to_string(std::chrono::steady_clock::now().time_since_epoch().count()));
  fs::create_directories(dir);
  return dir;
}

// Writes a sharded checkpoint of random weights; returns the weights as the files hold them.
md::HostWeights write_checkpoint(const fs::path& dir, const md::ModelConfig& c, std::uint64_t seed) {
  md::HostWeights w = md::random_weights(c, seed);
  std::mt19937 rng(static_cast<unsigned>(seed));
  std::normal_distribution<float> near_one(1.f, 0.1f);
  for (auto& l : w.layers)
    for (float& x : l.attn_norm) x = near_one(rng);  // norms other than 1 catch a missing weight
  for (float& x : w.final_norm) x = near_one(rng);
  const std::int64_t H = c.hidden_size, I = c.intermediate_size, V = c.vocab_size;
  std::vector<TensorSpec> specs;
  specs.reserve(64);
  auto add = [&](std::string name, std::string dtype, std::vector<std::int64_t> shape, std::vector<float>* v) {
    specs.push_back({std::move(name), std::move(dtype), std::move(shape), *v});
    return &specs.back();
  };
  std::vector<std::pair<TensorSpec*, std::vector<float>*>> links;
  auto link = [&](std::string name, std::string dtype, std::vector<std::int64_t> shape, std::vector<float>* v) {
    links.push_back({add(std::move(name), std::move(dtype), std::move(shape), v), v});
  };
  link("model.embed_tokens.weight", "BF16", {V, H}, &w.embed);
  link("model.norm.weight", "F32", {H}, &w.final_norm);
  link("lm_head.weight", "F16", {V, H}, &w.lm_head);
  for (int l = 0; l < c.num_layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    auto& lw = w.layers[std::size_t(l)];
    link(p + "input_layernorm.weight", "F32", {H}, &lw.attn_norm);
    link(p + "self_attn.q_proj.weight", "BF16", {c.q_dim(), H}, &lw.wq);
    link(p + "self_attn.k_proj.weight", "F32", {c.kv_dim(), H}, &lw.wk);
    link(p + "self_attn.v_proj.weight", "F16", {c.kv_dim(), H}, &lw.wv);
    link(p + "self_attn.o_proj.weight", "F32", {H, c.q_dim()}, &lw.wo);
    link(p + "post_attention_layernorm.weight", "F32", {H}, &lw.mlp_norm);
    link(p + "mlp.gate_proj.weight", "BF16", {I, H}, &lw.w_gate);
    link(p + "mlp.up_proj.weight", "F32", {I, H}, &lw.w_up);
    link(p + "mlp.down_proj.weight", "F32", {H, I}, &lw.w_down);
  }
  // Two shards: the global tensors and layer 0 in one, the rest in the other.
  std::vector<TensorSpec*> shard1, shard2;
  nlohmann::json weight_map = nlohmann::json::object();
  for (auto& [spec, values] : links) {
    const bool first = spec->name.rfind("model.layers.", 0) != 0 || spec->name.rfind("model.layers.0.", 0) == 0;
    (first ? shard1 : shard2).push_back(spec);
    weight_map[spec->name] = first ? "model-00001-of-00002.safetensors" : "model-00002-of-00002.safetensors";
  }
  write_safetensors(dir / "model-00001-of-00002.safetensors", shard1);
  write_safetensors(dir / "model-00002-of-00002.safetensors", shard2);
  for (auto& [spec, values] : links) *values = spec->values;  // what the files hold
  std::ofstream(dir / "model.safetensors.index.json") << nlohmann::json{{"metadata", {}}, {"weight_map", weight_map}}.dump();
  std::ofstream(dir / "config.json") << config_json(c).dump(1);
  return w;
}

// ---- The direct computation: the whole sequence at once, double precision, no kvsift. ----

std::vector<double> matvec(const std::vector<float>& W, int rows, int cols, const std::vector<double>& x) {
  std::vector<double> y(static_cast<std::size_t>(rows));
  for (int r = 0; r < rows; ++r)
    for (int i = 0; i < cols; ++i) y[std::size_t(r)] += double(W[std::size_t(r) * cols + i]) * x[std::size_t(i)];
  return y;
}

std::vector<double> rmsnorm(const std::vector<double>& x, const std::vector<float>& w, double eps) {
  double ss = 0;
  for (double v : x) ss += v * v;
  const double inv = 1.0 / std::sqrt(ss / double(x.size()) + eps);
  std::vector<double> y(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) y[i] = x[i] * inv * w[i];
  return y;
}

void rope(std::vector<double>& v, int heads, int D, int pos, double theta) {
  for (int h = 0; h < heads; ++h)
    for (int i = 0; i < D / 2; ++i) {
      const double a = pos * std::pow(theta, -2.0 * i / D);
      double& x1 = v[std::size_t(h * D + i)];
      double& x2 = v[std::size_t(h * D + i + D / 2)];
      const double r1 = x1 * std::cos(a) - x2 * std::sin(a), r2 = x2 * std::cos(a) + x1 * std::sin(a);
      x1 = r1;
      x2 = r2;
    }
}

// Logits of the last position of `tokens`.
std::vector<double> reference_logits(const md::ModelConfig& c, const md::HostWeights& w, const std::vector<int>& tokens) {
  const int T = int(tokens.size()), H = c.hidden_size, D = c.head_dim, Hq = c.num_q_heads, G = c.num_q_heads / c.num_kv_heads;
  std::vector<std::vector<double>> x(static_cast<std::size_t>(T));
  for (int t = 0; t < T; ++t) x[std::size_t(t)].assign(w.embed.begin() + std::int64_t(tokens[std::size_t(t)]) * H,
                                                       w.embed.begin() + std::int64_t(tokens[std::size_t(t)] + 1) * H);
  for (const auto& lw : w.layers) {
    std::vector<std::vector<double>> q(x.size()), k(x.size()), v(x.size());
    for (int t = 0; t < T; ++t) {
      const auto h = rmsnorm(x[std::size_t(t)], lw.attn_norm, c.rms_norm_eps);
      q[std::size_t(t)] = matvec(lw.wq, int(c.q_dim()), H, h);
      k[std::size_t(t)] = matvec(lw.wk, int(c.kv_dim()), H, h);
      v[std::size_t(t)] = matvec(lw.wv, int(c.kv_dim()), H, h);
      rope(q[std::size_t(t)], Hq, D, t, c.rope_theta);
      rope(k[std::size_t(t)], c.num_kv_heads, D, t, c.rope_theta);
    }
    for (int t = 0; t < T; ++t) {
      std::vector<double> attn(static_cast<std::size_t>(c.q_dim()));
      for (int hq = 0; hq < Hq; ++hq) {
        const int hk = hq / G;
        std::vector<double> logits;
        for (int s = 0; s <= t; ++s) {
          double dot = 0;
          for (int i = 0; i < D; ++i) dot += q[std::size_t(t)][std::size_t(hq * D + i)] * k[std::size_t(s)][std::size_t(hk * D + i)];
          logits.push_back(dot / std::sqrt(double(D)));
        }
        const double m = *std::max_element(logits.begin(), logits.end());
        double sum = 0;
        for (double& l : logits) sum += (l = std::exp(l - m));
        for (int s = 0; s <= t; ++s)
          for (int i = 0; i < D; ++i)
            attn[std::size_t(hq * D + i)] += logits[std::size_t(s)] / sum * v[std::size_t(s)][std::size_t(hk * D + i)];
      }
      const auto o = matvec(lw.wo, H, int(c.q_dim()), attn);
      for (int i = 0; i < H; ++i) x[std::size_t(t)][std::size_t(i)] += o[std::size_t(i)];
      const auto h = rmsnorm(x[std::size_t(t)], lw.mlp_norm, c.rms_norm_eps);
      auto g = matvec(lw.w_gate, c.intermediate_size, H, h);
      const auto u = matvec(lw.w_up, c.intermediate_size, H, h);
      for (std::size_t i = 0; i < g.size(); ++i) g[i] = g[i] / (1 + std::exp(-g[i])) * u[i];
      const auto dn = matvec(lw.w_down, H, c.intermediate_size, g);
      for (int i = 0; i < H; ++i) x[std::size_t(t)][std::size_t(i)] += dn[std::size_t(i)];
    }
  }
  return matvec(w.lm_head, c.vocab_size, H, rmsnorm(x.back(), w.final_norm, c.rms_norm_eps));
}

double max_abs_diff(const float* a, const std::vector<double>& b) {
  double m = 0;
  for (std::size_t i = 0; i < b.size(); ++i) m = std::max(m, std::abs(double(a[i]) - b[i]));
  return m;
}

using decoder_test::random_prompts;


}  // namespace

TEST_CASE("minimal decoder: a sharded bf16/fp16/fp32 checkpoint gives the logits of a direct computation") {
  const md::ModelConfig c = tiny_config();
  const fs::path dir = fresh_dir("logits");
  const md::HostWeights written = write_checkpoint(dir, c, 7);
  const md::Checkpoint ck = md::load_checkpoint(dir.string());
  CHECK(ck.config.hidden_size == c.hidden_size);
  CHECK(ck.weights.embed == written.embed);
  CHECK(ck.weights.lm_head == written.lm_head);
  CHECK(ck.weights.layers[1].wv == written.layers[1].wv);

  md::HostBackend be;
  const md::BackendWeights<md::HostBackend> weights(be, ck.config, ck.weights);
  md::GenerationRequest req;
  req.prompts = random_prompts({37, 20}, c.vocab_size, 3);  // ragged
  req.new_tokens = 4;
  req.prefill_chunk = 16;  // several chunks, a partial last one
  req.keep_logits = true;
  const md::GenerationReport r = md::generate(be, ck.config, weights, req);
  for (std::size_t b = 0; b < req.prompts.size(); ++b) {
    std::vector<int> seq(req.prompts[b].begin(), req.prompts[b].end());
    const auto want = reference_logits(ck.config, ck.weights, seq);
    CHECK(max_abs_diff(r.prefill_logits.data() + b * std::size_t(c.vocab_size), want) < 2e-4);
    for (std::size_t s = 0; s < r.step_logits.size(); ++s) {
      seq.push_back(r.generated[b][s]);
      const auto step = reference_logits(ck.config, ck.weights, seq);
      CHECK(max_abs_diff(r.step_logits[s].data() + b * std::size_t(c.vocab_size), step) < 2e-4);
    }
  }
  fs::remove_all(dir);
}

TEST_CASE("minimal decoder: every policy with a budget above the context gives exactly the dense logits") {
  const md::ModelConfig c = tiny_config();
  md::HostBackend be;
  const md::HostWeights hw = md::random_weights(c, 11);
  const md::BackendWeights<md::HostBackend> weights(be, c, hw);
  md::GenerationRequest req;
  req.prompts = random_prompts({45, 30, 12}, c.vocab_size, 5);
  req.new_tokens = 6;
  req.prefill_chunk = 13;
  req.keep_logits = true;
  const md::GenerationReport dense = md::generate(be, c, weights, req);

  for (md::PolicyKind kind : {md::PolicyKind::kClusterAttn, md::PolicyKind::kSnapKV, md::PolicyKind::kStreamingLLM,
                              md::PolicyKind::kLycheeDecode}) {
    md::GenerationRequest p = req;
    p.policy = decoder_test::test_policy(kind, 100, 100, 4, 8);  // budgets > 45 + 6
    p.check = true;
    const md::GenerationReport r = md::generate(be, c, weights, p);
    INFO("policy ", p.policy.describe());
    CHECK(r.generated == dense.generated);
    CHECK(r.prefill_logits == dense.prefill_logits);
    REQUIRE(r.step_logits.size() == dense.step_logits.size());
    for (std::size_t s = 0; s < r.step_logits.size(); ++s) CHECK(r.step_logits[s] == dense.step_logits[s]);
    CHECK(r.top1_agree == r.compared);
    CHECK(r.kl_max == 0.0);
  }
}

TEST_CASE("minimal decoder: the paged KV layout gives exactly the contiguous layout's logits, every policy") {
  const md::ModelConfig c = tiny_config();
  md::HostBackend be;
  const md::HostWeights hw = md::random_weights(c, 13);
  const md::BackendWeights<md::HostBackend> weights(be, c, hw);
  for (md::PolicyKind kind : {md::PolicyKind::kDense, md::PolicyKind::kClusterAttn, md::PolicyKind::kSnapKV,
                              md::PolicyKind::kStreamingLLM, md::PolicyKind::kLycheeDecode}) {
    md::GenerationRequest req;
    req.prompts = random_prompts({61, 34, 17}, c.vocab_size, 6);  // lengths that end mid-page
    req.new_tokens = 7;
    req.prefill_chunk = 16;
    req.keep_logits = true;
    req.policy = decoder_test::test_policy(kind, 24, 16, 2, 4, 3);  // budgets that really drop tokens
    const md::GenerationReport contiguous = md::generate(be, c, weights, req);
    for (int page_size : {1, 5, 16}) {
      INFO("policy ", req.policy.describe(), ", page size ", page_size);
      md::GenerationRequest paged = req;
      paged.kv_layout = md::KvLayout::kPaged;
      paged.page_size = page_size;
      const md::GenerationReport r = md::generate(be, c, weights, paged);
      CHECK(r.generated == contiguous.generated);
      CHECK(r.prefill_logits == contiguous.prefill_logits);
      CHECK(r.step_logits == contiguous.step_logits);
    }
  }
}

namespace {

// Relative difference of two logit vectors: max |a - b| over max |a|.
double relative_difference(const std::vector<float>& a, const std::vector<float>& b) {
  REQUIRE(a.size() == b.size());
  double max_abs = 0, max_diff = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    max_abs = std::max(max_abs, double(std::fabs(a[i])));
    max_diff = std::max(max_diff, double(std::fabs(a[i] - b[i])));
  }
  return max_diff / std::max(max_abs, 1e-12);
}

// The prefill's logits, then those of each decode step fed `tokens[s]` ([step][batch * vocab]).
std::vector<std::vector<float>> fed_logits(md::HostBackend& be, const md::ModelConfig& c,
                                           const md::BackendWeights<md::HostBackend>& weights, const md::PolicyOptions& policy,
                                           const std::vector<std::vector<std::int32_t>>& prompts,
                                           const std::vector<std::vector<std::int32_t>>& tokens, md::KvDtype dtype,
                                           md::KvLayout layout) {
  md::DecoderLimits lim;
  lim.max_batch = int(prompts.size());
  for (const auto& p : prompts) lim.max_prompt_len = std::max(lim.max_prompt_len, int(p.size()));
  lim.max_new_tokens = int(tokens.size()) + 1;
  lim.prefill_chunk = 16;
  lim.kv_layout = layout;
  lim.page_size = 5;
  lim.kv_dtype = dtype;
  md::Decoder<md::HostBackend> decoder(be, c, weights, policy, lim);
  std::vector<std::vector<float>> out{decoder.prefill(prompts)};
  for (const auto& next : tokens) out.push_back(decoder.decode(next));
  return out;
}

}  // namespace

TEST_CASE("minimal decoder: an fp8 KV cache decodes every policy close to the native cache, not equal to it") {
  const md::ModelConfig c = tiny_config();
  md::HostBackend be;
  const md::HostWeights hw = md::random_weights(c, 19);
  const md::BackendWeights<md::HostBackend> weights(be, c, hw);
  const auto prompts = random_prompts({61, 34}, c.vocab_size, 8);
  const auto tokens = random_prompts({2, 2, 2, 2, 2, 2}, c.vocab_size, 9);  // six steps of two sequences
  for (md::PolicyKind kind : {md::PolicyKind::kDense, md::PolicyKind::kClusterAttn, md::PolicyKind::kSnapKV,
                              md::PolicyKind::kStreamingLLM, md::PolicyKind::kLycheeDecode})
    for (int budget : {100, 24}) {
      // Budget 100 keeps every token (61 + 6 < 100), so fp8 and native differ by the rounding alone;
      // 24 drops tokens, and a policy that ranks by score may keep other tokens from rounded keys.
      const md::PolicyOptions policy = decoder_test::test_policy(kind, budget, budget, 2, 4, 3);
      const auto native = fed_logits(be, c, weights, policy, prompts, tokens, md::KvDtype::kNative, md::KvLayout::kContiguous);
      for (md::KvLayout layout : {md::KvLayout::kContiguous, md::KvLayout::kPaged}) {
        INFO("policy ", policy.describe(), ", ", std::string(md::kv_layout_name(layout)));
        const auto fp8 = fed_logits(be, c, weights, policy, prompts, tokens, md::KvDtype::kFp8, layout);
        REQUIRE(fp8.size() == native.size());
        for (std::size_t s = 0; s < fp8.size(); ++s) {
          INFO("step ", s, " (0: the prefill)");
          for (float x : fp8[s]) REQUIRE(std::isfinite(x));
          // E4M3 keeps 3 mantissa bits (each K/V element rounded by at most 2^-4 of itself) and the
          // queries go through bf16: this model's logits move by ~2% of their scale. Equal logits
          // would mean the cache was never quantized.
          if (budget == 100) {
            CHECK(relative_difference(native[s], fp8[s]) < 0.05);
            CHECK(relative_difference(native[s], fp8[s]) > 1e-5);
          }
        }
      }
    }
}

TEST_CASE("minimal decoder: synthetic prefill fills an fp8 cache with N(0, 1) values, and every policy decodes from it") {
  md::HostBackend be;
  // The fill itself: codes of N(0, 64^2) (E4M3 holds them: |code| <= 448, never NaN), values code / 64.
  std::vector<kvsift::fp8_e4m3_t> codes(200000);
  be.fill_normal(codes.data(), std::int64_t(codes.size()), 3, 64.f);
  double sum = 0, sum2 = 0;
  for (const auto code : codes) {
    const float v = kvsift::to_float(code);
    REQUIRE(std::isfinite(v));
    REQUIRE(std::fabs(v) <= 448.f);
    sum += v / 64.0;
    sum2 += (v / 64.0) * (v / 64.0);
  }
  const double mean = sum / double(codes.size()), var = sum2 / double(codes.size()) - mean * mean;
  CHECK(std::fabs(mean) < 0.01);
  CHECK(var == doctest::Approx(1.0).epsilon(0.02));
  std::vector<float> scales(7, 0.f);
  be.fill_value(scales.data(), 5, 0.25f);
  CHECK(scales == std::vector<float>{0.25f, 0.25f, 0.25f, 0.25f, 0.25f, 0.f, 0.f});

  const md::ModelConfig c = tiny_config();
  const md::HostWeights hw = md::random_weights(c, 21);
  const md::BackendWeights<md::HostBackend> weights(be, c, hw);
  decoder_test::check_synthetic_prefill(be, c, weights, md::KvDtype::kFp8);
}

TEST_CASE("minimal decoder: small budgets compress the cache and --check measures the difference") {
  const md::ModelConfig c = tiny_config();
  md::HostBackend be;
  const md::HostWeights hw = md::random_weights(c, 12);
  const md::BackendWeights<md::HostBackend> weights(be, c, hw);
  md::GenerationRequest req;
  req.prompts = random_prompts({90, 70}, c.vocab_size, 8);
  req.new_tokens = 5;
  req.check = true;
  req.policy.kind = md::PolicyKind::kStreamingLLM;
  req.policy.compression.capacity = 24;
  req.policy.compression.window = 4;
  const md::GenerationReport r = md::generate(be, c, weights, req);
  CHECK(r.compared == 2 * 4);
  CHECK(r.kl_max > 0.0);                                       // attention over 24 of 90 tokens differs
  CHECK(r.kv_bytes_used == 2 * (24 + 4) * 2 * c.kv_dim() * c.num_layers * 4);  // 2 seqs x (Cp + 4 decode steps)

  // LycheeDecode with a small budget and cache correction runs, and its correction steps re-run
  // the last positions densely.
  req.policy.kind = md::PolicyKind::kLycheeDecode;
  req.policy.lycheedecode.budget = 16;
  req.policy.lycheedecode.sink = 2;
  req.policy.lycheedecode.recent = 4;
  req.policy.lycheedecode.correction_interval = 2;
  const md::GenerationReport l = md::generate(be, c, weights, req);
  CHECK(l.compared == 2 * 4);
  CHECK(l.generated[0].size() == 5);
}

TEST_CASE("minimal decoder: checkpoint errors are one clear line") {
  const md::ModelConfig c = tiny_config();
  CHECK_ERROR_CONTAINS(md::load_checkpoint("/nonexistent/kvsift/model"), "config.json: cannot open");

  const fs::path dir = fresh_dir("errors");
  write_checkpoint(dir, c, 3);
  auto rewrite_config = [&](nlohmann::json j) { std::ofstream(dir / "config.json") << j.dump(); };

  std::ofstream(dir / "config.json") << "{ \"vocab_size\": 40, ";
  CHECK_ERROR_CONTAINS(md::load_checkpoint(dir.string()), "config.json: malformed JSON");
  auto j = config_json(c);
  j["rope_scaling"] = {{"rope_type", "llama3"}};
  rewrite_config(j);
  CHECK_ERROR_CONTAINS(md::load_checkpoint(dir.string()), "rope_scaling is not implemented");
  j = config_json(c);
  j["head_dim"] = 96;
  rewrite_config(j);
  CHECK_ERROR_CONTAINS(md::load_checkpoint(dir.string()), "head_dim = 96");
  j = config_json(c);
  j["model_type"] = "gpt2";
  rewrite_config(j);
  CHECK_ERROR_CONTAINS(md::load_checkpoint(dir.string()), "model_type \"gpt2\"");
  j = config_json(c);
  j["intermediate_size"] = 81;  // the tensors no longer match
  rewrite_config(j);
  CHECK_ERROR_CONTAINS(md::load_checkpoint(dir.string()), "has shape [80, 96], expected [81, 96]");
  rewrite_config(config_json(c));
  CHECK_NOTHROW(md::load_checkpoint(dir.string()));

  // A truncated shard: its table points past the end of the file.
  const fs::path shard = dir / "model-00002-of-00002.safetensors";
  fs::resize_file(shard, fs::file_size(shard) - 100);
  CHECK_ERROR_CONTAINS(md::load_checkpoint(dir.string()), "outside the file (truncated?)");
  fs::remove(shard);
  CHECK_ERROR_CONTAINS(md::load_checkpoint(dir.string()), "model-00002-of-00002.safetensors: cannot open");
  const std::string bad_header("\x11\0\0\0\0\0\0\0{not json at all}", 25);
  std::ofstream(shard, std::ios::binary) << bad_header;
  CHECK_ERROR_CONTAINS(md::load_checkpoint(dir.string()), "malformed safetensors header");
  fs::remove_all(dir);
}

TEST_CASE("minimal decoder: argument errors are one clear line") {
  auto parse = [](std::vector<std::string> args) { return md::parse_options(args); };
  CHECK_ERROR_CONTAINS(parse({"--random", "tiny", "--random-prompts", "10", "--policy", "h2o"}),
                       "--policy: h2o not in {dense,clusterattn,snapkv,streaming,lycheedecode}");
  CHECK_ERROR_CONTAINS(parse({"--random", "tiny", "--model", "x", "--random-prompts", "10"}), "exactly one of --model");
  CHECK_ERROR_CONTAINS(parse({"--random", "tiny"}), "exactly one prompt source");
  CHECK_ERROR_CONTAINS(parse({"--random", "tiny", "--random-prompts", "10", "--cp"}), "--cp: 1 required INT missing");
  CHECK_ERROR_CONTAINS(parse({"--random", "tiny", "--random-prompts", "10", "--cp", "-3"}), "--cp: -3 is not an integer >= 1");
  CHECK_ERROR_CONTAINS(parse({"--random", "tiny", "--prompt-ids", "1 x 3"}), "--prompt-ids: \"x\" is not a token id");
  CHECK_ERROR_CONTAINS(parse({"--random", "tiny", "--random-prompts", "10", "--frobnicate"}), "not expected: --frobnicate (see --help)");
  CHECK_ERROR_CONTAINS(md::named_model_config("llama9"), "unknown model shape");
  CHECK_ERROR_CONTAINS(parse({"--random", "tiny", "--random-prompts", "10", "--kv-layout", "ring"}),
                       "--kv-layout: ring not in {contiguous,paged}");
  CHECK_ERROR_CONTAINS(parse({"--random", "tiny", "--random-prompts", "10", "--page-size", "0"}),
                       "--page-size: 0 is not an integer >= 1");
  const md::Options paged = parse({"--random", "tiny", "--random-prompts", "10", "--kv-layout", "paged", "--page-size", "32"});
  CHECK(paged.generation.kv_layout == md::KvLayout::kPaged);
  CHECK(paged.generation.page_size == 32);
  const md::Options ok = parse({"--random", "tiny", "--random-prompts", "500,320", "--policy", "clusterattn", "--cp", "256"});
  CHECK(ok.random_prompt_lengths == std::vector<int>{500, 320});
  CHECK(ok.generation.policy.compression.capacity == 256);

  // Policy options and lengths are checked by kvsift's own validation before anything runs.
  const md::ModelConfig c = tiny_config();
  md::HostBackend be;
  const md::HostWeights hw = md::random_weights(c, 1);
  const md::BackendWeights<md::HostBackend> weights(be, c, hw);
  md::GenerationRequest req;
  req.prompts = random_prompts({40}, c.vocab_size, 1);
  req.policy.kind = md::PolicyKind::kClusterAttn;
  req.policy.compression.capacity = 16;
  req.policy.compression.window = 16;
  CHECK_ERROR_CONTAINS(md::generate(be, c, weights, req), "capacity = 16 must be > window = 16");
  req.policy.kind = md::PolicyKind::kLycheeDecode;
  req.policy.lycheedecode.budget = 10;
  req.policy.lycheedecode.sink = 8;
  req.policy.lycheedecode.recent = 8;
  CHECK_ERROR_CONTAINS(md::generate(be, c, weights, req), "budget = 10 is smaller than sink + recent = 16");
  req.policy = md::PolicyOptions();
  req.new_tokens = 600;  // 40 + 600 > max_position_embeddings = 512
  CHECK_ERROR_CONTAINS(md::generate(be, c, weights, req), "exceeds max_position_embeddings = 512");
  req.new_tokens = 2;
  req.prompts = {{1, 2, 99}};
  CHECK_ERROR_CONTAINS(md::generate(be, c, weights, req), "token id 99 outside the vocabulary");
}

TEST_CASE("minimal decoder: prefill_from (one shared dense prefill) gives the logits of the policy's own prefill") {
  // The passkey evaluation prefills once and starts every policy from it; this must not change a bit.
  // An fp8 cache copies its per-token scales with the codes, head by head ([batch, heads, capacity]).
  const md::ModelConfig c = tiny_config();
  md::HostBackend be;
  const md::HostWeights hw = md::random_weights(c, 13);
  const md::BackendWeights<md::HostBackend> weights(be, c, hw);
  const std::vector<std::vector<std::int32_t>> prompts = random_prompts({90, 70}, c.vocab_size, 9);
  for (md::KvDtype kv_dtype : {md::KvDtype::kNative, md::KvDtype::kFp8}) {
    CAPTURE(md::kv_dtype_name(kv_dtype));
    md::DecoderLimits limits;
    limits.max_batch = 2;
    limits.max_prompt_len = 90;
    limits.max_new_tokens = 4;
    limits.prefill_chunk = 32;
    limits.kv_dtype = kv_dtype;
    md::DecoderLimits source_limits = limits;
    source_limits.keep_window_queries = 8;
    md::Decoder<md::HostBackend> source(be, c, weights, md::PolicyOptions(), source_limits);
    source.prefill(prompts);
    for (md::PolicyKind kind : {md::PolicyKind::kDense, md::PolicyKind::kClusterAttn, md::PolicyKind::kSnapKV,
                                md::PolicyKind::kStreamingLLM, md::PolicyKind::kLycheeDecode}) {
      md::PolicyOptions p;
      p.kind = kind;
      p.compression.capacity = 40;
      p.compression.window = kind == md::PolicyKind::kSnapKV ? 6 : 8;  // a window below the kept one works too
      p.compression.theta = 0.05f;
      p.compression.num_block = 8;
      p.lycheedecode.budget = 24;
      p.lycheedecode.sink = 2;
      p.lycheedecode.recent = 4;
      CAPTURE(p.describe());
      md::Decoder<md::HostBackend> own(be, c, weights, p, limits), shared(be, c, weights, p, limits);
      own.prefill(prompts);
      shared.prefill_from(source);
      CHECK(own.cache_lengths() == shared.cache_lengths());
      std::vector<std::int32_t> next = {5, 7};
      for (int step = 0; step < 4; ++step) {
        const std::vector<float> a = own.decode(next), b = shared.decode(next);
        CHECK(a == b);
        next = {md::argmax(a.data(), c.vocab_size), md::argmax(a.data() + c.vocab_size, c.vocab_size)};
      }
    }
    // A compressing policy needs the source's window queries.
    md::PolicyOptions snap;
    snap.kind = md::PolicyKind::kSnapKV;
    snap.compression.capacity = 40;
    snap.compression.window = 16;
    md::Decoder<md::HostBackend> wide(be, c, weights, snap, limits);
    CHECK_ERROR_CONTAINS(wide.prefill_from(source), "the source kept 8 window queries, this policy needs 16");
  }
}

TEST_CASE("minimal decoder: --profile times every part of a decode step, and the shares sum to 1") {
  const md::ModelConfig c = tiny_config();
  md::HostBackend be;
  const md::HostWeights hw = md::random_weights(c, 17);
  const md::BackendWeights<md::HostBackend> weights(be, c, hw);
  for (md::PolicyKind kind : {md::PolicyKind::kDense, md::PolicyKind::kLycheeDecode}) {
    md::GenerationRequest req;
    req.synthetic_prefill = true;
    req.prompts = random_prompts({511, 180}, c.vocab_size, 4);  // 511 + the step = max_position_embeddings
    req.new_tokens = 0;  // the profile makes room for its one step itself
    req.policy = decoder_test::test_policy(kind, 64, 32, 4, 8);
    const md::StepProfile p = md::profile_step(be, c, weights, req, 9);
    INFO("policy ", p.policy);
    CHECK(p.repetitions == 9);
    CHECK(p.lengths == std::vector<int>{512, 181});  // the profiled step's token attends to itself
    CHECK(std::string(p.clock) == "std::chrono");
    CHECK(!p.graph);  // the CPU backend records no graphs, whatever graph_steps says
    REQUIRE(p.parts.size() == 5);
    const std::vector<std::string> names = {"weights", "attention", "selection", "rest", "step"};
    double shares = 0;
    for (std::size_t i = 0; i < names.size(); ++i) {
      const md::StepProfilePart& part = p.parts[i];
      CHECK(part.name == names[i]);
      if (part.timed) CHECK(part.us > 0);
      if (part.name != "step") shares += part.share;
    }
    CHECK(shares == doctest::Approx(1.0).epsilon(1e-9));
    const double step = p.part("step").us;
    // On the CPU the parts run one after another, so alone they add up to about the whole step: a
    // part timed twice over (the attention inside the weights part, say) would break this.
    CHECK(p.part("weights").us + p.part("attention").us + p.part("selection").us <= 1.5 * step);
    CHECK(p.part("rest").us >= -0.5 * step);
    CHECK(p.part("selection").us >= -0.5 * step);
    if (kind == md::PolicyKind::kDense) CHECK(p.part("selection").us == 0.0);
    CHECK(p.part("weights").bytes == p.part("step").bytes - p.part("attention").bytes);
    CHECK(p.part("rest").bytes == 0);

    // The table: a row per part, each with a nonnegative time where it is timed; the printed shares
    // of the four parts sum to 100% up to their rounding. No bandwidth columns on the CPU.
    const std::string table = md::step_profile_table(p, 0);
    INFO(table);
    std::istringstream lines(table);
    std::string line;
    std::getline(lines, line);
    CHECK(line.find("median of 9 repetitions per part (std::chrono") != std::string::npos);
    std::getline(lines, line);
    CHECK(line.find("GB/step") == std::string::npos);
    double printed = 0;
    for (const std::string& name : names) {
      REQUIRE(std::getline(lines, line));
      std::istringstream row(line);
      std::string part, share;
      double us = 0;
      row >> part >> us >> share;
      CHECK(part == name);
      if (p.part(name).timed) CHECK(us >= 0);
      REQUIRE(share.back() == '%');
      if (name != "step") printed += std::stod(share.substr(0, share.size() - 1));
    }
    CHECK(printed == doctest::Approx(100.0).epsilon(0.002));

    // --json: the same parts, with bytes and a ceiling fraction where a bandwidth is given.
    const nlohmann::json j = nlohmann::json::parse(md::step_profile_json(p, 4.45));
    CHECK(j["repetitions"] == 9);
    REQUIRE(j["parts"].size() == 5);
    for (std::size_t i = 0; i < names.size(); ++i) CHECK(j["parts"][i]["part"] == names[i]);
    CHECK(j["parts"][0]["bytes"] == p.part("weights").bytes);
    CHECK(j["parts"][0]["ceiling_fraction"].is_number());
    CHECK(j["parts"][3]["bytes"].is_null());
    CHECK(md::step_profile_table(p, 4.45).find("% of 4.45 TB/s") != std::string::npos);
  }
}

TEST_CASE("minimal decoder: --profile parses, and refuses what it cannot time") {
  auto parse = [](std::vector<std::string> args) { return md::parse_options(args); };
  const md::Options o = parse({"--random", "tiny", "--random-prompts", "40", "--profile", "--profile-reps", "5", "--json", "p.json"});
  CHECK(o.profile);
  CHECK(o.profile_reps == 5);
  CHECK(o.json == "p.json");
  CHECK(o.passkey.json == "p.json");  // the one flag serves --eval-passkey too
  CHECK_ERROR_CONTAINS(parse({"--random", "tiny", "--random-prompts", "40", "--profile", "--check"}), "drop --compare and --check");
  CHECK_ERROR_CONTAINS(parse({"--random", "tiny", "--random-prompts", "40", "--profile-reps", "0"}),
                       "--profile-reps: 0 is not an integer >= 1");
}

// LycheeDecode on the tiny model's short prompts: a budget of 16 (2 sink, 4 recent), cache correction
// every 4 steps.
static md::PolicyOptions small_lycheedecode_with_correction() {
  md::PolicyOptions p;
  p.kind = md::PolicyKind::kLycheeDecode;
  p.lycheedecode.budget = 16;
  p.lycheedecode.sink = 2;
  p.lycheedecode.recent = 4;
  p.lycheedecode.correction_interval = 4;
  return p;
}

// Limits of the LycheeDecode schedule tests: 2 sequences of up to 40 prompt tokens, 12 new, 16-token chunks.
static md::DecoderLimits two_short_sequences() {
  md::DecoderLimits limits;
  limits.max_batch = 2;
  limits.max_prompt_len = 40;
  limits.max_new_tokens = 12;
  limits.prefill_chunk = 16;
  return limits;
}

// A decoder that prefills again starts its correction schedule again: its steps after the second
// prefill are those of a fresh decoder on the same prompts, corrections included (the step count used
// to run on from the first prompts, so the first correction came early, and for prompts shorter than
// the interval its window began before position 0).
TEST_CASE("minimal decoder: a second prefill restarts LycheeDecode's correction schedule") {
  const md::ModelConfig c = tiny_config();
  md::HostBackend be;
  const md::HostWeights hw = md::random_weights(c, 17);
  const md::BackendWeights<md::HostBackend> weights(be, c, hw);
  const md::DecoderLimits limits = two_short_sequences();
  const md::PolicyOptions p = small_lycheedecode_with_correction();  // a correction every 4 steps
  md::Decoder<md::HostBackend> reused(be, c, weights, p, limits), fresh(be, c, weights, p, limits);
  reused.prefill(random_prompts({40, 33}, c.vocab_size, 21));
  std::vector<std::int32_t> next = {3, 4};
  for (int step = 0; step < 6; ++step) {  // 6 steps: one correction done, the next 2 steps away
    const std::vector<float> logits = reused.decode(next);
    next = {md::argmax(logits.data(), c.vocab_size), md::argmax(logits.data() + c.vocab_size, c.vocab_size)};
  }
  // Prompts of 1 and 2 tokens: shorter than the interval.
  const std::vector<std::vector<std::int32_t>> short_prompts = {{7}, {8, 9}};
  CHECK(reused.prefill(short_prompts) == fresh.prefill(short_prompts));
  next = {5, 6};
  for (int step = 0; step < 9; ++step) {  // two corrections (steps 3 and 7) on both
    CAPTURE(step);
    const std::vector<float> a = reused.decode(next), b = fresh.decode(next);
    REQUIRE(a == b);
    next = {md::argmax(a.data(), c.vocab_size), md::argmax(a.data() + c.vocab_size, c.vocab_size)};
  }
}

// Without the attention timing the decoder calls LycheeDecode's two halves (attend_layer, then
// hand_off_layer on the backend's side stream, joined before the next layer's attention); with it,
// decode_layer. Same logits, correction steps included.
TEST_CASE("minimal decoder: LycheeDecode's handoff beside the next layer gives decode_layer's logits") {
  const md::ModelConfig c = tiny_config();
  md::HostBackend be;
  const md::HostWeights hw = md::random_weights(c, 19);
  const md::BackendWeights<md::HostBackend> weights(be, c, hw);
  const md::DecoderLimits limits = two_short_sequences();
  const md::PolicyOptions p = small_lycheedecode_with_correction();  // a correction every 4 steps
  md::Decoder<md::HostBackend> split(be, c, weights, p, limits), whole(be, c, weights, p, limits);
  split.set_attention_timing(false);
  const auto prompts = random_prompts({40, 29}, c.vocab_size, 23);
  CHECK(split.prefill(prompts) == whole.prefill(prompts));
  std::vector<std::int32_t> next = {3, 4};
  for (int step = 0; step < 9; ++step) {  // corrections at steps 3 and 7
    CAPTURE(step);
    const std::vector<float> a = split.decode(next), b = whole.decode(next);
    REQUIRE(a == b);
    next = {md::argmax(a.data(), c.vocab_size), md::argmax(a.data() + c.vocab_size, c.vocab_size)};
  }
}

// A step that throws half way (here a query tap at layer 1) leaves nothing behind: after a new
// prefill the decoder's steps are those of a fresh one (LycheeDecode's layer cursor used to stay at the
// failed layer, so every later step failed "out of order").
TEST_CASE("minimal decoder: after a step that threw, a new prefill decodes as a fresh decoder does") {
  const md::ModelConfig c = tiny_config();
  md::HostBackend be;
  const md::HostWeights hw = md::random_weights(c, 29);
  const md::BackendWeights<md::HostBackend> weights(be, c, hw);
  const md::DecoderLimits limits = two_short_sequences();
  const md::PolicyOptions p = small_lycheedecode_with_correction();
  md::Decoder<md::HostBackend> failed(be, c, weights, p, limits), fresh(be, c, weights, p, limits);
  const auto prompts = random_prompts({30, 21}, c.vocab_size, 31);
  failed.prefill(prompts);
  failed.set_query_tap([](int layer, const float*, int) {
    if (layer == 1) throw md::DecoderError("tap: refused");
  });
  CHECK_THROWS_WITH_AS(failed.decode({3, 4}), "tap: refused", md::DecoderError);
  failed.set_query_tap(nullptr);
  CHECK(failed.prefill(prompts) == fresh.prefill(prompts));
  std::vector<std::int32_t> next = {3, 4};
  for (int step = 0; step < 5; ++step) {  // a correction at step 3
    CAPTURE(step);
    const std::vector<float> a = failed.decode(next), b = fresh.decode(next);
    REQUIRE(a == b);
    next = {md::argmax(a.data(), c.vocab_size), md::argmax(a.data() + c.vocab_size, c.vocab_size)};
  }
}

TEST_CASE("minimal decoder: a malformed prompt in the middle of a batch is rejected alone; the others run as without it") {
  const md::ModelConfig c = tiny_config();
  md::HostBackend be;
  const md::HostWeights hw = md::random_weights(c, 23);
  const md::BackendWeights<md::HostBackend> weights(be, c, hw);
  const auto good = random_prompts({50, 41, 33, 27}, c.vocab_size, 17);
  md::GenerationRequest req;
  req.new_tokens = 12;
  req.policy = small_lycheedecode_with_correction();
  req.sampling.temperature = 0.8f;  // sampled: each sequence's stream is seeded by its place in the batch
  req.sampling.seed = 5;
  // Without rejection a malformed prompt fails the whole request, as before.
  auto bad = good;
  bad[2] = {3, c.vocab_size + 7, 1};
  req.prompts = bad;
  CHECK_ERROR_CONTAINS(md::generate(be, c, weights, req), "outside the vocabulary");
  req.reject_bad_prompts = true;
  const md::GenerationReport r = md::generate(be, c, weights, req);
  REQUIRE(r.rejected.size() == 4);
  CHECK(r.rejected[2] == "token 1 = " + std::to_string(c.vocab_size + 7) + " is outside the vocabulary [0, " +
                             std::to_string(c.vocab_size) + ")");
  CHECK(r.generated[2].empty());
  CHECK(r.sequences_run() == 3);
  // The reference: the same batch with a good prompt in place 2; sequences 0, 1 and 3 sample the same tokens.
  req.prompts = good;
  const md::GenerationReport full = md::generate(be, c, weights, req);
  for (int b : {0, 1, 3}) {
    CAPTURE(b);
    CHECK(r.rejected[std::size_t(b)].empty());
    CHECK(r.generated[std::size_t(b)] == full.generated[std::size_t(b)]);
  }
  // An empty prompt too; a batch with nothing left is an error that names the first reason.
  req.prompts = {good[0], {}};
  CHECK(md::generate(be, c, weights, req).rejected[1] == "the prompt is empty");
  req.prompts = {{}, {-1}};
  CHECK_ERROR_CONTAINS(md::generate(be, c, weights, req), "every prompt of the batch was rejected; the first: the prompt is empty");
  // The CLI flag needs --soak.
  CHECK(md::parse_options({"--random", "tiny", "--random-prompts", "40,30", "--soak", "--soak-bad-request"}).soak_bad_request);
  CHECK_ERROR_CONTAINS(md::parse_options({"--random", "tiny", "--random-prompts", "40", "--soak-bad-request"}),
                       "--soak-bad-request is part of --soak");
}

TEST_CASE("minimal decoder: --soak scans every logits vector, measures memory where it can, and parses") {
  // The helpers.
  CHECK(md::count_nonfinite({1.f, 2.f, 3.f}) == 0);
  CHECK(md::count_nonfinite({1.f, std::nanf(""), INFINITY, -INFINITY, 0.f}) == 3);
  const std::vector<double> ms = {10, 10, 20, 20, 5};  // ms per step
  const auto w = md::windowed_tokens_per_s(ms, 2, 4);  // 2 steps x 4 sequences per window; the partial one dropped
  REQUIRE(w.size() == 2);
  CHECK(w[0] == doctest::Approx(400.0));  // 8 tokens in 20 ms
  CHECK(w[1] == doctest::Approx(200.0));  // 8 tokens in 40 ms
  CHECK(md::windowed_tokens_per_s({7}, 4, 1).size() == 1);  // a short run is one window
  md::GenerationReport bad;
  CHECK_FALSE(md::soak_failed(bad));
  bad.memory_after_warmup = 100;
  bad.memory_at_end = 100;
  CHECK_FALSE(md::soak_failed(bad));
  bad.memory_at_end = 164;
  CHECK(md::soak_failed(bad));
  bad.memory_at_end = 100;
  bad.nonfinite_logits = 1;
  CHECK(md::soak_failed(bad));

  // A soak run on the CPU under LycheeDecode with cache correction: every step checked, nothing
  // non-finite, memory not countable there.
  const md::ModelConfig c = tiny_config();
  md::HostBackend be;
  const md::HostWeights hw = md::random_weights(c, 21);
  const md::BackendWeights<md::HostBackend> weights(be, c, hw);
  md::GenerationRequest req;
  req.prompts = random_prompts({60, 45, 30}, c.vocab_size, 9);
  req.new_tokens = 24;
  req.soak = true;
  req.soak_warmup = 5;
  req.policy = small_lycheedecode_with_correction();
  const md::GenerationReport r = md::generate(be, c, weights, req);
  CHECK(r.step_ms.size() == 23);
  CHECK(r.nonfinite_logits == 0);
  CHECK(r.first_nonfinite_step == -1);
  CHECK(r.memory_warmup_steps == 5);
  CHECK(r.memory_after_warmup == -1);
  CHECK(r.memory_at_end == -1);
  CHECK_FALSE(md::soak_failed(r));

  auto parse = [](std::vector<std::string> args) { return md::parse_options(args); };
  const md::Options o = parse({"--random", "tiny", "--random-prompts", "40", "--new-tokens", "200", "--soak", "--soak-warmup", "50"});
  CHECK(o.generation.soak);
  CHECK(o.generation.soak_warmup == 50);
  CHECK_ERROR_CONTAINS(parse({"--random", "tiny", "--random-prompts", "40", "--soak", "--profile"}), "drop --profile and --compare");
  CHECK_ERROR_CONTAINS(parse({"--random", "tiny", "--random-prompts", "40", "--soak-warmup", "0"}),
                       "--soak-warmup: 0 is not an integer >= 1");
}

TEST_CASE("minimal decoder: --tp parses, and says what it cannot run with") {
  CHECK(md::parse_options({"--random", "tiny", "--random-prompts", "40", "--device", "cpu", "--tp", "2"}).tp == 2);
  CHECK(md::parse_options({"--random", "tiny", "--random-prompts", "40"}).tp == 1);
  // --tp given, even --tp 1, takes the tensor-parallel path; without it the unsharded decoder runs.
  CHECK_FALSE(md::parse_options({"--random", "tiny", "--random-prompts", "40"}).tensor_parallel);
  CHECK(md::parse_options({"--random", "tiny", "--random-prompts", "40", "--device", "cpu", "--tp", "1"}).tensor_parallel);
  CHECK_ERROR_CONTAINS(md::parse_options({"--random", "tiny", "--random-prompts", "40", "--device", "cpu", "--tp", "1", "--compare"}),
                       "--tp 1 generates; --profile and --compare run one rank");
  CHECK_ERROR_CONTAINS(md::parse_options({"--random", "tiny", "--eval-passkey", "p.txt", "--device", "cpu", "--tp", "2"}),
                       "--tp 2: the passkey tools run one rank; drop --tp");
#ifdef MINIMAL_DECODER_NCCL
  // GPU ranks exist in this build: the device is chosen at run time (--device auto or gpu).
  CHECK(md::parse_options({"--random", "tiny", "--random-prompts", "40", "--tp", "2"}).tp == 2);
#else
  CHECK_ERROR_CONTAINS(md::parse_options({"--random", "tiny", "--random-prompts", "40", "--tp", "2"}),
                       "--tp 2 on GPUs needs NCCL, which this build did not find: add --device cpu");
#endif
  CHECK_ERROR_CONTAINS(md::parse_options({"--random", "tiny", "--random-prompts", "40", "--device", "cpu", "--tp", "2", "--profile"}),
                       "--profile and --compare run one rank");
  CHECK_ERROR_CONTAINS(md::parse_options({"--random", "tiny", "--random-prompts", "40", "--tp", "0"}), "--tp");
}
