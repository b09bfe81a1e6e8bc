// examples/minimal_decoder's HardKuma head-role training (--train-roles), on the host:
//   - select_tokens is LycheeDecode's token-mode selection (forced sink/recent inside the budget,
//     ties to the lower position, budget >= n keeps every token);
//   - PromptDistiller's dense and sparse outputs equal a direct computation, the sparse selection
//     coming from the previous layer's group-mean scores;
//   - train_head_gates on synthetic outputs opens exactly the head whose sparse output is wrong, and
//     the density settles at the target;
//   - run_train_roles end to end on a tiny random model writes a valid roles file;
//   - its command-line errors are one clear line.

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "cli/options.hpp"
#include "engine/checkpoint.hpp"
#include "engine/host_engine.hpp"
#include "support/decoder_test_helpers.hpp"
#include "tools/gate_training.hpp"
#include "tools/layer_distillation.hpp"
#include "tools/passkey_tools.hpp"
#include "tools/role_training.hpp"
#include "tools/token_selection.hpp"

namespace md = minimal_decoder;
namespace fs = std::filesystem;

namespace {

std::vector<float> normal(std::size_t n, std::mt19937& rng, float scale = 1.f) {
  std::normal_distribution<float> d(0.f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

std::vector<std::int32_t> selected(const std::vector<float>& scores, md::TokenBudget t) {
  std::vector<std::int32_t> out;
  md::select_tokens(scores.data(), int(scores.size()), t, &out);
  return out;
}

// softmax(q . k / sqrt(D)) V over `keys`, directly, in double.
std::vector<double> attend(const float* q, const float* k, const float* v, int D, const std::vector<int>& keys) {
  std::vector<double> logit;
  for (int t : keys) {
    double dot = 0;
    for (int d = 0; d < D; ++d) dot += double(q[d]) * k[t * D + d];
    logit.push_back(dot / std::sqrt(double(D)));
  }
  const double mx = *std::max_element(logit.begin(), logit.end());
  std::vector<double> out(std::size_t(D), 0.0);
  double sum = 0;
  for (std::size_t i = 0; i < keys.size(); ++i) {
    const double e = std::exp(logit[i] - mx);
    sum += e;
    for (int d = 0; d < D; ++d) out[std::size_t(d)] += e * v[keys[i] * D + d];
  }
  for (double& x : out) x /= sum;
  return out;
}


}  // namespace

TEST_CASE("role training: select_tokens is LycheeDecode's token-mode selection") {
  const std::vector<float> s = {0, 5, 7, 7, 1, 7, 0, 0, 9, 9};
  // Forced: position 0 (sink) and 8, 9 (recent), inside the budget; 2 more by score, ties to the lower position.
  CHECK(selected(s, {5, 1, 2}) == std::vector<std::int32_t>{0, 2, 3, 8, 9});
  CHECK(selected(s, {3, 1, 2}) == std::vector<std::int32_t>{0, 8, 9});        // the budget is all forced
  CHECK(selected(s, {2, 1, 2}) == std::vector<std::int32_t>{0, 8, 9});        // forced tokens are kept anyway
  CHECK(selected(s, {10, 1, 2}).size() == 10);                                 // budget >= n: every token
  CHECK(selected(s, {64, 8, 16}).size() == 10);
  CHECK(selected(s, {4, 0, 0}) == std::vector<std::int32_t>{2, 3, 8, 9});  // 9, 9, then the first two 7s
}

TEST_CASE("role training: PromptDistiller's outputs equal a direct computation") {
  const int Hq = 4, Hkv = 2, G = 2, D = 8, S = 2, P = 30, cap = 40;
  const md::DecodeShape shape{Hq, Hkv, D, S};
  const md::TokenBudget budget{12, 2, 3};
  std::mt19937 rng(7);
  struct Layer {
    std::vector<float> q, k, v;
  };
  std::vector<Layer> layers(3);
  for (Layer& l : layers) {
    l.q = normal(std::size_t(S) * Hq * D, rng);
    l.k = normal(std::size_t(Hkv) * cap * D, rng);
    l.v = normal(std::size_t(Hkv) * cap * D, rng);
  }
  md::PromptDistiller small(shape, P, budget), full(shape, P, md::TokenBudget{P + S, 2, 3});
  for (const Layer& l : layers) {
    small.add_layer(md::DecodeLayer{l.q.data(), l.k.data(), l.v.data(), cap});
    full.add_layer(md::DecodeLayer{l.q.data(), l.k.data(), l.v.data(), cap});
  }
  const md::PromptTargets t = small.take(), all = full.take();
  REQUIRE(t.size() == 2);  // layers 1 and 2
  for (std::size_t l = 0; l < t.size(); ++l) CHECK(all[l].sparse == all[l].dense);  // budget >= n: sparse is dense

  for (int l = 1; l < 3; ++l) {
    const Layer& cur = layers[std::size_t(l)];
    const Layer& prev = layers[std::size_t(l - 1)];
    for (int j = 0; j < Hkv; ++j)
      for (int s = 0; s < S; ++s) {
        const int n = P + s + 1;
        // Layer l-1's group-mean scores, and the selection by hand: sink, recent, the best of the rest.
        std::vector<std::pair<double, int>> rest;
        std::vector<int> keys;
        for (int t2 = 0; t2 < n; ++t2) {
          double score = 0;
          for (int g = 0; g < G; ++g)
            for (int d = 0; d < D; ++d)
              score += double(prev.q[std::size_t((s * Hq + j * G + g) * D + d)]) * prev.k[std::size_t((j * cap + t2) * D + d)] / G;
          if (t2 < budget.sink || t2 >= n - budget.recent) keys.push_back(t2);
          else rest.emplace_back(-score, t2);
        }
        std::sort(rest.begin(), rest.end());
        for (int i = 0; i < budget.budget - budget.sink - budget.recent; ++i) keys.push_back(rest[std::size_t(i)].second);
        std::sort(keys.begin(), keys.end());
        std::vector<int> every(static_cast<std::size_t>(n));
        std::iota(every.begin(), every.end(), 0);
        for (int g = 0; g < G; ++g) {
          const int h = j * G + g;
          const float* q = cur.q.data() + (s * Hq + h) * D;
          const std::vector<double> dense = attend(q, cur.k.data() + j * cap * D, cur.v.data() + j * cap * D, D, every);
          const std::vector<double> sparse = attend(q, cur.k.data() + j * cap * D, cur.v.data() + j * cap * D, D, keys);
          for (int d = 0; d < D; ++d) {
            const std::size_t i = std::size_t((s * Hq + h) * D + d);
            CHECK(t[std::size_t(l - 1)].dense[i] == doctest::Approx(dense[std::size_t(d)]).epsilon(1e-5));
            CHECK(t[std::size_t(l - 1)].sparse[i] == doctest::Approx(sparse[std::size_t(d)]).epsilon(1e-5));
          }
        }
      }
  }
}

TEST_CASE("role training: the gates open the head whose sparse output is wrong, at the target density") {
  // 3 layers x 2 KV heads (4 gates); every head's sparse output is close to its dense output except
  // layer 2, KV head 0, whose sparse output is unrelated to it.
  md::GateTrainingShape s;
  s.layers = 3;
  s.kv_heads = 2;
  s.q_heads = 4;
  s.head_dim = 8;
  s.tokens = 4;
  const int G = s.q_heads / s.kv_heads;
  std::mt19937 rng(11);
  std::vector<md::PromptTargets> pool(8);
  for (md::PromptTargets& p : pool)
    for (int l = 1; l < s.layers; ++l) {
      md::LayerOutputs o;
      o.dense = normal(s.layer_size(), rng);
      o.sparse = o.dense;
      const std::vector<float> noise = normal(s.layer_size(), rng, 0.05f), other = normal(s.layer_size(), rng);
      for (std::size_t i = 0; i < o.sparse.size(); ++i) {
        const int head = int(i / std::size_t(s.head_dim) % std::size_t(s.q_heads)) / G;
        o.sparse[i] = l == 2 && head == 0 ? other[i] : o.sparse[i] + noise[i];
      }
      p.push_back(o);
    }
  md::GateTrainingOptions o;
  o.steps = 3000;
  o.target_heads = 1;
  o.seed = 5;
  std::vector<md::GateTrainingReport> reports;
  const md::GateTrainingResult r = md::train_head_gates(pool, s, o, [&](const md::GateTrainingReport& x) { reports.push_back(x); });

  CHECK(reports.size() == 6);  // every 500 steps
  CHECK(r.roles == std::vector<std::uint8_t>{1, 1, 0, 0, 1, 0});
  CHECK(std::isnan(r.kuma_mean[0]));
  CHECK(r.kuma_mean[4] > 0.9f);
  for (int i : {2, 3, 5}) CHECK(r.kuma_mean[std::size_t(i)] < 0.1f);
  CHECK(r.last.density == doctest::Approx(0.25).epsilon(0.02));  // 1 head of 4 gates
  CHECK(r.last.loss < reports.front().loss);
  // The prompt is drawn uniformly: each of the 8 about 3000 / 8 times.
  for (std::int64_t d : r.draws) CHECK((d > 250 && d < 500));
  const std::vector<double> err = md::sparse_error_table(pool, s, md::GateNorm::kModel);
  CHECK(err[4] > 0.3);  // about 2 x its quarter of the total norm
  CHECK(err[2] < 0.01);

  o.target_heads = 5;
  CHECK(decoder_test::error_of([&] { md::train_head_gates(pool, s, o); }).find("--train-heads 5: the model has 4 gated heads") != std::string::npos);
}

TEST_CASE("role training: --train-roles end to end on a tiny random model writes a roles file") {
  md::ModelConfig c;
  c.vocab_size = 64;
  c.hidden_size = 64;
  c.intermediate_size = 96;
  c.num_layers = 3;
  c.num_q_heads = 4;
  c.num_kv_heads = 2;
  c.head_dim = 64;  // a head_dim kvsift's attention supports
  c.max_positions = 256;
  md::HostBackend be;
  const md::HostWeights hw = md::random_weights(c, 3);
  const md::BackendWeights<md::HostBackend> weights(be, c, hw);

  const fs::path dir = fs::temp_directory_path() / "kvsift_test_role_training";
  fs::create_directories(dir);
  const fs::path prompts = dir / "prompts.txt", roles = dir / "out.roles";
  {
    std::mt19937 rng(1);
    std::uniform_int_distribution<int> id(20, 63);
    std::ofstream f(prompts);
    for (int p = 0; p < 3; ++p) {
      f << "ANSWER 10 11 12 13 14 |";
      for (int t = 0; t < 48 + 8 * p; ++t) f << " " << id(rng);
      f << " 3\n";
    }
  }
  md::Options o = md::parse_options({"--model", "unused", "--train-roles", prompts.string(), "--roles-out", roles.string(),
                                     "--lengths", "49,57,65", "--eval-batch", "2", "--train-steps", "300", "--train-heads", "1",
                                     "--lycheedecode-budget", "16", "--lycheedecode-sink", "2", "--lycheedecode-recent", "4", "--quiet"});
  CHECK(md::run_passkey_tool(be, o.passkey, c, weights) == 0);
  kvsift::HeadRoles r;
  REQUIRE(kvsift::read_head_roles_file(roles.string(), &r, c.num_layers, c.num_kv_heads).ok());
  CHECK(r.is_retrieval(0, 0));
  CHECK(r.is_retrieval(0, 1));
  std::ifstream in(roles);
  std::string first;
  std::getline(in, first);
  CHECK(first.find("# From HardKuma head-role training") == 0);

  // With a budget above every prompt the sparse outputs are the dense ones.
  const std::vector<md::PasskeyCase> cases = md::read_passkey_file(prompts.string());
  const std::vector<md::PromptTargets> t =
      md::passkey_distillation_targets(be, c, weights, cases, 16, md::TokenBudget{100, 2, 4});
  REQUIRE(t.size() == 3);
  for (const md::PromptTargets& p : t) {
    REQUIRE(p.size() == 2);
    for (const md::LayerOutputs& l : p) CHECK(l.sparse == l.dense);
  }
  fs::remove_all(dir);
}

TEST_CASE("role training: command-line errors are one clear line") {
  auto parse = [](std::vector<std::string> args) { return md::parse_options(args); };
  auto error = [&](std::vector<std::string> args) { return decoder_test::error_of([&] { parse(args); }); };
  const std::vector<std::string> base = {"--model", "m", "--train-roles", "p.txt"};
  auto with = [&](std::vector<std::string> extra) {
    std::vector<std::string> a = base;
    a.insert(a.end(), extra.begin(), extra.end());
    return a;
  };
  CHECK(error(base).find("--train-roles needs --roles-out FILE") != std::string::npos);
  CHECK(error(with({"--roles-out", "r", "--lycheedecode-mode", "block"})).find("token mode: drop --lycheedecode-mode block") != std::string::npos);
  CHECK(error(with({"--roles-out", "r", "--lycheedecode-budget", "20"})).find("--lycheedecode-budget 20 is below --lycheedecode-sink + --lycheedecode-recent = 384") !=
        std::string::npos);
  CHECK(error(with({"--roles-out", "r", "--train-norm", "global"})).find("--train-norm: global not in {model,layer}") != std::string::npos);
  CHECK(error(with({"--roles-out", "r", "--train-steps", "0"})).find("--train-steps: 0 is not an integer >= 1") != std::string::npos);
  CHECK(error(with({"--roles-out", "r", "--probe-roles", "p.txt"})).find("give one of") != std::string::npos);
  const md::Options ok = parse(with({"--roles-out", "r", "--train-heads", "3", "--train-seed", "9", "--train-norm", "layer"}));
  CHECK(ok.passkey.train_heads == 3);
  CHECK(ok.passkey.train_seed == 9);
  CHECK(ok.passkey.train_steps == 3000);
  CHECK(ok.passkey.train_norm == "layer");
  CHECK(ok.passkey.tool == md::PasskeyTool::kTrain);
}
