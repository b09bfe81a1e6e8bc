#pragma once
// --train-roles: LycheeDecode head roles learned by HardKuma gate training on passkey training
// prompts (issue 9; docs/fidelity.md "HardKuma role training"). Three phases:
//   1. data: per batch of prompts, one dense prefill (passkey_prefill) and the teacher-forced answer
//      d1..d4 with every layer's decode queries kept (collect_decode_queries); then each layer's K/V
//      cache is read to the host and PromptDistiller turns queries and caches into each prompt's dense
//      and sparse attention outputs per layer (layer_distillation.hpp).
//   2. optimisation: train_head_gates (gate_training.hpp) with kvsift's host gate ops. A step draws
//      one prompt; its outputs were computed once in phase 1 and are reused whenever it is drawn
//      again, because the layer-local objective does not depend on the other layers' gates.
//   3. roles: E[Kuma(a, b)] > 0.5, layer 0 forced; written to --roles-out.
// The model runs on the chosen backend (CPU or GPU): phase 1 is the template below; the gates always
// train on the host (role_training.cpp), where a few thousand steps over a dozen gates take a second.

#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include <kvsift/kvsift.hpp>

#include "tools/gate_training.hpp"
#include "tools/layer_distillation.hpp"
#include "tools/passkey_eval.hpp"
#include "tools/passkey_tool_options.hpp"

namespace minimal_decoder {

// Layer `layer`'s K and V of a batch after its decode steps, as host floats [B, kv_heads, tokens,
// head_dim]; sequence b's rows [0, lengths[b]) are filled. kvsift's copy_kv_to_dense (host or CUDA,
// found by the backend's Exec) reads the decoder's cache through its view, so this does not depend on
// the cache layout; the backend's element type (float on the CPU, bf16 on the GPU) becomes float here.
template <class Backend>
void read_layer_kv(Backend& be, const Decoder<Backend>& source, int layer, const std::vector<std::int32_t>& lengths,
                   int tokens, std::vector<float>* k, std::vector<float>* v) {
  using KV = typename Backend::KvType;
  auto lens = be.template alloc<std::int32_t>(lengths.size());
  be.upload(lens.data(), lengths.data(), lengths.size());
  const auto view = source.cache_view(layer, lens.data());
  const std::size_t n = std::size_t(view.batch) * view.num_kv_heads * tokens * view.head_dim;
  auto dk = be.template alloc<KV>(n), dv = be.template alloc<KV>(n);
  // kvsift: the cache, through its view, into dense [B, kv_heads, tokens, head_dim] arrays.
  check(copy_kv_to_dense(be.exec(), view, tokens, dk.data(), dv.data()),
        "copy_kv_to_dense (layer " + std::to_string(layer) + ")");
  std::vector<KV> hk(n), hv(n);
  be.download(hk.data(), dk.data(), n);
  be.download(hv.data(), dv.data(), n);
  k->resize(n);
  v->resize(n);
  for (std::size_t i = 0; i < n; ++i) {
    (*k)[i] = kvsift::to_float(hk[i]);
    (*v)[i] = kvsift::to_float(hv[i]);
  }
}

// Phase 1 for one batch: the training targets of each prompt (see layer_distillation.hpp).
template <class Backend>
std::vector<PromptTargets> passkey_distillation_targets(Backend& be, const ModelConfig& config,
                                                        const BackendWeights<Backend>& weights,
                                                        const std::vector<PasskeyCase>& cases, int prefill_chunk,
                                                        const TokenBudget& budget) {
  const int B = int(cases.size()), steps = kPasskeyDigits - 1, qd = int(config.q_dim());
  std::vector<std::int32_t> first;
  auto source = passkey_prefill(be, config, weights, cases, prefill_chunk, 0, &first);
  const std::vector<std::vector<float>> dq = collect_decode_queries(be, config, *source, cases);
  std::vector<std::int32_t> lengths;
  int tokens = 0;
  for (const PasskeyCase& c : cases) {
    lengths.push_back(std::int32_t(c.prompt.size()) + steps);
    tokens = std::max(tokens, int(lengths.back()));
  }
  const DecodeShape shape{config.num_q_heads, config.num_kv_heads, config.head_dim, steps};
  std::vector<PromptDistiller> distillers;
  for (const PasskeyCase& c : cases) distillers.emplace_back(shape, int(c.prompt.size()), budget);
  std::vector<float> k, v;
  for (int l = 0; l < config.num_layers; ++l) {  // one layer's caches on the host at a time
    read_layer_kv(be, *source, l, lengths, tokens, &k, &v);
    const std::int64_t per_prompt = std::int64_t(config.num_kv_heads) * tokens * config.head_dim;
    for (int b = 0; b < B; ++b)
      distillers[std::size_t(b)].add_layer(DecodeLayer{dq[std::size_t(l)].data() + std::int64_t(b) * steps * qd,
                                                       k.data() + b * per_prompt, v.data() + b * per_prompt, tokens});
  }
  std::vector<PromptTargets> out;
  for (PromptDistiller& d : distillers) out.push_back(d.take());
  return out;
}

// The phases' host parts (role_training.cpp): the checks and the header line before phase 1, and
// phases 2-3 once the targets are collected.
GateTrainingShape start_role_training(const PasskeyToolOptions& o, const ModelConfig& config, const char* backend);
int finish_role_training(const PasskeyToolOptions& o, const GateTrainingShape& shape, const char* backend,
                         const std::vector<PromptTargets>& pool, const std::string& lengths_used, double data_seconds);

template <class Backend>
int run_train_roles(Backend& be, const PasskeyToolOptions& o, const ModelConfig& config,
                    const BackendWeights<Backend>& weights) {
  using Clock = std::chrono::steady_clock;
  auto seconds_since = [](Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); };
  const std::vector<PasskeyCase> all = read_passkey_file(o.prompt_file);
  const GateTrainingShape shape = start_role_training(o, config, be.name());
  const LycheeDecodeOptions& ly = o.policy.lycheedecode;
  const TokenBudget budget{ly.budget, ly.sink, ly.recent};

  // Phase 1: the dense and sparse attention outputs of every prompt, once.
  const auto t_data = Clock::now();
  std::vector<PromptTargets> pool;
  std::string lengths_used;
  for (int L : o.lengths) {
    if (ly.budget >= L)
      std::fprintf(stderr, "note: --lycheedecode-budget %d >= %d tokens: sparse heads see every token at this length\n", ly.budget, L);
    int done = 0;
    for (const auto& cases : passkey_batches(all, L, o.limit, o.batch)) {
      for (PromptTargets& t : passkey_distillation_targets(be, config, weights, cases, o.prefill_chunk, budget))
        pool.push_back(std::move(t));
      done += int(cases.size());
      if (o.verbose) std::fprintf(stderr, "train-roles L=%d: %d prompts collected (%.1f s)\n", L, done, seconds_since(t_data));
    }
    lengths_used += (lengths_used.empty() ? "" : " + ") + std::to_string(done) + " x " + std::to_string(L);
  }
  return finish_role_training(o, shape, be.name(), pool, lengths_used, seconds_since(t_data));
}

}  // namespace minimal_decoder
