#pragma once
// The decoder's passkey modes (issue 9), dispatched from main.cpp:
//   --eval-passkey           passkey_eval.hpp: per-length accuracy of every policy
//   --calibrate-clusterattn  ClusterAttn theta x num_block with kvsift::calibrate_num_block
//   --probe-roles            a CPU probe for LycheeDecode retrieval heads (not HardKuma training)
//   --train-roles            role_training.hpp: LycheeDecode head roles from HardKuma gate training

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <string>
#include <type_traits>
#include <vector>

#include "cli.hpp"
#include "passkey_eval.hpp"
#include "role_training.hpp"
#include "roles_output.hpp"
#include "token_selection.hpp"

namespace minimal_decoder {

template <class Backend>
int run_passkey_eval(Backend& be, const Options& o, const ModelConfig& config, const BackendWeights<Backend>& weights) {
  const std::vector<PasskeyCase> all = read_passkey_file(o.eval_passkey);
  const std::vector<EvalPolicy> policies = passkey_policies(o.policy, o.eval_clusterattn);
  const PasskeyReport r =
      evaluate_passkey(be, config, weights, all, o.lengths, o.limit, policies, o.eval_batch, o.prefill_chunk, !o.quiet);
  std::printf("passkey accuracy (%s, %s; all five digits correct)\n", o.eval_passkey.c_str(), be.name());
  print_passkey_table(r);
  if (!o.json.empty()) write_passkey_json(r, all, o.limit, o.model_dir, be.name(), o.json);
  return 0;
}

// Position of d1 (the token after KEY_START) in a prompt.
inline int passkey_digit_position(const std::vector<std::int32_t>& prompt) {
  for (std::size_t i = 0; i + kPasskeyDigits + 1 < prompt.size(); ++i)
    if (prompt[i] == kKeyStart) return int(i) + 1;
  throw DecoderError("a passkey prompt without KEY_START d1..d5 KEY_END");
}

// --calibrate-clusterattn: for every theta, kvsift::calibrate_num_block over the num_block
// candidates on every layer (the decode queries are those of dense decoding of the answer, positions
// L..L+3), averaged over layers and prompts; next to it, the passkey accuracy of each setting on the
// same prompts. Training prompts only: the evaluation set must not choose the setting.
template <class Backend>
int run_calibrate_clusterattn(Backend& be, const Options& o, const ModelConfig& config,
                              const BackendWeights<Backend>& weights) {
  const std::vector<PasskeyCase> all = read_passkey_file(o.calibrate_clusterattn);
  const int T = int(o.thetas.size()), N = int(o.num_blocks.size()), steps = kPasskeyDigits - 1;
  const int Hq = config.num_q_heads, D = config.head_dim;
  kvsift::PromptCompressionConfig base = o.policy.compression;
  base.policy = kvsift::CompressionPolicy::kClusterAttn;
  std::printf("ClusterAttn calibration (%s): Cp %d, W %d; mean cosine of full vs kept attention (decode queries,\n"
              "all layers and heads) and passkey accuracy, per theta x num_block\n",
              o.calibrate_clusterattn.c_str(), base.capacity, base.window);
  for (int L : o.lengths) {
    std::vector<double> cosine(std::size_t(T * N), 0.0);
    std::vector<int> correct(std::size_t(T * N), 0);
    int prompts = 0;
    for (const auto& cases : passkey_batches(all, L, o.limit, o.eval_batch)) {
      const int B = int(cases.size());
      std::vector<std::int32_t> first;
      auto source = passkey_prefill(be, config, weights, cases, o.prefill_chunk, base.window, &first);
      for (int t = 0; t < T; ++t)
        for (int n = 0; n < N; ++n) {
          PolicyOptions p = o.policy;
          p.kind = PolicyKind::kClusterAttn;
          p.compression.theta = o.thetas[std::size_t(t)];
          p.compression.num_block = o.num_blocks[std::size_t(n)];
          correct[std::size_t(t * N + n)] += passkey_decode(be, config, weights, *source, first, cases, p, o.prefill_chunk).correct;
        }
      // Decode queries [layer][B, steps, Hq, D] of the dense continuation.
      const std::vector<std::vector<float>> dq = collect_decode_queries(be, config, *source, cases);
      std::vector<std::int32_t> lens;
      for (const PasskeyCase& c : cases) lens.push_back(std::int32_t(c.prompt.size()));
      auto lengths = be.template alloc<std::int32_t>(lens.size());
      be.upload(lengths.data(), lens.data(), lens.size());
      const kvsift::PromptCompressionShape shape{B, config.num_kv_heads, Hq, L};
      using KV = typename Backend::KvType;
      auto scratch_k = be.template alloc<KV>(std::size_t(B) * config.kv_dim() * base.capacity);
      auto scratch_v = be.template alloc<KV>(std::size_t(B) * config.kv_dim() * base.capacity);
      const auto scratch = kvsift::make_bhsd(scratch_k.data(), scratch_v.data(), B, config.num_kv_heads, base.capacity, D,
                                             lengths.data());
      auto queries = be.template alloc<float>(dq[0].size());
      auto ws = be.template alloc<unsigned char>(kvsift::calibrate_num_block_workspace_bytes(base, shape, steps));
      for (int t = 0; t < T; ++t) {
        kvsift::PromptCompressionConfig c = base;
        c.theta = o.thetas[std::size_t(t)];
        for (int l = 0; l < config.num_layers; ++l) {
          be.upload(queries.data(), dq[std::size_t(l)].data(), dq[std::size_t(l)].size());
          kvsift::NumBlockCalibration result;
          check(kvsift::calibrate_num_block(be.exec(), c, shape, source->cache_view(l, lengths.data()),
                                            source->window_queries(l, c.window), nullptr,
                                            kvsift::make_query_rows<float>(queries.data(), steps, Hq, D), steps,
                                            o.num_blocks, scratch, ws.data(), ws.size(), &result),
                "calibrate_num_block (layer " + std::to_string(l) + ")");
          for (int n = 0; n < N; ++n)
            cosine[std::size_t(t * N + n)] += result.table[std::size_t(n)].mean_cosine * B / config.num_layers;
        }
      }
      prompts += B;
      if (!o.quiet) std::fprintf(stderr, "calibration L=%d: %d prompts done\n", L, prompts);
    }
    std::printf("\nL = %d (%d prompts of %s): cosine / accuracy\n%-8s", L, prompts, o.calibrate_clusterattn.c_str(), "theta");
    for (int nb : o.num_blocks) std::printf(" %20s", ("num_block " + std::to_string(nb)).c_str());
    std::printf("\n");
    int best = 0;
    for (int t = 0; t < T; ++t) {
      std::printf("%-8g", double(o.thetas[std::size_t(t)]));
      for (int n = 0; n < N; ++n) {
        const int i = t * N + n;
        if (cosine[std::size_t(i)] > cosine[std::size_t(best)]) best = i;
        char cell[48];
        std::snprintf(cell, sizeof cell, "%.5f / %.3f", cosine[std::size_t(i)] / prompts, double(correct[std::size_t(i)]) / prompts);
        std::printf(" %20s", cell);
      }
      std::printf("\n");
    }
    std::printf("best mean cosine at L = %d: theta %g, num_block %d (%.5f, accuracy %.3f)\n", L,
                double(o.thetas[std::size_t(best / N)]), o.num_blocks[std::size_t(best % N)], cosine[std::size_t(best)] / prompts,
                double(correct[std::size_t(best)]) / prompts);
    std::fflush(stdout);  // one table per length, visible while the next length runs
  }
  return 0;
}

// --probe-roles: which KV heads read the passkey? For every (layer, KV head), over the decode
// queries of the dense continuation (positions L..L+3, teacher-forced answer digits):
//   mass    the softmax attention on the five digit tokens, mean over the group's query heads;
//   recall  the share of the five digits in the head's own LycheeDecode token selection (group-mean
//           raw scores, sink + recent forced, budget), i.e. what it would hand to sparse heads.
// The roles file gets layer 0 plus the --probe-heads heads of highest mass beyond layer 0. Every
// single extra head, and the chosen set, are also decoded under LycheeDecode on the same prompts.
// This is a probe on training prompts, not HardKuma training (--train-roles, role_training.hpp).
template <class Backend>
int run_probe_roles(Backend& be, const Options& o, const ModelConfig& config, const BackendWeights<Backend>& weights) {
  if constexpr (!std::is_same<typename Backend::KvType, float>::value) {
    (void)be, (void)config, (void)weights;
    throw DecoderError("--probe-roles reads the KV cache on the host: run it with --device cpu");
  } else {
    const std::vector<PasskeyCase> all = read_passkey_file(o.probe_roles);
    const int layers = config.num_layers, Hkv = config.num_kv_heads, Hq = config.num_q_heads, D = config.head_dim;
    const int G = Hq / Hkv, qd = int(config.q_dim()), heads = layers * Hkv;
    const LycheeOptions& ly = o.policy.lychee;
    // Role sets to verify: layer 0 only, then layer 0 + each single head beyond it.
    auto layer0 = [&] {
      std::vector<std::uint8_t> r(std::size_t(heads), 0);
      std::fill_n(r.begin(), Hkv, std::uint8_t(1));
      return r;
    };
    auto head_name = [&](int i) { return std::to_string(i / Hkv) + "." + std::to_string(i % Hkv); };
    std::vector<PolicyOptions> candidates;
    for (int i = Hkv - 1; i < heads; ++i) {  // i = Hkv - 1 stands for layer 0 only
      PolicyOptions p = o.policy;
      p.kind = PolicyKind::kLychee;
      p.lychee.roles_file.clear();
      p.lychee.roles = layer0();
      p.lychee.roles_name = i < Hkv ? "layer 0 only" : "L0+" + head_name(i);
      if (i >= Hkv) p.lychee.roles[std::size_t(i)] = 1;
      candidates.push_back(p);
    }
    std::vector<int> correct(candidates.size(), 0);
    std::vector<double> mass(std::size_t(heads), 0.0), recall(std::size_t(heads), 0.0);
    long long samples = 0;  // (prompt, step) pairs
    int prompts = 0;
    for (int L : o.lengths)
      for (const auto& cases : passkey_batches(all, L, o.limit, o.eval_batch)) {
        const int B = int(cases.size());
        std::vector<std::int32_t> first;
        auto source = passkey_prefill(be, config, weights, cases, o.prefill_chunk, 0, &first);
        for (std::size_t c = 0; c < candidates.size(); ++c)
          correct[c] += passkey_decode(be, config, weights, *source, first, cases, candidates[c], o.prefill_chunk).correct;
        std::vector<int> digit0;  // position of d1 in each prompt
        std::vector<std::int32_t> selected;
        for (const PasskeyCase& c : cases) digit0.push_back(passkey_digit_position(c.prompt));
        passkey_teacher_forced(*source, cases, [&](int layer, int step, const float* q) {
          const auto kv = source->cache_view(layer, nullptr);  // host memory: K read in place
          for (int b = 0; b < B; ++b) {
            const int n = int(cases[std::size_t(b)].prompt.size()) + step;  // keys before this token
            for (int h = 0; h < Hkv; ++h) {
              std::vector<double> mean_score(std::size_t(n), 0.0);
              double head_mass = 0;
              for (int g = 0; g < G; ++g) {
                const float* qr = q + std::int64_t(b) * qd + std::int64_t(h * G + g) * D;
                std::vector<double> s(static_cast<std::size_t>(n));
                double mx = -1e300;
                for (int t = 0; t < n; ++t) {
                  const float* kr = kv.k_row(b, h, t);
                  double dot = 0;
                  for (int d = 0; d < D; ++d) dot += double(qr[d]) * kr[d];
                  mean_score[std::size_t(t)] += dot / G;
                  s[std::size_t(t)] = dot / std::sqrt(double(D));
                  mx = std::max(mx, s[std::size_t(t)]);
                }
                double sum = 0, key = 0;
                for (int t = 0; t < n; ++t) {
                  const double e = std::exp(s[std::size_t(t)] - mx);
                  sum += e;
                  if (t >= digit0[std::size_t(b)] && t < digit0[std::size_t(b)] + kPasskeyDigits) key += e;
                }
                head_mass += key / sum / G;
              }
              // The head's own token selection (sink and recent forced, the rest by score).
              const std::vector<float> row(mean_score.begin(), mean_score.end());
              select_tokens(row.data(), n, TokenBudget{ly.budget, ly.sink, ly.recent}, &selected);
              int hit = 0;
              for (std::int32_t t : selected) hit += t >= digit0[std::size_t(b)] && t < digit0[std::size_t(b)] + kPasskeyDigits;
              const std::size_t i = std::size_t(layer * Hkv + h);
              mass[i] += head_mass;
              recall[i] += double(hit) / kPasskeyDigits;
            }
          }
          if (layer == 0) samples += B;
        });
        prompts += B;
        if (!o.quiet) std::fprintf(stderr, "probe L=%d: %d prompts done\n", L, prompts);
      }
    std::printf("head probe (%s, %d prompts, decode queries at L..L+3): attention mass on the 5 digits / recall of\n"
                "the head's own top-%d selection (sink %d, recent %d) / passkey accuracy with roles layer 0 + this head\n",
                o.probe_roles.c_str(), prompts, ly.budget, ly.sink, ly.recent);
    print_head_table(layers, Hkv, 26, [&](int l, int h) {
      const std::size_t i = std::size_t(l * Hkv + h);
      char cell[64];
      if (l == 0)
        std::snprintf(cell, sizeof cell, "%.3f / %.2f / (always R)", mass[i] / double(samples), recall[i] / double(samples));
      else
        std::snprintf(cell, sizeof cell, "%.3f / %.2f / %.3f", mass[i] / double(samples), recall[i] / double(samples),
                      double(correct[i - std::size_t(Hkv) + 1]) / prompts);
      return std::string(cell);
    });
    std::printf("layer 0 only: accuracy %.3f\n", double(correct[0]) / prompts);
    // Layer 0 + the heads of highest mass beyond layer 0.
    std::vector<int> order;
    for (int i = Hkv; i < heads; ++i) order.push_back(i);
    std::stable_sort(order.begin(), order.end(), [&](int x, int y) { return mass[std::size_t(x)] > mass[std::size_t(y)]; });
    std::vector<std::uint8_t> roles = layer0();
    for (int k = 0; k < std::min(o.probe_heads, int(order.size())); ++k) roles[std::size_t(order[std::size_t(k)])] = 1;
    const std::string chosen = retrieval_heads_beyond_layer0(roles, Hkv);
    write_roles_file(o.roles_out,
                     {"From the passkey head probe (minimal_decoder --probe-roles " + o.probe_roles + "): layer 0 plus the " +
                          std::to_string(o.probe_heads) +
                          " KV head(s) with the most attention on the passkey digits (layer.head: " + chosen + ").",
                      "A probe on training prompts, not HardKuma training."},
                     roles, layers, Hkv);
    std::printf("roles written to %s: layer 0 + %s\n", o.roles_out.c_str(), chosen.c_str());
    return 0;
  }
}

template <class Backend>
int run_passkey_tool(Backend& be, const Options& o, const ModelConfig& config, const BackendWeights<Backend>& weights) {
  if (!o.eval_passkey.empty()) return run_passkey_eval(be, o, config, weights);
  if (!o.calibrate_clusterattn.empty()) return run_calibrate_clusterattn(be, o, config, weights);
  if (!o.train_roles.empty()) return run_train_roles(be, o, config, weights);
  return run_probe_roles(be, o, config, weights);
}

}  // namespace minimal_decoder
