#pragma once
// Passkey evaluation (issue 9): does a policy keep what the model needs to answer?
//
// The protocol on the prompts of a passkey checkpoint (prompt_files.hpp):
//   1. dense prefill of the whole prompt (QUERY included); d1 = argmax of the last prefill logits;
//   2. four greedy decode steps under the policy, each fed the previous digit;
//   3. correct when all five digits match.
// The prefill is dense for every policy, so it runs once per batch of prompts and every policy starts
// from it (Decoder::prefill_from): a compressing policy compresses the dense prompt cache with the
// kept window queries, LycheeDecode and dense start from a copy of it. The answers are the same as
// with a separate prefill per policy, at 1/P of the cost.
//
// The templates run on either backend (compiled for both in tools_host.cpp and tools_cuda.cu); the
// tables, JSON and policy lists are in passkey_eval.cpp.

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "engine/decoder.hpp"
#include "engine/sampling.hpp"
#include "tools/prompt_files.hpp"

namespace minimal_decoder {

struct EvalPolicy {
  std::string label;  // short name for tables and JSON
  PolicyOptions policy;
};

struct PasskeyOutcome {
  int correct = 0, total = 0;
  std::vector<std::vector<std::int32_t>> outputs;  // the five generated ids per prompt
  double accuracy() const { return total ? double(correct) / double(total) : 0.0; }
};

struct PasskeyReport {
  std::vector<int> lengths;
  std::vector<EvalPolicy> policies;
  std::vector<std::vector<PasskeyOutcome>> outcomes;  // [length][policy]
  std::vector<double> prefill_seconds;                // per length
};

// The decoder sizes of a batch of passkey prompts: the longest prompt, four decode steps.
DecoderLimits passkey_limits(const std::vector<PasskeyCase>& cases, int prefill_chunk, KvDtype kv_dtype = KvDtype::kNative);

// The widest observation window of the compressing policies among `policies` (0: none).
int max_window(const std::vector<EvalPolicy>& policies);

// The policies of an evaluation: every policy with the command line's options (Cp, W, theta,
// num_block, pool, sinks, LycheeDecode budget/sink/recent/mode), ClusterAttn once per (theta,
// num_block) in `cluster_settings` when given, LycheeDecode once with layer-0-only roles (the
// control: the roles must do the work) and once more with --roles when given.
std::vector<EvalPolicy> passkey_policies(const PolicyOptions& base,
                                         const std::vector<std::pair<float, int>>& cluster_settings = {});

void print_passkey_table(const PasskeyReport& r);
void write_passkey_json(const PasskeyReport& r, const std::vector<PasskeyCase>& all, int limit, const std::string& model,
                        const std::string& backend, const std::string& path);

// Step 1 of the protocol, shared by every policy: a dense decoder prefills the batch (keeping
// `keep_window` window queries for compressing policies); `first` receives d1 per prompt.
template <class Backend>
std::unique_ptr<Decoder<Backend>> passkey_prefill(Backend& be, const ModelConfig& config,
                                                  const BackendWeights<Backend>& weights,
                                                  const std::vector<PasskeyCase>& cases, int prefill_chunk,
                                                  int keep_window, std::vector<std::int32_t>* first,
                                                  KvDtype kv_dtype = KvDtype::kNative) {
  DecoderLimits limits = passkey_limits(cases, prefill_chunk, kv_dtype);
  limits.keep_window_queries = keep_window;
  auto source = std::make_unique<Decoder<Backend>>(be, config, weights, PolicyOptions(), limits);
  std::vector<std::vector<std::int32_t>> prompts;
  for (const PasskeyCase& c : cases) prompts.push_back(c.prompt);
  const std::vector<float> logits = source->prefill(prompts);
  const int V = config.vocab_size;
  first->assign(cases.size(), 0);
  for (std::size_t b = 0; b < cases.size(); ++b) (*first)[b] = argmax(logits.data() + std::int64_t(b) * V, V);
  return source;
}

// Steps 2-3 for one policy, starting from the shared prefill (which it does not modify).
template <class Backend>
PasskeyOutcome passkey_decode(Backend& be, const ModelConfig& config, const BackendWeights<Backend>& weights,
                              const Decoder<Backend>& source, const std::vector<std::int32_t>& first,
                              const std::vector<PasskeyCase>& cases, const PolicyOptions& policy, int prefill_chunk) {
  const int B = int(cases.size()), V = config.vocab_size;
  // The policy's decoder stores K/V as the shared prefill did (its caches are copied or compressed).
  Decoder<Backend> model(be, config, weights, policy, passkey_limits(cases, prefill_chunk, source.kv_dtype()));
  model.prefill_from(source);
  PasskeyOutcome o;
  o.total = B;
  o.outputs.assign(std::size_t(B), {});
  std::vector<std::int32_t> next = first;
  for (int step = 0;; ++step) {
    for (int b = 0; b < B; ++b) o.outputs[std::size_t(b)].push_back(next[std::size_t(b)]);
    if (step == kPasskeyDigits - 1) break;  // the fifth digit needs no further forward pass
    const std::vector<float> logits = model.decode(next);
    for (int b = 0; b < B; ++b) next[std::size_t(b)] = argmax(logits.data() + std::int64_t(b) * V, V);
  }
  for (int b = 0; b < B; ++b) o.correct += o.outputs[std::size_t(b)] == cases[std::size_t(b)].answer;
  return o;
}

// Teacher-forced decode of d1..d4 on the source (after every policy has started from its prefill),
// handing each layer's post-RoPE decode queries to `tap(layer, step, q)` (q in backend memory, [B, Hq * D]).
template <class Backend, class Tap>
void passkey_teacher_forced(Decoder<Backend>& source, const std::vector<PasskeyCase>& cases, Tap&& tap) {
  int step = 0;
  source.set_query_tap([&](int layer, const float* q, int) { tap(layer, step, q); });
  for (step = 0; step < kPasskeyDigits - 1; ++step) {
    std::vector<std::int32_t> next;
    for (const PasskeyCase& c : cases) next.push_back(c.answer[std::size_t(step)]);
    source.decode(next);
  }
  source.set_query_tap(nullptr);
}

// The post-RoPE queries of every layer during that teacher-forced decode (positions L..L+3), as host
// floats [layer][B, steps, q_heads * head_dim]. The source is left after the answer's fourth digit.
template <class Backend>
std::vector<std::vector<float>> collect_decode_queries(Backend& be, const ModelConfig& config, Decoder<Backend>& source,
                                                       const std::vector<PasskeyCase>& cases) {
  const int B = int(cases.size()), steps = kPasskeyDigits - 1, qd = int(config.q_dim());
  std::vector<std::vector<float>> dq(std::size_t(config.num_layers), std::vector<float>(std::size_t(B) * steps * qd));
  std::vector<float> rows(std::size_t(B) * qd);
  passkey_teacher_forced(source, cases, [&](int layer, int step, const float* q) {
    be.download(rows.data(), q, rows.size());
    for (int b = 0; b < B; ++b)
      std::copy_n(rows.begin() + std::int64_t(b) * qd, qd, dq[std::size_t(layer)].begin() + (std::int64_t(b) * steps + step) * qd);
  });
  return dq;
}

// The whole protocol for one batch: one dense prefill, then every policy's decode steps from it.
template <class Backend>
std::vector<PasskeyOutcome> evaluate_passkey_batch(Backend& be, const ModelConfig& config,
                                                   const BackendWeights<Backend>& weights,
                                                   const std::vector<PasskeyCase>& cases,
                                                   const std::vector<EvalPolicy>& policies, int prefill_chunk,
                                                   double* prefill_ms = nullptr, KvDtype kv_dtype = KvDtype::kNative) {
  std::vector<std::int32_t> first;
  const auto source = passkey_prefill(be, config, weights, cases, prefill_chunk, max_window(policies), &first, kv_dtype);
  if (prefill_ms) *prefill_ms = source->timing().total_ms;
  std::vector<PasskeyOutcome> outcomes;
  for (const EvalPolicy& p : policies)
    outcomes.push_back(passkey_decode(be, config, weights, *source, first, cases, p.policy, prefill_chunk));
  return outcomes;
}

// Every length in `lengths`, `limit` prompts each, in batches of at most `batch` prompts.
template <class Backend>
PasskeyReport evaluate_passkey(Backend& be, const ModelConfig& config, const BackendWeights<Backend>& weights,
                               const std::vector<PasskeyCase>& all, const std::vector<int>& lengths, int limit,
                               const std::vector<EvalPolicy>& policies, int batch, int prefill_chunk, bool verbose, KvDtype kv_dtype = KvDtype::kNative) {
  PasskeyReport r;
  r.lengths = lengths;
  r.policies = policies;
  for (int L : lengths) {
    std::vector<PasskeyOutcome> total(policies.size());
    double seconds = 0;
    int done = 0, cases = int(passkey_cases_of_length(all, L, limit).size());
    for (const std::vector<PasskeyCase>& chunk : passkey_batches(all, L, limit, batch)) {
      double prefill_ms = 0;
      const std::vector<PasskeyOutcome> part =
          evaluate_passkey_batch(be, config, weights, chunk, policies, prefill_chunk, &prefill_ms, kv_dtype);
      seconds += prefill_ms / 1e3;
      done += int(chunk.size());
      for (std::size_t p = 0; p < policies.size(); ++p) {
        total[p].correct += part[p].correct;
        total[p].total += part[p].total;
        total[p].outputs.insert(total[p].outputs.end(), part[p].outputs.begin(), part[p].outputs.end());
      }
      if (verbose) {  // running totals, so a long run that is stopped still says what it measured
        std::fprintf(stderr, "passkey L=%d: %d/%d prompts (prefill %.1f s):", L, done, cases, prefill_ms / 1e3);
        for (const PasskeyOutcome& o : total) std::fprintf(stderr, " %d/%d", o.correct, o.total);
        std::fprintf(stderr, "\n");
      }
    }
    r.outcomes.push_back(std::move(total));
    r.prefill_seconds.push_back(seconds);
  }
  return r;
}

}  // namespace minimal_decoder
