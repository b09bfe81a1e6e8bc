#pragma once
// Passkey evaluation (issue 9): does a policy keep what the model needs to answer?
//
// The prompt files of a passkey checkpoint (../shared/models/passkey-llama-13m/README.md) hold one
// prompt per line, "ANSWER d1 d2 d3 d4 d5 | id id ... 3": filler with KEY_START d1..d5 KEY_END
// somewhere, ending with QUERY. The protocol:
//   1. dense prefill of the whole prompt (QUERY included); d1 = argmax of the last prefill logits;
//   2. four greedy decode steps under the policy, each fed the previous digit;
//   3. correct when all five digits match.
// The prefill is dense for every policy, so it runs once per batch of prompts and every policy starts
// from it (Decoder::prefill_from): a compressing policy compresses the dense prompt cache with the
// kept window queries, LycheeDecode and dense start from a copy of it. The answers are the same as
// with a separate prefill per policy, at 1/P of the cost.

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli.hpp"
#include "errors.hpp"
#include "model.hpp"
#include "sampling.hpp"

namespace minimal_decoder {

inline constexpr int kPasskeyDigits = 5;
inline constexpr std::int32_t kKeyStart = 1;  // the token before d1 (README: 1 = KEY_START)

struct PasskeyCase {
  std::vector<std::int32_t> answer;  // the five digit token ids
  std::vector<std::int32_t> prompt;  // ends with QUERY
};

// "ANSWER d1 d2 d3 d4 d5 | id id ..." per line; anything else is an error naming the line.
inline std::vector<PasskeyCase> read_passkey_file(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw DecoderError("--eval-passkey " + path + ": cannot open");
  std::vector<PasskeyCase> cases;
  std::string line;
  int line_no = 0;
  while (std::getline(in, line)) {
    ++line_no;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const std::string where = path + ":" + std::to_string(line_no);
    const std::size_t bar = line.find('|');
    std::istringstream head(line.substr(0, bar == std::string::npos ? 0 : bar));
    std::string word;
    if (bar == std::string::npos || !(head >> word) || word != "ANSWER")
      throw DecoderError(where + ": expected \"ANSWER d1 d2 d3 d4 d5 | ids\"");
    PasskeyCase c;
    std::string rest;
    std::getline(head, rest);
    c.answer = parse_ids(rest, where + " (answer)");
    if (int(c.answer.size()) != kPasskeyDigits) throw DecoderError(where + ": the answer must have 5 token ids");
    c.prompt = parse_ids(line.substr(bar + 1), where);
    cases.push_back(std::move(c));
  }
  if (cases.empty()) throw DecoderError("--eval-passkey " + path + ": no prompts");
  return cases;
}

// The first `limit` prompts of exactly `length` tokens (limit <= 0: all), in file order.
inline std::vector<PasskeyCase> passkey_cases_of_length(const std::vector<PasskeyCase>& all, int length, int limit) {
  std::vector<PasskeyCase> out;
  for (const PasskeyCase& c : all)
    if (int(c.prompt.size()) == length && (limit <= 0 || int(out.size()) < limit)) out.push_back(c);
  return out;
}

struct EvalPolicy {
  std::string label;  // short name for tables and JSON
  PolicyOptions policy;
};

struct PasskeyOutcome {
  int correct = 0, total = 0;
  std::vector<std::vector<std::int32_t>> outputs;  // the five generated ids per prompt
  double accuracy() const { return total ? double(correct) / double(total) : 0.0; }
};

// The decoder sizes of a batch of passkey prompts: the longest prompt, four decode steps.
inline DecoderLimits passkey_limits(const std::vector<PasskeyCase>& cases, int prefill_chunk) {
  DecoderLimits limits;
  limits.max_batch = int(cases.size());
  limits.max_new_tokens = kPasskeyDigits - 1;
  limits.prefill_chunk = prefill_chunk;
  for (const PasskeyCase& c : cases) limits.max_prompt_len = std::max(limits.max_prompt_len, int(c.prompt.size()));
  return limits;
}

// Step 1 of the protocol, shared by every policy: a dense decoder prefills the batch (keeping
// `keep_window` window queries for compressing policies); `first` receives d1 per prompt.
template <class Backend>
std::unique_ptr<Decoder<Backend>> passkey_prefill(Backend& be, const ModelConfig& config,
                                                  const BackendWeights<Backend>& weights,
                                                  const std::vector<PasskeyCase>& cases, int prefill_chunk,
                                                  int keep_window, std::vector<std::int32_t>* first) {
  DecoderLimits limits = passkey_limits(cases, prefill_chunk);
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
  Decoder<Backend> model(be, config, weights, policy, passkey_limits(cases, prefill_chunk));
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

// The cases of every requested length, `limit` each, in batches of at most `batch`.
inline std::vector<std::vector<PasskeyCase>> passkey_batches(const std::vector<PasskeyCase>& all, int length, int limit,
                                                             int batch) {
  const std::vector<PasskeyCase> cases = passkey_cases_of_length(all, length, limit);
  if (cases.empty()) throw DecoderError("no prompts of " + std::to_string(length) + " tokens in the file");
  std::vector<std::vector<PasskeyCase>> out;
  for (std::size_t i = 0; i < cases.size(); i += std::size_t(batch))
    out.emplace_back(cases.begin() + std::ptrdiff_t(i), cases.begin() + std::ptrdiff_t(std::min(cases.size(), i + std::size_t(batch))));
  return out;
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

inline int max_window(const std::vector<EvalPolicy>& policies) {
  int w = 0;
  for (const EvalPolicy& p : policies)
    if (p.policy.compresses_prompt()) w = std::max(w, p.policy.compression.window);
  return w;
}

// The whole protocol for one batch: one dense prefill, then every policy's decode steps from it.
template <class Backend>
std::vector<PasskeyOutcome> evaluate_passkey_batch(Backend& be, const ModelConfig& config,
                                                   const BackendWeights<Backend>& weights,
                                                   const std::vector<PasskeyCase>& cases,
                                                   const std::vector<EvalPolicy>& policies, int prefill_chunk,
                                                   double* prefill_ms = nullptr) {
  std::vector<std::int32_t> first;
  const auto source = passkey_prefill(be, config, weights, cases, prefill_chunk, max_window(policies), &first);
  if (prefill_ms) *prefill_ms = source->timing().total_ms;
  std::vector<PasskeyOutcome> outcomes;
  for (const EvalPolicy& p : policies)
    outcomes.push_back(passkey_decode(be, config, weights, *source, first, cases, p.policy, prefill_chunk));
  return outcomes;
}

struct PasskeyReport {
  std::vector<int> lengths;
  std::vector<EvalPolicy> policies;
  std::vector<std::vector<PasskeyOutcome>> outcomes;  // [length][policy]
  std::vector<double> prefill_seconds;                // per length
};

// Every length in `lengths`, `limit` prompts each, in batches of at most `batch` prompts.
template <class Backend>
PasskeyReport evaluate_passkey(Backend& be, const ModelConfig& config, const BackendWeights<Backend>& weights,
                               const std::vector<PasskeyCase>& all, const std::vector<int>& lengths, int limit,
                               const std::vector<EvalPolicy>& policies, int batch, int prefill_chunk, bool verbose) {
  PasskeyReport r;
  r.lengths = lengths;
  r.policies = policies;
  for (int L : lengths) {
    const std::vector<PasskeyCase> cases = passkey_cases_of_length(all, L, limit);
    if (cases.empty()) throw DecoderError("--eval-passkey: no prompts of " + std::to_string(L) + " tokens in the file");
    std::vector<PasskeyOutcome> total(policies.size());
    double seconds = 0;
    for (std::size_t start = 0; start < cases.size(); start += std::size_t(batch)) {
      const std::vector<PasskeyCase> chunk(cases.begin() + std::ptrdiff_t(start),
                                           cases.begin() + std::ptrdiff_t(std::min(cases.size(), start + std::size_t(batch))));
      double prefill_ms = 0;
      const std::vector<PasskeyOutcome> part =
          evaluate_passkey_batch(be, config, weights, chunk, policies, prefill_chunk, &prefill_ms);
      seconds += prefill_ms / 1e3;
      for (std::size_t p = 0; p < policies.size(); ++p) {
        total[p].correct += part[p].correct;
        total[p].total += part[p].total;
        total[p].outputs.insert(total[p].outputs.end(), part[p].outputs.begin(), part[p].outputs.end());
      }
      if (verbose) {  // running totals, so a long run that is stopped still says what it measured
        std::fprintf(stderr, "passkey L=%d: %zu/%zu prompts (prefill %.1f s):", L, start + chunk.size(), cases.size(),
                     prefill_ms / 1e3);
        for (const PasskeyOutcome& o : total) std::fprintf(stderr, " %d/%d", o.correct, o.total);
        std::fprintf(stderr, "\n");
      }
    }
    r.outcomes.push_back(std::move(total));
    r.prefill_seconds.push_back(seconds);
  }
  return r;
}

inline void print_passkey_table(const PasskeyReport& r) {
  std::printf("%-68s", "policy");
  for (int L : r.lengths) std::printf(" %15s", ("L=" + std::to_string(L)).c_str());
  std::printf("\n");
  for (std::size_t p = 0; p < r.policies.size(); ++p) {
    std::printf("%-68s", r.policies[p].label.c_str());
    for (std::size_t i = 0; i < r.lengths.size(); ++i) {
      const PasskeyOutcome& o = r.outcomes[i][p];
      char cell[40];
      std::snprintf(cell, sizeof cell, "%.3f (%d/%d)", o.accuracy(), o.correct, o.total);
      std::printf(" %15s", cell);
    }
    std::printf("\n");
  }
}

inline void write_passkey_json(const PasskeyReport& r, const std::vector<PasskeyCase>& all, int limit,
                               const std::string& model, const std::string& backend, const std::string& path) {
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
  const std::string tmp = path + ".tmp";  // renamed into place only when complete
  std::ofstream out(tmp);
  out << j.dump(1) << "\n";
  if (!out.good() || (out.close(), std::rename(tmp.c_str(), path.c_str())) != 0)
    throw DecoderError("--json " + path + ": cannot write");
}

// The policies of an evaluation: every policy with the command line's options (Cp, W, theta,
// num_block, pool, sinks, LycheeDecode budget/sink/recent/mode), ClusterAttn once per (theta,
// num_block) in `cluster_settings` when given, LycheeDecode once with layer-0-only roles (the
// control: the roles must do the work) and once more with --roles when given.
inline std::vector<EvalPolicy> passkey_policies(const PolicyOptions& base,
                                                const std::vector<std::pair<float, int>>& cluster_settings = {}) {
  std::vector<EvalPolicy> out;
  auto add = [&](PolicyKind kind, const std::string& roles) {
    PolicyOptions p = base;
    p.kind = kind;
    p.lychee.roles_file = roles;
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
  add(PolicyKind::kLychee, "");
  if (!base.lychee.roles_file.empty()) add(PolicyKind::kLychee, base.lychee.roles_file);
  return out;
}

}  // namespace minimal_decoder
