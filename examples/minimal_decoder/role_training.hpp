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
// The model runs on the chosen backend (CPU or GPU); the gates always train on the host, where a few
// thousand steps over a dozen gates take about a second.

#include <chrono>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "cli.hpp"
#include "gate_training.hpp"
#include "layer_distillation.hpp"
#include "passkey_eval.hpp"
#include "roles_output.hpp"

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

// How the loss is normalised, in words (reports and the roles file's header).
inline const char* gate_norm_text(GateNorm norm) {
  return norm == GateNorm::kModel ? "N = sum over layers >= 1 of ||O_dense||^2" : "N = the layer's ||O_dense||^2";
}

inline void print_gate_table(const GateTrainingResult& r, const std::vector<double>& sparse_error, GateNorm norm, int layers,
                             int kv_heads) {
  std::printf("E[Kuma(a, b)] per (layer, KV head) (retrieval iff > 0.5; layer 0 always retrieval), and in brackets the\n"
              "head's loss with its gate closed, ||O_sparse - O_dense||^2 / N (%s), mean over the prompts\n",
              gate_norm_text(norm));
  print_head_table(layers, kv_heads, 22, [&](int l, int j) {
    const std::size_t i = std::size_t(l * kv_heads + j);
    char cell[48];
    if (l == 0) std::snprintf(cell, sizeof cell, "R (forced)");
    else std::snprintf(cell, sizeof cell, "%s%.3f [%.4f]", r.roles[i] ? "R " : "", double(r.kuma_mean[i]), sparse_error[i]);
    return std::string(cell);
  });
}

// The command line that reproduces a run (the roles file names it), without --model and --roles-out.
inline std::string train_roles_command(const Options& o) {
  const LycheeOptions& ly = o.policy.lychee;
  std::string c = "minimal_decoder --train-roles " + o.train_roles + " --lengths ";
  for (std::size_t i = 0; i < o.lengths.size(); ++i) c += (i ? "," : "") + std::to_string(o.lengths[i]);
  if (o.limit > 0) c += " --limit " + std::to_string(o.limit);
  return c + " --train-steps " + std::to_string(o.train_steps) + " --train-heads " + std::to_string(o.train_heads) +
         " --train-seed " + std::to_string(o.train_seed) + " --train-norm " + o.train_norm + " --lychee-budget " +
         std::to_string(ly.budget) + " --lychee-sink " + std::to_string(ly.sink) + " --lychee-recent " +
         std::to_string(ly.recent);
}

template <class Backend>
int run_train_roles(Backend& be, const Options& o, const ModelConfig& config, const BackendWeights<Backend>& weights) {
  using Clock = std::chrono::steady_clock;
  auto seconds_since = [](Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); };
  const std::vector<PasskeyCase> all = read_passkey_file(o.train_roles);
  const LycheeOptions& ly = o.policy.lychee;
  const TokenBudget budget{ly.budget, ly.sink, ly.recent};
  const GateTrainingShape shape{config.num_layers, config.num_kv_heads, config.num_q_heads, config.head_dim,
                                kPasskeyDigits - 1};
  if (shape.layers < 2) throw DecoderError("--train-roles: a one-layer model has no heads to train (layer 0 is always retrieval)");
  check_target_heads(shape, o.train_heads);
  GateTrainingOptions opt;
  opt.steps = o.train_steps;
  opt.target_heads = o.train_heads;
  opt.seed = o.train_seed;
  opt.norm = o.train_norm == "layer" ? GateNorm::kLayer : GateNorm::kModel;
  const double target = double(o.train_heads) / shape.gates();
  std::printf("HardKuma head-role training (%s, %s): %d gates (layers 1..%d x %d KV heads), target %d heads =\n"
              "density %.4f, %d steps, seed %llu; LycheeDecode token mode, budget %d, sink %d, recent %d\n",
              o.train_roles.c_str(), be.name(), shape.gates(), shape.layers - 1, shape.kv_heads, o.train_heads, target,
              o.train_steps, static_cast<unsigned long long>(opt.seed), ly.budget, ly.sink, ly.recent);
  std::fflush(stdout);

  // Phase 1: the dense and sparse attention outputs of every prompt, once.
  const auto t_data = Clock::now();
  std::vector<PromptTargets> pool;
  std::string lengths_used;
  for (int L : o.lengths) {
    if (ly.budget >= L)
      std::fprintf(stderr, "note: --lychee-budget %d >= %d tokens: sparse heads see every token at this length\n", ly.budget, L);
    int done = 0;
    for (const auto& cases : passkey_batches(all, L, o.limit, o.eval_batch)) {
      for (PromptTargets& t : passkey_distillation_targets(be, config, weights, cases, o.prefill_chunk, budget))
        pool.push_back(std::move(t));
      done += int(cases.size());
      if (!o.quiet) std::fprintf(stderr, "train-roles L=%d: %d prompts collected (%.1f s)\n", L, done, seconds_since(t_data));
    }
    lengths_used += (lengths_used.empty() ? "" : " + ") + std::to_string(done) + " x " + std::to_string(L);
  }
  const double data_s = seconds_since(t_data);
  std::printf("data: %zu prompts (%s tokens) in %.1f s: dense prefill, teacher-forced d1..d4, per layer the dense and\n"
              "sparse attention outputs at the 4 decode steps; computed once per prompt, reused whenever a step draws it\n",
              pool.size(), lengths_used.c_str(), data_s);
  std::fflush(stdout);

  // Phase 2: the gates.
  const auto t_opt = Clock::now();
  const GateTrainingResult r = train_head_gates(pool, shape, opt, [&](const GateTrainingReport& p) {
    std::printf("step %6lld: loss %.6f  density %.4f  lambda %.3f\n", static_cast<long long>(p.step), p.loss, p.density,
                p.lambda);
    std::fflush(stdout);
  });
  const double opt_s = seconds_since(t_opt);
  std::printf("optimisation: %d steps in %.2f s\n", o.train_steps, opt_s);
  print_gate_table(r, sparse_error_table(pool, shape, opt.norm), opt.norm, shape.layers, shape.kv_heads);

  // Phase 3: the roles file, its header saying how it was made.
  const std::string chosen = retrieval_heads_beyond_layer0(r.roles, shape.kv_heads);
  char result[200];
  std::snprintf(result, sizeof result,
                "%d steps, target %d heads beyond layer 0 (density %.4f of %d gates), final density %.4f, lambda %.3f.",
                o.train_steps, o.train_heads, target, shape.gates(), r.last.density, r.last.lambda);
  write_roles_file(o.roles_out,
                   {"From HardKuma head-role training (" + train_roles_command(o) + "), " + std::to_string(pool.size()) +
                        " prompts (" + lengths_used + " tokens), " + be.name() + ".",
                    result,
                    std::string("Objective: layer-local distillation, sum over layers >= 1 of ||O_mix - O_dense||^2 / N ") +
                        "at the decode steps, " + gate_norm_text(opt.norm) +
                        "; sparse = token selection from the previous layer's dense scores.",
                    "Retrieval iff E[Kuma(a, b)] > 0.5, layer 0 forced. Learned: layer 0 + " + chosen + "."},
                   r.roles, shape.layers, shape.kv_heads);
  std::printf("roles written to %s: layer 0 + %s\n", o.roles_out.c_str(), chosen.c_str());
  std::printf("wall time: data %.1f s, optimisation %.2f s\n", data_s, opt_s);
  std::printf("check them: minimal_decoder --model %s --eval-passkey PROMPTS --lengths L,.. --lychee-budget %d \\\n"
              "  --lychee-sink %d --lychee-recent %d --roles %s\n",
              o.model_dir.c_str(), ly.budget, ly.sink, ly.recent, o.roles_out.c_str());
  return 0;
}

}  // namespace minimal_decoder
