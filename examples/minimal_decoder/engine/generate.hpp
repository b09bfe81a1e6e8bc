#pragma once
// The decode loop: prefill, then one token per sequence per step, chosen by the sampler; with
// `check`, a dense decoder runs alongside on the same tokens and every step's logits are compared.

#include <algorithm>
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "engine/decoder.hpp"
#include "engine/sampling.hpp"

namespace minimal_decoder {

struct GenerationReport {
  std::vector<std::vector<std::int32_t>> generated;  // [batch][new tokens]
  std::vector<float> prefill_logits;                 // [batch, vocab], of the policy's decoder
  std::vector<std::vector<float>> step_logits;       // [step][batch, vocab] when keep_logits
  double prefill_ms = 0;
  long long prompt_tokens = 0;
  std::vector<double> step_ms, step_attention_ms;
  std::vector<double> step_bytes;  // Decoder::step_bytes of each step: the roofline's bytes
  std::int64_t kv_bytes_used = 0, kv_bytes_allocated = 0;
  // --check: over every (step, sequence) of the decode steps
  long long compared = 0, top1_agree = 0;
  double kl_sum = 0, kl_max = 0;

  double decode_ms() const {
    double s = 0;
    for (double x : step_ms) s += x;
    return s;
  }
  double bytes() const {
    double s = 0;
    for (double x : step_bytes) s += x;
    return s;
  }
  double attention_ms() const {
    double s = 0;
    for (double x : step_attention_ms) s += x;
    return s;
  }
};

// Told after every prefill chunk ("prefill", prompt tokens done, total) and decode step ("decode",
// tokens per sequence done, total); how to show it is the caller's (tools/progress.hpp).
using GenerationProgress = std::function<void(const char* phase, long long done, long long total)>;

struct GenerationRequest {
  std::vector<std::vector<std::int32_t>> prompts;
  int new_tokens = 16;
  int prefill_chunk = 256;
  bool synthetic_prefill = false;  // random K/V caches of the prompts' lengths (Decoder::synthetic_prefill)
  bool time_attention = true;      // false: no per-layer synchronisation for the attention share
  bool graph_steps = true;         // with time_attention off: decode steps replay a CUDA graph (GPU)
  KvLayout kv_layout = KvLayout::kContiguous;
  int page_size = 16;
  KvDtype kv_dtype = KvDtype::kNative;
  SamplingOptions sampling;
  PolicyOptions policy;
  bool check = false;
  bool keep_logits = false;  // tests: keep every step's logits
  GenerationProgress progress;
};

// The sizes a decoder for `req` is built with: its batch, its longest prompt, its new tokens.
inline DecoderLimits request_limits(const GenerationRequest& req) {
  DecoderLimits limits;
  limits.max_batch = int(req.prompts.size());
  for (const auto& p : req.prompts) limits.max_prompt_len = std::max(limits.max_prompt_len, int(p.size()));
  limits.max_new_tokens = req.new_tokens;
  limits.prefill_chunk = req.prefill_chunk;
  limits.kv_layout = req.kv_layout;
  limits.page_size = req.page_size;
  limits.kv_dtype = req.kv_dtype;
  return limits;
}

// The prefill of req's prompts, run (progress told) or synthetic; returns its logits [batch, vocab].
template <class Backend>
std::vector<float> prefill_request(Decoder<Backend>& model, const GenerationRequest& req) {
  if (!req.synthetic_prefill)
    return model.prefill(req.prompts, [&](long long d, long long t) {
      if (req.progress) req.progress("prefill", d, t);
    });
  std::vector<int> lengths;
  for (const auto& p : req.prompts) lengths.push_back(int(p.size()));
  return model.synthetic_prefill(lengths, req.sampling.seed + 1);
}

// Compiled once per backend (host_engine.cpp, cuda/cuda_engine.cu).
template <class Backend>
GenerationReport generate(Backend& be, const ModelConfig& config, const BackendWeights<Backend>& weights,
                          const GenerationRequest& req) {
  const int B = int(req.prompts.size()), V = config.vocab_size;
  const DecoderLimits limits = request_limits(req);
  Decoder<Backend> model(be, config, weights, req.policy, limits);
  model.set_attention_timing(req.time_attention);
  model.set_graph_steps(req.graph_steps);
  std::unique_ptr<Decoder<Backend>> dense;  // the --check reference
  if (req.check) dense = std::make_unique<Decoder<Backend>>(be, config, weights, PolicyOptions(), limits);

  GenerationReport r;
  r.generated.assign(std::size_t(B), {});
  for (const auto& p : req.prompts) r.prompt_tokens += (long long)p.size();
  r.prefill_logits = prefill_request(model, req);
  r.prefill_ms = model.timing().total_ms;
  if (dense) dense->prefill(req.prompts);

  std::vector<Sampler> samplers;
  for (int b = 0; b < B; ++b) {
    SamplingOptions s = req.sampling;
    s.seed += std::uint64_t(b);  // independent streams, reproducible per sequence
    samplers.emplace_back(s);
  }
  std::vector<float> logits = r.prefill_logits;
  for (int step = 0; step < req.new_tokens; ++step) {
    std::vector<std::int32_t> next(static_cast<std::size_t>(B));
    for (int b = 0; b < B; ++b) {
      next[std::size_t(b)] = samplers[std::size_t(b)].next(logits.data() + std::int64_t(b) * V, V);
      r.generated[std::size_t(b)].push_back(next[std::size_t(b)]);
    }
    if (step + 1 == req.new_tokens) break;  // the last token needs no further forward pass
    logits = model.decode(next);
    r.step_ms.push_back(model.timing().total_ms);
    r.step_attention_ms.push_back(model.timing().attention_ms);
    r.step_bytes.push_back(double(model.step_bytes()));
    if (req.keep_logits) r.step_logits.push_back(logits);
    if (dense) {
      const std::vector<float> ref = dense->decode(next);
      for (int b = 0; b < B; ++b) {
        const float* p = ref.data() + std::int64_t(b) * V;
        const float* q = logits.data() + std::int64_t(b) * V;
        const double kl = kl_divergence(p, q, V);
        r.kl_sum += kl;
        r.kl_max = std::max(r.kl_max, kl);
        r.top1_agree += argmax(p, V) == argmax(q, V);
        ++r.compared;
      }
    }
    if (req.progress) req.progress("decode", step + 2, req.new_tokens);
  }
  r.kv_bytes_used = model.kv_bytes_used();
  r.kv_bytes_allocated = model.kv_bytes_allocated();
  return r;
}

}  // namespace minimal_decoder
