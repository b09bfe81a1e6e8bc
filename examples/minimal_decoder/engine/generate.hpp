#pragma once
// The decode loop: prefill, then one token per sequence per step, chosen by the sampler; with
// `check`, a dense decoder runs alongside on the same tokens and every step's logits are compared.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "engine/decoder.hpp"
#include "engine/sampling.hpp"

namespace minimal_decoder {

struct GenerationReport {
  std::vector<std::vector<std::int32_t>> generated;  // [batch][new tokens]; empty for a rejected prompt
  // [batch]: why the prompt was rejected (GenerationRequest::reject_bad_prompts), "" for one that ran.
  std::vector<std::string> rejected;
  std::vector<float> prefill_logits;                 // [sequences that ran, vocab], of the policy's decoder
  std::vector<std::vector<float>> step_logits;       // [step][batch, vocab] when keep_logits
  double prefill_ms = 0;
  long long prompt_tokens = 0;
  std::vector<double> step_ms, step_attention_ms, step_all_reduce_ms;
  std::vector<double> step_bytes;  // Decoder::step_bytes of each step: the roofline's bytes
  std::int64_t kv_bytes_used = 0, kv_bytes_allocated = 0;
  // --check: over every (step, sequence) of the decode steps
  long long compared = 0, top1_agree = 0;
  double kl_sum = 0, kl_max = 0;
  // --soak (GenerationRequest::soak): NaN / inf entries over every logits vector (prefill and each step),
  // the first step that had one (-1: none; 0 is the prefill), and the backend's device memory in use
  // after the warm-up steps (by then every CUDA graph a step records exists, LycheeDecode's correction
  // steps' included) and after the last step (-1: the backend has no such count, or the run was not
  // longer than its warm-up).
  long long nonfinite_logits = 0;
  int first_nonfinite_step = -1;
  int memory_warmup_steps = 0;
  std::int64_t memory_after_warmup = -1, memory_at_end = -1;
  int ranks = 1;  // tensor-parallel ranks that ran the model (generate_tensor_parallel), 1 for generate

  // Sequences that ran: the batch less the rejected prompts.
  int sequences_run() const {
    int n = 0;
    for (const auto& why : rejected) n += why.empty();
    return rejected.empty() ? int(generated.size()) : n;
  }
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
  double all_reduce_ms() const {  // rank 0's all-reduces (timed with the attention; 0 for one rank)
    double s = 0;
    for (double x : step_all_reduce_ms) s += x;
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
  // A malformed prompt (empty, or a token id outside the vocabulary) is rejected on its own, named in
  // GenerationReport::rejected, and the batch runs without it; false: it fails the request
  // (DecoderError), as a whole.
  bool reject_bad_prompts = false;
  bool soak = false;         // --soak: check every logits vector for NaN / inf, measure device memory
  int soak_warmup = 100;     // --soak: steps before the first memory reading (fewer if the run is short)
  GenerationProgress progress;
};

// NaN and inf entries of `v` (--soak).
inline long long count_nonfinite(const std::vector<float>& v) {
  long long n = 0;
  for (float x : v) n += !std::isfinite(x);
  return n;
}

// --soak's throughput: decode tokens per second over consecutive windows of `window` steps of
// `step_ms` (a last partial window is dropped unless it is the only one), for `batch` sequences.
inline std::vector<double> windowed_tokens_per_s(const std::vector<double>& step_ms, int window, int batch) {
  std::vector<double> out;
  if (window <= 0) return out;
  for (std::size_t i = 0; i < step_ms.size(); i += std::size_t(window)) {
    const std::size_t end = std::min(step_ms.size(), i + std::size_t(window));
    if (end - i < std::size_t(window) && !out.empty()) break;
    double ms = 0;
    for (std::size_t j = i; j < end; ++j) ms += step_ms[j];
    out.push_back(ms > 0 ? double(end - i) * batch / (ms / 1e3) : 0.0);
  }
  return out;
}

// Whether a --soak run failed: a NaN / inf logit, or device memory that grew or shrank between the
// end of the warm-up and the last step (where the backend can count it).
inline bool soak_failed(const GenerationReport& r) {
  return r.nonfinite_logits > 0 ||
         (r.memory_after_warmup >= 0 && r.memory_at_end >= 0 && r.memory_after_warmup != r.memory_at_end);
}

// What is wrong with a prompt for a model of `vocab_size` tokens ("" when nothing is): the checks
// Decoder::prefill makes on its own (besides the decoder's length limit, which comes from the batch).
inline std::string prompt_problem(const std::vector<std::int32_t>& prompt, int vocab_size) {
  if (prompt.empty()) return "the prompt is empty";
  for (std::size_t i = 0; i < prompt.size(); ++i)
    if (prompt[i] < 0 || prompt[i] >= vocab_size)
      return "token " + std::to_string(i) + " = " + std::to_string(prompt[i]) + " is outside the vocabulary [0, " +
             std::to_string(vocab_size) + ")";
  return "";
}

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
// Model: Decoder<Backend>, or TensorParallelDecoder (engine/tensor_parallel_decoder.hpp), which has
// the members this loop uses.
template <class Model>
std::vector<float> prefill_request(Model& model, const GenerationRequest& req) {
  if (!req.synthetic_prefill)
    return model.prefill(req.prompts, [&](long long d, long long t) {
      if (req.progress) req.progress("prefill", d, t);
    });
  std::vector<int> lengths;
  for (const auto& p : req.prompts) lengths.push_back(int(p.size()));
  return model.synthetic_prefill(lengths, req.sampling.seed + 1);
}

namespace detail {

// The decode loop over prompts that all run; origin[b] is prompt b's index in the caller's batch (its
// sampling stream's seed, so a rejection elsewhere in the batch does not change what it samples).
// make_model(policy, limits) returns a std::unique_ptr to a new model; memory_in_use() is the
// backend's device memory in use (--soak; -1 where it has no such count).
template <class MakeModel, class MemoryInUse>
GenerationReport generate_batch(MakeModel&& make_model, MemoryInUse&& memory_in_use, const ModelConfig& config,
                                const GenerationRequest& req, const std::vector<int>& origin) {
  const int B = int(req.prompts.size()), V = config.vocab_size;
  const DecoderLimits limits = request_limits(req);
  auto model_ptr = make_model(req.policy, limits);
  auto& model = *model_ptr;
  model.set_attention_timing(req.time_attention);
  model.set_graph_steps(req.graph_steps);
  decltype(model_ptr) dense;  // the --check reference
  if (req.check) dense = make_model(PolicyOptions(), limits);

  GenerationReport r;
  r.generated.assign(std::size_t(B), {});
  for (const auto& p : req.prompts) r.prompt_tokens += (long long)p.size();
  r.prefill_logits = prefill_request(model, req);
  r.prefill_ms = model.timing().total_ms;
  if (dense) dense->prefill(req.prompts);

  std::vector<Sampler> samplers;
  for (int b = 0; b < B; ++b) {
    SamplingOptions s = req.sampling;
    s.seed += std::uint64_t(origin[std::size_t(b)]);  // independent streams, reproducible per sequence
    samplers.emplace_back(s);
  }
  std::vector<float> logits = r.prefill_logits;
  auto soak_check = [&](const std::vector<float>& l, int step) {
    if (!req.soak) return;
    const long long n = count_nonfinite(l);
    r.nonfinite_logits += n;
    if (n > 0 && r.first_nonfinite_step < 0) r.first_nonfinite_step = step;
  };
  soak_check(logits, 0);
  // The decode steps are new_tokens - 1 (the last token needs no forward pass); keep at least one
  // after the warm-up. The warm-up covers every CUDA graph's recording: the step's at the first step,
  // LycheeDecode's correction step's at the first correction (step correction_interval).
  const int corrections_from = req.policy.kind == PolicyKind::kLycheeDecode ? req.policy.lycheedecode.correction_interval : 0;
  r.memory_warmup_steps = std::max(1, std::min(std::max(req.soak_warmup, corrections_from), req.new_tokens - 2));
  for (int step = 0; step < req.new_tokens; ++step) {
    std::vector<std::int32_t> next(static_cast<std::size_t>(B));
    for (int b = 0; b < B; ++b) {
      next[std::size_t(b)] = samplers[std::size_t(b)].next(logits.data() + std::int64_t(b) * V, V);
      r.generated[std::size_t(b)].push_back(next[std::size_t(b)]);
    }
    if (step + 1 == req.new_tokens) break;  // the last token needs no further forward pass
    logits = model.decode(next);
    soak_check(logits, step + 1);
    if (req.soak && step + 1 == r.memory_warmup_steps) r.memory_after_warmup = memory_in_use();
    r.step_ms.push_back(model.timing().total_ms);
    r.step_attention_ms.push_back(model.timing().attention_ms);
    r.step_all_reduce_ms.push_back(model.timing().all_reduce_ms);
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
  if (req.soak && r.memory_after_warmup >= 0 && int(r.step_ms.size()) > r.memory_warmup_steps)
    r.memory_at_end = memory_in_use();
  else
    r.memory_after_warmup = -1;
  r.kv_bytes_used = model.kv_bytes_used();
  r.kv_bytes_allocated = model.kv_bytes_allocated();
  return r;
}

// The request's prompts through run_batch(admitted request, origin): all of them, or with
// reject_bad_prompts the well-formed ones, the malformed named in GenerationReport::rejected.
template <class RunBatch>
GenerationReport generate_admitted(const ModelConfig& config, const GenerationRequest& req, RunBatch&& run_batch) {
  const int B = int(req.prompts.size());
  std::vector<int> origin;
  if (!req.reject_bad_prompts) {  // a bad prompt fails the whole request (Decoder::prefill)
    for (int b = 0; b < B; ++b) origin.push_back(b);
    GenerationReport r = run_batch(req, origin);
    r.rejected.assign(static_cast<std::size_t>(B), std::string());
    return r;
  }
  std::vector<std::string> rejected(static_cast<std::size_t>(B));
  GenerationRequest admitted = req;
  admitted.prompts.clear();
  for (int b = 0; b < B; ++b) {
    rejected[std::size_t(b)] = prompt_problem(req.prompts[std::size_t(b)], config.vocab_size);
    if (!rejected[std::size_t(b)].empty()) continue;
    origin.push_back(b);
    admitted.prompts.push_back(req.prompts[std::size_t(b)]);
  }
  if (origin.empty()) throw DecoderError("every prompt of the batch was rejected; the first: " + rejected[0]);
  GenerationReport r = run_batch(admitted, origin);
  r.rejected = std::move(rejected);
  if (int(origin.size()) == B) return r;
  // Back to the caller's batch: rejected prompts get no tokens.
  std::vector<std::vector<std::int32_t>> generated(static_cast<std::size_t>(B));
  for (std::size_t i = 0; i < origin.size(); ++i) generated[std::size_t(origin[i])] = std::move(r.generated[i]);
  r.generated = std::move(generated);
  return r;
}

}  // namespace detail

// Compiled once per backend (host_engine.cpp, cuda/cuda_engine.cu).
template <class Backend>
GenerationReport generate(Backend& be, const ModelConfig& config, const BackendWeights<Backend>& weights,
                          const GenerationRequest& req) {
  return detail::generate_admitted(config, req, [&](const GenerationRequest& admitted, const std::vector<int>& origin) {
    return detail::generate_batch(
        [&](const PolicyOptions& policy, const DecoderLimits& limits) {
          return std::make_unique<Decoder<Backend>>(be, config, weights, policy, limits);
        },
        [&] { return be.device_memory_in_use(); }, config, admitted, origin);
  });
}

}  // namespace minimal_decoder
