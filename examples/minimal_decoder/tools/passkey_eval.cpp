// The non-template parts of the passkey evaluation (passkey_eval.hpp): sizes, the policy list, the
// accuracy table and the JSON report.

#include "tools/passkey_eval.hpp"

#include <nlohmann/json.hpp>

#include "tools/output_file.hpp"

namespace minimal_decoder {

DecoderLimits passkey_limits(const std::vector<PasskeyCase>& cases, int prefill_chunk, KvDtype kv_dtype) {
  DecoderLimits limits;
  limits.kv_dtype = kv_dtype;
  limits.max_batch = int(cases.size());
  limits.max_new_tokens = kPasskeyDigits - 1;
  limits.prefill_chunk = prefill_chunk;
  for (const PasskeyCase& c : cases) limits.max_prompt_len = std::max(limits.max_prompt_len, int(c.prompt.size()));
  return limits;
}

int max_window(const std::vector<EvalPolicy>& policies) {
  int w = 0;
  for (const EvalPolicy& p : policies)
    if (p.policy.compresses_prompt()) w = std::max(w, p.policy.compression.window);
  return w;
}

std::vector<EvalPolicy> passkey_policies(const PolicyOptions& base, const std::vector<std::pair<float, int>>& cluster_settings) {
  std::vector<EvalPolicy> out;
  auto add = [&](PolicyKind kind, const std::string& roles) {
    PolicyOptions p = base;
    p.kind = kind;
    p.lycheedecode.roles_file = roles;
    out.push_back({p.describe(), p});
  };
  add(PolicyKind::kDense, "");
  if (cluster_settings.empty()) add(PolicyKind::kClusterAttn, "");
  for (const auto& [theta, num_block] : cluster_settings) {
    PolicyOptions p = base;
    p.kind = PolicyKind::kClusterAttn;
    p.compression.theta = theta;
    p.compression.num_block = num_block;
    out.push_back({p.describe(), p});
  }
  add(PolicyKind::kSnapKV, "");
  add(PolicyKind::kStreamingLLM, "");
  add(PolicyKind::kLycheeDecode, "");
  if (!base.lycheedecode.roles_file.empty()) add(PolicyKind::kLycheeDecode, base.lycheedecode.roles_file);
  return out;
}

void print_passkey_table(const PasskeyReport& r) {
  int width = 6;  // the widest label, so that the columns line up however long a roles path is
  for (const EvalPolicy& p : r.policies) width = std::max(width, int(p.label.size()));
  std::printf("%-*s", width, "policy");
  for (int L : r.lengths) std::printf(" %15s", ("L=" + std::to_string(L)).c_str());
  std::printf("\n%-*s", width, "");
  for (std::size_t i = 0; i < r.lengths.size(); ++i) std::printf(" %15s", "acc (ok/n)");
  std::printf("\n");
  for (std::size_t p = 0; p < r.policies.size(); ++p) {
    std::printf("%-*s", width, r.policies[p].label.c_str());
    for (std::size_t i = 0; i < r.lengths.size(); ++i) {
      const PasskeyOutcome& o = r.outcomes[i][p];
      char cell[40];
      std::snprintf(cell, sizeof cell, "%.3f (%d/%d)", o.accuracy(), o.correct, o.total);
      std::printf(" %15s", cell);
    }
    std::printf("\n");
  }
}

void write_passkey_json(const PasskeyReport& r, const std::vector<PasskeyCase>& all, int limit, const std::string& model,
                        const std::string& backend, const std::string& path) {
  nlohmann::json j;
  j["model"] = model;
  j["backend"] = backend;
  j["protocol"] = "dense prefill incl. QUERY; d1 from prefill logits; 4 greedy decode steps under the policy";
  for (std::size_t p = 0; p < r.policies.size(); ++p) {
    nlohmann::json pj;
    pj["label"] = r.policies[p].label;
    pj["policy"] = r.policies[p].policy.describe();
    for (std::size_t i = 0; i < r.lengths.size(); ++i) {
      const PasskeyOutcome& o = r.outcomes[i][p];
      const std::vector<PasskeyCase> cases = passkey_cases_of_length(all, r.lengths[i], limit);
      nlohmann::json lj;
      lj["correct"] = o.correct;
      lj["total"] = o.total;
      lj["accuracy"] = o.accuracy();
      for (std::size_t k = 0; k < o.outputs.size(); ++k)
        lj["prompts"].push_back({{"answer", cases[k].answer}, {"output", o.outputs[k]}});
      pj["lengths"][std::to_string(r.lengths[i])] = lj;
    }
    j["policies"].push_back(pj);
  }
  for (std::size_t i = 0; i < r.lengths.size(); ++i) j["prefill_seconds"][std::to_string(r.lengths[i])] = r.prefill_seconds[i];
  write_file_replacing(path, j.dump(1) + "\n", "--json");
}

}  // namespace minimal_decoder
