// The passkey head probe (role_probe.hpp).

#include "tools/role_probe.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "tools/passkey_eval.hpp"
#include "tools/roles_output.hpp"
#include "tools/token_selection.hpp"

namespace minimal_decoder {

int run_probe_roles(HostBackend& be, const PasskeyToolOptions& o, const ModelConfig& config,
                    const BackendWeights<HostBackend>& weights) {
  const std::vector<PasskeyCase> all = read_passkey_file(o.prompt_file);
  const int layers = config.num_layers, Hkv = config.num_kv_heads, Hq = config.num_q_heads, D = config.head_dim;
  const int G = Hq / Hkv, qd = int(config.q_dim()), heads = layers * Hkv;
  const LycheeDecodeOptions& ly = o.policy.lycheedecode;
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
    p.kind = PolicyKind::kLycheeDecode;
    p.lycheedecode.roles_file.clear();
    p.lycheedecode.roles = layer0();
    p.lycheedecode.roles_name = i < Hkv ? "layer 0 only" : "L0+" + head_name(i);
    if (i >= Hkv) p.lycheedecode.roles[std::size_t(i)] = 1;
    candidates.push_back(p);
  }
  std::vector<int> correct(candidates.size(), 0);
  std::vector<double> mass(std::size_t(heads), 0.0), recall(std::size_t(heads), 0.0);
  long long samples = 0;  // (prompt, step) pairs
  int prompts = 0;
  for (int L : o.lengths)
    for (const auto& cases : passkey_batches(all, L, o.limit, o.batch)) {
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
      if (o.verbose) std::fprintf(stderr, "probe L=%d: %d prompts done\n", L, prompts);
    }
  std::printf("head probe (%s, %d prompts, decode queries at L..L+3): attention mass on the 5 digits / recall of\n"
              "the head's own top-%d selection (sink %d, recent %d) / passkey accuracy with roles layer 0 + this head\n",
              o.prompt_file.c_str(), prompts, ly.budget, ly.sink, ly.recent);
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
                   {"From the passkey head probe (minimal_decoder --probe-roles " + o.prompt_file + "): layer 0 plus the " +
                        std::to_string(o.probe_heads) +
                        " KV head(s) with the most attention on the passkey digits (layer.head: " + chosen + ").",
                    "A probe on training prompts, not HardKuma training."},
                   roles, layers, Hkv);
  std::printf("roles written to %s: layer 0 + %s\n", o.roles_out.c_str(), chosen.c_str());
  return 0;
}

}  // namespace minimal_decoder
