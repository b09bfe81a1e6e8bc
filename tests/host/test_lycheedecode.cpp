// LycheeDecode's host policy against an independent brute-force simulation written here from the
// spec: dense attention under boolean masks, one mask per (sequence, KV head) carried across layers
// (a retrieval head rewrites its mask, a sparse head reads it), selections by sorting. Keys and
// queries are multiples of 1/4 in [-2, 2], so every selection score is exact in float and double and
// the comparison never hinges on rounding; ties are frequent, which exercises the lower-position rule.

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "kvsift/kvsift.hpp"
#include "kvsift/policy/lycheedecode.hpp"
#include "support/host_buffer.hpp"
#include "support/random.hpp"

using kvsift::LycheeDecodeConfig;
using kvsift::LycheeDecodePolicy;
using kvsift::LycheeDecodeState;
using kvsift::LycheeDecodeSelection;
using kvsift::StatusCode;
using kvsift_test::roles_from;

namespace {

// ---- test plumbing ----

std::vector<float> dyadic(std::mt19937_64& rng, std::size_t n) {
  std::vector<float> v(n);
  for (auto& x : v) x = float(kvsift_test::uniform_int(rng, -8, 8)) / 4.f;
  return v;
}

// ---- the independent simulation ----

struct Model {
  int layers, hkv, group, d, batch, cap;
  std::vector<std::vector<float>> k, v;  // per layer, [batch, cap, hkv, d]
  const float* k_at(int l, int b, int h, int t) const { return &k[l][((std::size_t(b) * cap + t) * hkv + h) * d]; }
  const float* v_at(int l, int b, int h, int t) const { return &v[l][((std::size_t(b) * cap + t) * hkv + h) * d]; }
};

Model make_model(std::mt19937_64& rng, int layers, int hkv, int group, int d, int batch, int cap) {
  Model m{layers, hkv, group, d, batch, cap, {}, {}};
  for (int l = 0; l < layers; ++l) {
    m.k.push_back(dyadic(rng, std::size_t(batch) * cap * hkv * d));
    m.v.push_back(kvsift_test::random_values<float>(rng, m.k.back().size()));
  }
  return m;
}

// What docs/algorithms/lycheedecode.md §5-§6 says a selection is: the forced entries, plus the best others by (score desc,
// position asc) up to max(forced, min(k, n)) entries in all; ascending.
std::vector<int> select_entries(const std::vector<double>& score, const std::vector<char>& forced, int k) {
  const int n = int(score.size());
  std::vector<int> chosen, others;
  for (int i = 0; i < n; ++i) (forced[i] ? chosen : others).push_back(i);
  std::stable_sort(others.begin(), others.end(), [&](int a, int b) { return score[a] > score[b]; });
  const int take = std::max(0, std::min(k, n) - int(chosen.size()));
  chosen.insert(chosen.end(), others.begin(), others.begin() + std::min<int>(take, int(others.size())));
  std::sort(chosen.begin(), chosen.end());
  return chosen;
}

struct Simulation {
  const Model& m;
  const LycheeDecodeConfig& c;
  // sets[b][h]: entries (tokens or blocks) of the latest retrieval layer of head h
  std::vector<std::vector<std::vector<int>>> sets;

  Simulation(const Model& model, const LycheeDecodeConfig& config)
      : m(model), c(config), sets(model.batch, std::vector<std::vector<int>>(model.hkv)) {}

  int unit() const { return c.selection == LycheeDecodeSelection::kBlock ? c.block_size : 1; }

  std::vector<int> select(int l, int b, int h, int len, const float* q) const {
    const int G = m.group, d = m.d, u = unit();
    std::vector<double> qbar(d, 0.0);
    for (int g = 0; g < G; ++g)
      for (int i = 0; i < d; ++i) qbar[i] += q[(std::size_t(h) * G + g) * d + i];
    for (auto& x : qbar) x /= G;
    const int n = (len + u - 1) / u;
    std::vector<double> score(n, -INFINITY);
    for (int t = 0; t < len; ++t) {
      double s = 0;
      for (int i = 0; i < d; ++i) s += qbar[i] * m.k_at(l, b, h, t)[i];
      score[t / u] = std::max(score[t / u], s);
    }
    std::vector<char> forced(n, 0);
    int k = 0;
    if (c.selection == LycheeDecodeSelection::kBlock) {
      k = c.num_blocks;
      for (int j = 0; j < n; ++j) {
        const bool holds_recent = c.recent > 0 && (j + 1) * u - 1 >= len - c.recent;
        forced[j] = j < c.sink_blocks || holds_recent;
      }
    } else {
      k = c.selection == LycheeDecodeSelection::kRatio ? int(std::floor((1.0 - c.rho) * len)) : c.budget;
      for (int t = 0; t < n; ++t) forced[t] = t < c.sink || t >= len - c.recent;
    }
    return select_entries(score, forced, k);
  }

  // One layer: outputs [batch, hq, d] in double; updates the sets of the retrieval heads.
  std::vector<double> layer(int l, const std::vector<std::int32_t>& lengths, const std::vector<float>& q) {
    const int G = m.group, d = m.d, hq = m.hkv * G, u = unit();
    std::vector<double> out(std::size_t(m.batch) * hq * d, 0.0);
    const double scale = 1.0 / std::sqrt(double(d));
    for (int b = 0; b < m.batch; ++b) {
      const int len = std::min(lengths[b], m.cap);
      const float* qb = &q[std::size_t(b) * hq * d];
      std::vector<std::vector<int>> new_sets(m.hkv);
      for (int h = 0; h < m.hkv; ++h) {
        const bool retrieval = c.roles.is_retrieval(l, h);
        std::vector<char> mask(len, retrieval ? 1 : 0);
        if (!retrieval)
          for (int e : sets[b][h])
            for (int t = e * u; t < (e + 1) * u && t < len; ++t) mask[t] = 1;
        for (int g = 0; g < G; ++g) {
          const float* qr = qb + (std::size_t(h) * G + g) * d;
          double mx = -INFINITY;
          std::vector<double> logit(len, 0.0);
          for (int t = 0; t < len; ++t) {
            if (!mask[t]) continue;
            double s = 0;
            for (int i = 0; i < d; ++i) s += double(qr[i]) * m.k_at(l, b, h, t)[i];
            logit[t] = s * scale;
            mx = std::max(mx, logit[t]);
          }
          double den = 0;
          std::vector<double> acc(d, 0.0);
          for (int t = 0; t < len; ++t) {
            if (!mask[t]) continue;
            const double w = std::exp(logit[t] - mx);
            den += w;
            for (int i = 0; i < d; ++i) acc[i] += w * m.v_at(l, b, h, t)[i];
          }
          for (int i = 0; i < d; ++i) out[(std::size_t(b) * hq + h * G + g) * d + i] = den > 0 ? acc[i] / den : 0.0;
        }
        if (retrieval) new_sets[h] = select(l, b, h, len, qb);
      }
      for (int h = 0; h < m.hkv; ++h)
        if (c.roles.is_retrieval(l, h)) sets[b][h] = new_sets[h];
    }
    return out;
  }
};

// ---- the policy under test, on host memory ----

struct PolicyRun {
  LycheeDecodePolicy decoder;
  LycheeDecodeState state;
  std::unique_ptr<kvsift_test::HostBuffer> state_memory, workspace;
  bool two_calls = false;  // layer() through attend_layer + hand_off_layer instead of decode_layer

  explicit PolicyRun(const LycheeDecodeConfig& c) {
    const auto st = LycheeDecodePolicy::create(c, &decoder);
    REQUIRE_MESSAGE(st.ok(), st.to_string());
    state_memory = std::make_unique<kvsift_test::HostBuffer>(decoder.state_bytes());
    REQUIRE(decoder.make_state(state_memory->get(), state_memory->bytes(), &state).ok());
    // 16-bit and float caches plan different attention tiles: size for both.
    std::size_t for_float = 0, for_bf16 = 0;
    REQUIRE(decoder.workspace_bytes<float>(kvsift::host::Exec{}, &for_float).ok());
    REQUIRE(decoder.workspace_bytes<kvsift::bfloat16_t>(kvsift::host::Exec{}, &for_bf16).ok());
    workspace = std::make_unique<kvsift_test::HostBuffer>(std::max(for_float, for_bf16));
  }

  template <class View>
  kvsift::Status layer(int l, const View& kv, const std::vector<float>& q, std::vector<float>& out) {
    const auto& c = decoder.config();
    out.assign(q.size(), -12345.f);
    const auto io = kvsift::make_query_io(q.data(), out.data(), 1, c.num_q_heads, c.head_dim);
    const kvsift::Workspace ws{workspace->get(), workspace->bytes()};
    if (!two_calls) return decoder.decode_layer(kvsift::host::Exec{}, state, l, kv, io, ws);
    KVSIFT_TRY(decoder.attend_layer(kvsift::host::Exec{}, state, l, kv, io, ws));
    // A handoff is due exactly when the layer has retrieval heads.
    CHECK(state.handoff_layer == (decoder.retrieval_heads(l) > 0 ? l : -1));
    KVSIFT_TRY(decoder.hand_off_layer(kvsift::host::Exec{}, state, l, kv, ws));
    CHECK(state.handoff_layer == -1);
    return kvsift::Status();
  }

  std::vector<int> row(int b, int h) const {
    const int r = b * decoder.config().num_kv_heads + h;
    return std::vector<int>(state.table.row(r), state.table.row(r) + state.table.count(r));
  }
};

LycheeDecodeConfig base_config(const Model& m, const std::string& roles) {
  LycheeDecodeConfig c;
  c.num_layers = m.layers;
  c.num_kv_heads = m.hkv;
  c.num_q_heads = m.hkv * m.group;
  c.head_dim = m.d;
  c.roles = roles_from(roles);
  c.max_batch = m.batch;
  c.max_kv_length = m.cap;
  return c;
}

struct StepLog {
  std::vector<std::vector<std::vector<int>>> table_after_layer;  // [layer][row] entries
};

// Runs `steps` decode steps through the policy and the simulation and compares every output and,
// after every layer, the whole index table. Lengths grow by one per step for active sequences.
void run_against_simulation(const Model& m, const LycheeDecodeConfig& c, std::vector<std::int32_t> lengths, int steps,
                            std::mt19937_64& rng, std::vector<StepLog>* logs = nullptr, bool two_calls = false) {
  PolicyRun run(c);
  run.two_calls = two_calls;
  Simulation sim(m, c);
  const int hq = m.hkv * m.group;
  for (int step = 0; step < steps; ++step) {
    CAPTURE(step);
    StepLog log;
    for (int l = 0; l < m.layers; ++l) {
      CAPTURE(l);
      const auto q = dyadic(rng, std::size_t(m.batch) * hq * m.d);
      const auto kv = kvsift::make_bshd(m.k[l].data(), m.v[l].data(), m.batch, m.hkv, m.cap, m.d, lengths.data());
      std::vector<float> out;
      const auto st = run.layer(l, kv, q, out);
      REQUIRE_MESSAGE(st.ok(), st.to_string());
      const auto want = sim.layer(l, lengths, q);
      int bad = 0;
      for (std::size_t i = 0; i < out.size() && bad < 5; ++i)
        if (!(std::abs(out[i] - want[i]) <= 1e-5 * (1 + std::abs(want[i])))) {
          ++bad;
          FAIL_CHECK("out[" << i << "] = " << out[i] << ", simulation " << want[i]);
        }
      log.table_after_layer.emplace_back();
      for (int b = 0; b < m.batch; ++b)
        for (int h = 0; h < m.hkv; ++h) {
          log.table_after_layer.back().push_back(run.row(b, h));
          // Rows of sequences that exist hold exactly the simulation's latest set for head h.
          INFO("row b = " << b << ", h = " << h);
          CHECK(run.row(b, h) == sim.sets[b][h]);
        }
    }
    CHECK(run.state.next_layer == 0);
    if (logs) logs->push_back(log);
    for (auto& len : lengths)
      if (len > 0 && len < m.cap) ++len;
  }
}

}  // namespace

// ---- semantics ----

TEST_CASE("LycheeDecode token mode matches the brute-force simulation over layers and steps") {
  auto rng = kvsift_test::make_rng(701);
  const Model m = make_model(rng, 5, 4, 2, 64, 4, 160);
  auto c = base_config(m, "RRRR/RSSR/SSRS/SRSS/SSSS");
  c.budget = 40;
  c.sink = 4;
  c.recent = 8;
  // Ragged: long, shorter than sink + recent, an empty slot, just past the budget.
  run_against_simulation(m, c, {150, 9, 0, 41}, 4, rng);
  // decode_layer's two halves as separate calls (attend_layer, hand_off_layer): the same.
  run_against_simulation(m, c, {150, 9, 0, 41}, 4, rng, nullptr, /*two_calls=*/true);
}

TEST_CASE("LycheeDecode in two calls: a handoff out of turn is a named error") {
  auto rng = kvsift_test::make_rng(709);
  const Model m = make_model(rng, 3, 2, 2, 64, 2, 128);
  const auto c = base_config(m, "RR/SS/RS");
  PolicyRun run(c);
  std::vector<std::int32_t> lengths = {100, 20};
  const auto q = dyadic(rng, std::size_t(2) * 4 * 64);
  std::vector<float> out(q.size());
  const auto io = kvsift::make_query_io(q.data(), out.data(), 1, 4, 64);
  const kvsift::host::Exec exec;
  const kvsift::Workspace ws{run.workspace->get(), run.workspace->bytes()};
  std::vector<kvsift::ContiguousKV<const float>> kv;
  for (int l = 0; l < 3; ++l) kv.push_back(kvsift::make_bshd(m.k[l].data(), m.v[l].data(), 2, 2, 128, 64, lengths.data()));
  auto& d = run.decoder;
  auto& state = run.state;

  auto st = d.hand_off_layer(exec, state, 0, kv[0], ws);  // nothing attended yet
  CHECK(st.code() == StatusCode::kInvalidArgument);
  CHECK(st.message().find("hand_off_layer(layer = 0) has no attention to hand off") != std::string::npos);
  CHECK(d.hand_off_layer(exec, state, 3, kv[0], ws).message().find("layer = 3 is out of range") != std::string::npos);

  REQUIRE(d.attend_layer(exec, state, 0, kv[0], io, ws).ok());
  CHECK(state.handoff_layer == 0);
  // The next layer call, of any kind, waits for the handoff.
  st = d.attend_layer(exec, state, 1, kv[1], io, ws);
  CHECK(st.message().find("layer 0's hand_off_layer has not run") != std::string::npos);
  st = d.decode_layer(exec, state, 1, kv[1], io, ws);
  CHECK(st.message().find("layer 0's hand_off_layer has not run") != std::string::npos);
  CHECK(state.next_layer == 1);
  // A view of another batch, or a short workspace, is refused and leaves the handoff due.
  auto shrunk = kv[0];
  shrunk.batch = 1;
  st = d.hand_off_layer(exec, state, 0, shrunk, ws);
  CHECK(st.message().find("is not the view attend_layer(0) saw") != std::string::npos);
  st = d.hand_off_layer(exec, state, 0, kv[0], kvsift::Workspace{ws.data, ws.bytes - 1});
  CHECK(st.code() == StatusCode::kInsufficientSpace);
  // Another workspace than the one the scores went to.
  kvsift_test::HostBuffer other(run.workspace->bytes());
  st = d.hand_off_layer(exec, state, 0, kv[0], kvsift::Workspace{other.get(), other.bytes()});
  CHECK(st.message().find("the workspace is not the one attend_layer(0) wrote its scores into") != std::string::npos);
  // A layer without retrieval heads has nothing to hand off, but does not pass over one that is due.
  st = d.hand_off_layer(exec, state, 1, kv[1], ws);
  CHECK(st.message().find("layer 0's handoff is due first") != std::string::npos);
  CHECK(state.handoff_layer == 0);
  // Another layer's handoff is not this one.
  st = d.hand_off_layer(exec, state, 2, kv[2], ws);
  CHECK(st.message().find("the handoff due is layer 0's") != std::string::npos);
  REQUIRE(d.hand_off_layer(exec, state, 0, kv[0], ws).ok());
  CHECK(state.handoff_layer == -1);
  st = d.hand_off_layer(exec, state, 0, kv[0], ws);  // twice
  CHECK(st.message().find("has no attention to hand off") != std::string::npos);

  // Layer 1 has no retrieval head: nothing is due, and its hand_off_layer is a no-op either way.
  REQUIRE(d.attend_layer(exec, state, 1, kv[1], io, ws).ok());
  CHECK(state.handoff_layer == -1);
  CHECK(d.hand_off_layer(exec, state, 1, kv[1], ws).ok());
  REQUIRE(d.attend_layer(exec, state, 2, kv[2], io, ws).ok());
  CHECK(state.handoff_layer == 2);
  CHECK(state.next_layer == 0);
  // The next step cannot start before it either; restart_step abandons it.
  st = d.attend_layer(exec, state, 0, kv[0], io, ws);
  CHECK(st.message().find("layer 2's hand_off_layer has not run") != std::string::npos);
  state.restart_step();
  CHECK(state.handoff_layer == -1);
  REQUIRE(d.decode_layer(exec, state, 0, kv[0], io, ws).ok());
  CHECK(state.handoff_layer == -1);
}

TEST_CASE("LycheeDecode chain: a sparse head reads the set of the latest earlier retrieval layer of its index") {
  auto rng = kvsift_test::make_rng(702);
  const Model m = make_model(rng, 4, 2, 4, 64, 2, 120);
  auto c = base_config(m, "RR/RS/SS/SR");
  c.budget = 20;
  c.sink = 2;
  c.recent = 4;
  std::vector<StepLog> logs;
  run_against_simulation(m, c, {120, 77}, 2, rng, &logs);
  for (const auto& log : logs) {
    const auto& t = log.table_after_layer;  // rows b * 2 + h
    for (int b = 0; b < 2; ++b) {
      const int h0 = b * 2, h1 = b * 2 + 1;
      CHECK(t[1][h1] == t[0][h1]);  // layer 1: head 1 sparse keeps layer 0's set
      CHECK(t[2][h0] == t[1][h0]);  // layer 2: all sparse, nothing changes
      CHECK(t[2][h1] == t[0][h1]);
      CHECK(t[3][h0] == t[1][h0]);  // layer 3: head 0 sparse reads layer 1's set
      // Different caches per layer give different selections: the sets really were rewritten.
      CHECK(t[1][h0] != t[0][h0]);
      CHECK(t[3][h1] != t[0][h1]);
    }
  }
}

TEST_CASE("LycheeDecode forces sink and recent tokens inside the budget") {
  auto rng = kvsift_test::make_rng(703);
  const Model m = make_model(rng, 2, 2, 2, 64, 3, 200);
  auto c = base_config(m, "RR/SR");
  c.budget = 30;
  c.sink = 5;
  c.recent = 7;
  PolicyRun run(c);
  std::vector<std::int32_t> lengths = {200, 12, 31};
  for (int l = 0; l < 2; ++l) {
    const auto q = dyadic(rng, std::size_t(m.batch) * m.hkv * m.group * m.d);
    const auto kv = kvsift::make_bshd(m.k[l].data(), m.v[l].data(), m.batch, m.hkv, m.cap, m.d, lengths.data());
    std::vector<float> out;
    REQUIRE(run.layer(l, kv, q, out).ok());
  }
  for (int b = 0; b < m.batch; ++b)
    for (int h = 0; h < m.hkv; ++h) {
      const auto row = run.row(b, h);
      const int len = lengths[b];
      CHECK(int(row.size()) == std::min(len, c.budget));
      CHECK(std::is_sorted(row.begin(), row.end()));
      CHECK(std::adjacent_find(row.begin(), row.end()) == row.end());
      for (int t = 0; t < len; ++t)
        if (t < c.sink || t >= len - c.recent) CHECK(std::binary_search(row.begin(), row.end(), t));
    }
}

TEST_CASE("LycheeDecode ratio mode: the budget floor((1 - rho) L) grows with every step") {
  auto rng = kvsift_test::make_rng(704);
  const Model m = make_model(rng, 3, 2, 2, 64, 3, 240);
  auto c = base_config(m, "RR/RS/SR");
  c.selection = LycheeDecodeSelection::kRatio;
  c.rho = 0.6;
  c.sink = 3;
  c.recent = 5;
  run_against_simulation(m, c, {100, 7, 230}, 3, rng);

  // Counts follow max(sink + recent clipped, floor(0.4 L)) as L grows.
  PolicyRun run(c);
  std::vector<std::int32_t> lengths = {15, 21, 200};
  std::vector<int> previous(m.batch, 0);
  for (int step = 0; step < 8; ++step) {
    for (int l = 0; l < m.layers; ++l) {
      const auto q = dyadic(rng, std::size_t(m.batch) * m.hkv * m.group * m.d);
      const auto kv = kvsift::make_bshd(m.k[l].data(), m.v[l].data(), m.batch, m.hkv, m.cap, m.d, lengths.data());
      std::vector<float> out;
      REQUIRE(run.layer(l, kv, q, out).ok());
    }
    for (int b = 0; b < m.batch; ++b) {
      const int len = lengths[b];
      const int want = std::max(std::min(len, c.sink + c.recent), int(std::floor(0.4 * len)));
      CHECK(int(run.row(b, 0).size()) == want);
      CHECK(int(run.row(b, 0).size()) >= previous[b]);
      previous[b] = int(run.row(b, 0).size());
      lengths[b] += 5;
    }
  }
  CHECK(previous[2] > int(std::floor(0.4 * 200)));  // it did grow
}

TEST_CASE("LycheeDecode block mode: max-pooled blocks, first block and the blocks holding the last tokens") {
  auto rng = kvsift_test::make_rng(705);
  const Model m = make_model(rng, 4, 4, 2, 64, 3, 200);
  auto c = base_config(m, "RRRR/SRRS/RSSS/SSSR");
  c.selection = LycheeDecodeSelection::kBlock;
  c.block_size = 16;
  c.num_blocks = 6;
  c.sink_blocks = 1;
  c.recent = 20;  // touches 2 or 3 blocks depending on the length
  run_against_simulation(m, c, {200, 33, 48, }, 4, rng);
  run_against_simulation(m, c, {200, 33, 48, }, 2, rng, nullptr, /*two_calls=*/true);

  PolicyRun run(c);
  std::vector<std::int32_t> lengths = {161, 160, 40};
  for (int l = 0; l < m.layers; ++l) {
    const auto q = dyadic(rng, std::size_t(m.batch) * m.hkv * m.group * m.d);
    const auto kv = kvsift::make_bshd(m.k[l].data(), m.v[l].data(), m.batch, m.hkv, m.cap, m.d, lengths.data());
    std::vector<float> out;
    REQUIRE(run.layer(l, kv, q, out).ok());
  }
  for (int b = 0; b < m.batch; ++b)
    for (int h = 0; h < m.hkv; ++h) {
      const auto row = run.row(b, h);
      const int len = lengths[b], blocks = (len + 15) / 16;
      CHECK(int(row.size()) == std::min(blocks, c.num_blocks));
      CHECK(std::binary_search(row.begin(), row.end(), 0));
      for (int t = std::max(0, len - c.recent); t < len; ++t) CHECK(std::binary_search(row.begin(), row.end(), t / 16));
    }
  CHECK(run.state.table.granularity == kvsift::Granularity::kBlock);
  CHECK(run.state.table.block_size == 16);
}

TEST_CASE("LycheeDecode runs the same through a paged view and bf16 keys and values") {
  auto rng = kvsift_test::make_rng(706);
  const int B = 2, H = 2, G = 2, D = 64, page = 16, pages_per_seq = 6, S = page * pages_per_seq;
  const Model m = make_model(rng, 2, H, G, D, B, S);
  auto c = base_config(m, "RR/SR");
  c.budget = 24;
  c.sink = 2;
  c.recent = 6;
  // The same caches in bf16 (exact: quarter steps in [-2, 2]; V rounded) and in scattered pages.
  std::vector<std::int32_t> table(B * pages_per_seq);
  std::iota(table.begin(), table.end(), 0);
  std::shuffle(table.begin(), table.end(), rng);
  std::vector<std::vector<kvsift::bfloat16_t>> kp(2), vp(2);
  Model rounded = m;
  for (int l = 0; l < 2; ++l) {
    kp[l].resize(std::size_t(B) * S * H * D);
    vp[l].resize(kp[l].size());
    for (int b = 0; b < B; ++b)
      for (int t = 0; t < S; ++t)
        for (int h = 0; h < H; ++h)
          for (int i = 0; i < D; ++i) {
            const std::size_t src = ((std::size_t(b) * S + t) * H + h) * D + i;
            const std::size_t dst =
                ((std::size_t(table[b * pages_per_seq + t / page]) * page + t % page) * H + h) * D + i;  // NHD
            kp[l][dst] = kvsift::from_float<kvsift::bfloat16_t>(m.k[l][src]);
            vp[l][dst] = kvsift::from_float<kvsift::bfloat16_t>(m.v[l][src]);
            rounded.v[l][src] = kvsift::to_float(vp[l][dst]);
          }
  }
  PolicyRun run(c);
  Simulation sim(rounded, c);
  std::vector<std::int32_t> lengths = {96, 50};
  for (int l = 0; l < 2; ++l) {
    const auto q = dyadic(rng, std::size_t(B) * H * G * D);
    const auto kv = kvsift::make_paged(kp[l].data(), vp[l].data(), table.data(), B, pages_per_seq, B * pages_per_seq,
                                       H, page, D, kvsift::PageLayout::kNHD, lengths.data());
    std::vector<float> out;
    const auto st = run.layer(l, kv, q, out);
    REQUIRE_MESSAGE(st.ok(), st.to_string());
    const auto want = sim.layer(l, lengths, q);
    for (std::size_t i = 0; i < out.size(); ++i) REQUIRE(std::abs(out[i] - want[i]) <= 1e-5 * (1 + std::abs(want[i])));
  }
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < H; ++h) CHECK(run.row(b, h) == sim.sets[b][h]);
}

TEST_CASE("LycheeDecode accepts fp8 views unchanged: paged E4M3 with per-token scales, bf16 queries") {
  auto rng = kvsift_test::make_rng(707);
  const int B = 2, H = 2, G = 2, D = 64, page = 16, pages_per_seq = 6, S = page * pages_per_seq;
  const Model m = make_model(rng, 2, H, G, D, B, S);
  auto c = base_config(m, "RR/SR");
  c.budget = 24;
  c.sink = 2;
  c.recent = 6;
  // Quarter steps in [-2, 2] are E4M3 values, so codes x / 2^-e with power-of-two scales are exact: the
  // fp8 cache is the model's cache, and the policy must select exactly what the simulation selects.
  std::vector<std::int32_t> table(B * pages_per_seq);
  std::iota(table.begin(), table.end(), 0);
  std::shuffle(table.begin(), table.end(), rng);
  std::vector<std::vector<kvsift::fp8_e4m3_t>> kp(2), vp(2);
  std::vector<std::vector<float>> ks(2), vs(2);
  Model rounded = m;  // V is not dyadic: the simulation reads what the fp8 cache holds
  for (int l = 0; l < 2; ++l) {
    kp[l].resize(std::size_t(B) * S * H * D);
    vp[l].resize(kp[l].size());
    ks[l].resize(std::size_t(B) * S * H);
    vs[l].resize(ks[l].size());
    for (int b = 0; b < B; ++b)
      for (int t = 0; t < S; ++t)
        for (int h = 0; h < H; ++h) {
          const std::size_t row = (std::size_t(table[b * pages_per_seq + t / page]) * page + t % page) * H + h;  // NHD
          ks[l][row] = std::ldexp(1.f, kvsift_test::uniform_int(rng, -6, 0));
          vs[l][row] = std::ldexp(1.f, kvsift_test::uniform_int(rng, -6, 0));
          for (int i = 0; i < D; ++i) {
            const std::size_t src = ((std::size_t(b) * S + t) * H + h) * D + i;
            kp[l][row * D + i] = kvsift::from_float<kvsift::fp8_e4m3_t>(m.k[l][src] / ks[l][row]);
            vp[l][row * D + i] = kvsift::from_float<kvsift::fp8_e4m3_t>(m.v[l][src] / vs[l][row]);
            REQUIRE(kvsift::to_float(kp[l][row * D + i]) * ks[l][row] == m.k[l][src]);
            rounded.v[l][src] = kvsift::to_float(vp[l][row * D + i]) * vs[l][row];  // exact: power-of-two scale
          }
        }
  }
  LycheeDecodePolicy decoder;
  REQUIRE(LycheeDecodePolicy::create(c, &decoder).ok());
  kvsift_test::HostBuffer state_memory(decoder.state_bytes());
  LycheeDecodeState state;
  REQUIRE(decoder.make_state(state_memory.get(), state_memory.bytes(), &state).ok());
  std::size_t bytes = 0;
  REQUIRE(decoder.workspace_bytes<kvsift::fp8_e4m3_t>(kvsift::host::Exec{}, &bytes).ok());
  kvsift_test::HostBuffer workspace(bytes);
  Simulation sim(rounded, c);
  std::vector<std::int32_t> lengths = {96, 50};
  for (int l = 0; l < 2; ++l) {
    const auto q = dyadic(rng, std::size_t(B) * H * G * D);
    std::vector<kvsift::bfloat16_t> qb(q.size()), out(q.size());
    for (std::size_t i = 0; i < q.size(); ++i) qb[i] = kvsift::from_float<kvsift::bfloat16_t>(q[i]);
    auto kv = kvsift::make_paged(kp[l].data(), vp[l].data(), table.data(), B, pages_per_seq, B * pages_per_seq, H, page,
                                 D, kvsift::PageLayout::kNHD, lengths.data());
    kv.scales = kvsift::make_per_token_scales_for(kv, ks[l].data(), vs[l].data());
    const auto io = kvsift::make_query_io(qb.data(), out.data(), 1, c.num_q_heads, c.head_dim);
    const auto st = decoder.decode_layer(kvsift::host::Exec{}, state, l, kv, io, kvsift::Workspace{workspace.get(), workspace.bytes()});
    REQUIRE_MESSAGE(st.ok(), st.to_string());
    const auto want = sim.layer(l, lengths, q);
    for (std::size_t i = 0; i < out.size(); ++i)
      REQUIRE_MESSAGE(std::abs(kvsift::to_float(out[i]) - want[i]) <= 1e-2 * (1e-2 + std::abs(want[i])),  // bf16 output
                      "layer " << l << " i " << i << " got " << kvsift::to_float(out[i]) << " want " << want[i]);
  }
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < H; ++h) {
      const int r = b * H + h;
      CHECK(std::vector<int>(state.table.row(r), state.table.row(r) + state.table.count(r)) == sim.sets[b][h]);
    }
}

// ---- cache correction ----

TEST_CASE("LycheeDecode cache correction: schedule and the dense causal multi-query pass") {
  auto rng = kvsift_test::make_rng(707);
  const Model m = make_model(rng, 2, 2, 2, 64, 2, 90);
  auto c = base_config(m, "RR/SR");
  c.budget = 24;
  c.sink = 2;
  c.recent = 6;
  CHECK_FALSE(kvsift::correction_due(c, 31));  // off by default
  c.correction_interval = 4;
  for (int s = 0; s < 12; ++s) CHECK(kvsift::correction_due(c, s) == (s == 3 || s == 7 || s == 11));

  PolicyRun run(c);
  const int N = c.correction_interval, hq = m.hkv * m.group, D = m.d;
  std::vector<std::int32_t> lengths = {90, 9};
  for (int l = 0; l < m.layers; ++l) {
    const auto q = dyadic(rng, std::size_t(m.batch) * N * hq * D);
    std::vector<float> out(q.size(), -1.f);
    const auto kv = kvsift::make_bshd(m.k[l].data(), m.v[l].data(), m.batch, m.hkv, m.cap, D, lengths.data());
    const auto io = kvsift::make_query_io(q.data(), out.data(), N, hq, D);
    const auto st = run.decoder.correct_layer(kvsift::host::Exec{}, run.state, l, kv, io, kvsift::Workspace{run.workspace->get(), run.workspace->bytes()});
    REQUIRE_MESSAGE(st.ok(), st.to_string());
    // Query i sits at position len - N + i and sees tokens <= that position, every head dense.
    for (int b = 0; b < m.batch; ++b)
      for (int i = 0; i < N; ++i)
        for (int qh = 0; qh < hq; ++qh) {
          const int h = qh / m.group, last = lengths[b] - N + i;
          const float* qr = &q[((std::size_t(b) * N + i) * hq + qh) * D];
          std::vector<double> logit(last + 1);
          double mx = -INFINITY, den = 0;
          for (int t = 0; t <= last; ++t) {
            double s = 0;
            for (int e = 0; e < D; ++e) s += double(qr[e]) * m.k_at(l, b, h, t)[e];
            logit[t] = s / std::sqrt(double(D));
            mx = std::max(mx, logit[t]);
          }
          std::vector<double> acc(D, 0.0);
          for (int t = 0; t <= last; ++t) {
            const double w = std::exp(logit[t] - mx);
            den += w;
            for (int e = 0; e < D; ++e) acc[e] += w * m.v_at(l, b, h, t)[e];
          }
          for (int e = 0; e < D; ++e) {
            const double want = acc[e] / den, got = out[((std::size_t(b) * N + i) * hq + qh) * D + e];
            REQUIRE(std::abs(got - want) <= 1e-5 * (1 + std::abs(want)));
          }
        }
  }
  CHECK(run.decoder.correction_due(std::int64_t(3)));
}

// ---- roles ----

TEST_CASE("LycheeDecode takes roles from a roles file or from HardKuma gate parameters") {
  const std::string text = "kvsift-head-roles v1 layers=3 kv_heads=2\nRR\nSR\nSS\n";
  kvsift::HeadRoles from_file;
  REQUIRE(kvsift::parse_head_roles(text, &from_file, 3, 2).ok());
  LycheeDecodeConfig c;
  c.num_layers = 3;
  c.num_kv_heads = 2;
  c.num_q_heads = 4;
  c.head_dim = 64;
  c.max_batch = 1;
  c.max_kv_length = 64;
  c.budget = 32;
  c.sink = 4;
  c.recent = 8;
  c.roles = from_file;
  LycheeDecodePolicy d;
  REQUIRE(LycheeDecodePolicy::create(c, &d).ok());
  CHECK(d.retrieval_heads(0) == 2);
  CHECK(d.retrieval_heads(1) == 1);
  CHECK(d.retrieval_heads(2) == 0);
  CHECK(d.roles(1).is_sparse(0));
  CHECK_FALSE(d.roles(1).is_sparse(1));

  // Gates: E[Kuma(a, b)] > 0.5 for head 1 of layer 2 only; layer 0 forced to retrieval.
  std::vector<double> a(6, 1.0), b(6, 5.0);
  b[5] = 0.2;
  kvsift::HeadRoles from_gates;
  const kvsift::RoleExtractionOptions threshold;
  REQUIRE(kvsift::lycheedecode_roles_from_hardkuma(a.data(), b.data(), 3, 2, threshold, &from_gates).ok());
  CHECK(from_gates == roles_from("RR/SS/SR"));
  c.roles = from_gates;
  REQUIRE(LycheeDecodePolicy::create(c, &d).ok());
  kvsift::RoleExtractionOptions no_force;
  no_force.force_layer0 = false;
  const auto st = kvsift::lycheedecode_roles_from_hardkuma(a.data(), b.data(), 3, 2, no_force, &from_gates);
  CHECK(st.code() == StatusCode::kInvalidArgument);
  CHECK(st.message().find("force_layer0") != std::string::npos);
}

// ---- bad input ----

namespace {

LycheeDecodeConfig small_config() {
  LycheeDecodeConfig c;
  c.num_layers = 2;
  c.num_kv_heads = 2;
  c.num_q_heads = 4;
  c.head_dim = 64;
  c.roles = roles_from("RR/SR");
  c.max_batch = 2;
  c.max_kv_length = 128;
  c.budget = 32;
  c.sink = 4;
  c.recent = 8;
  return c;
}

void expect_rejected(const LycheeDecodeConfig& c, StatusCode code, const std::string& names) {
  LycheeDecodePolicy d;
  const auto st = LycheeDecodePolicy::create(c, &d);
  INFO(st.to_string());
  CHECK(st.code() == code);
  CHECK(st.message().find(names) != std::string::npos);
}

}  // namespace

TEST_CASE("LycheeDecode rejects bad configurations with a Status naming the parameter") {
  REQUIRE(LycheeDecodePolicy::create(small_config(), nullptr).code() == StatusCode::kNullPointer);
  {
    auto c = small_config();
    c.roles = roles_from("RS/RR");
    expect_rejected(c, StatusCode::kInvalidArgument, "layer 0");
  }
  {
    auto c = small_config();
    c.roles = roles_from("RR/SR/SS");
    expect_rejected(c, StatusCode::kInvalidArgument, "roles");
  }
  {
    auto c = small_config();
    c.budget = 11;  // sink + recent = 12: rejected, not scaled down
    expect_rejected(c, StatusCode::kInvalidArgument, "budget = 11");
  }
  for (double rho : {1.0, -0.1, 1.5, std::nan("")}) {
    auto c = small_config();
    c.selection = LycheeDecodeSelection::kRatio;
    c.rho = rho;
    expect_rejected(c, StatusCode::kInvalidArgument, "rho = ");
  }
  {
    auto c = small_config();
    c.selection = LycheeDecodeSelection::kBlock;
    c.block_size = 48;
    expect_rejected(c, StatusCode::kInvalidArgument, "block_size = 48");
    c.block_size = 8;  // a power of two the gathered attention cannot take
    expect_rejected(c, StatusCode::kUnsupported, "block_size = 8");
    c.block_size = 16;
    c.num_blocks = 1;  // sink block + up to 2 blocks for recent = 8 at block size 16
    expect_rejected(c, StatusCode::kInvalidArgument, "num_blocks = 1");
    c.num_blocks = 3;
    LycheeDecodePolicy d;
    CHECK(LycheeDecodePolicy::create(c, &d).ok());
  }
  {
    auto c = small_config();
    c.index_capacity = 31;  // budget 32
    expect_rejected(c, StatusCode::kInvalidArgument, "index_capacity = 31");
    c.selection = LycheeDecodeSelection::kBlock;
    c.block_size = 16;
    c.num_blocks = 8;
    c.index_capacity = 7;
    expect_rejected(c, StatusCode::kInvalidArgument, "index_capacity = 7");
  }
  {
    auto c = small_config();
    c.head_dim = 96;
    expect_rejected(c, StatusCode::kUnsupported, "head_dim = 96");
    c = small_config();
    c.num_q_heads = 5;
    expect_rejected(c, StatusCode::kInvalidArgument, "num_q_heads = 5");
    c = small_config();
    c.max_kv_length = 0;
    expect_rejected(c, StatusCode::kInvalidArgument, "max_kv_length = 0");
    c = small_config();
    c.correction_interval = -1;
    expect_rejected(c, StatusCode::kInvalidArgument, "correction_interval = -1");
  }
}

TEST_CASE("LycheeDecode rejects layers out of order or range, wrong shapes and short workspaces") {
  auto rng = kvsift_test::make_rng(708);
  const Model m = make_model(rng, 2, 2, 2, 64, 2, 128);
  const auto c = small_config();
  PolicyRun run(c);
  std::vector<std::int32_t> lengths = {100, 20};
  const auto q = dyadic(rng, std::size_t(2) * 4 * 64);
  std::vector<float> out;
  auto kv0 = kvsift::make_bshd(m.k[0].data(), m.v[0].data(), 2, 2, 128, 64, lengths.data());
  auto kv1 = kvsift::make_bshd(m.k[1].data(), m.v[1].data(), 2, 2, 128, 64, lengths.data());

  auto st = run.layer(1, kv1, q, out);  // a step starts at layer 0
  CHECK(st.code() == StatusCode::kInvalidArgument);
  CHECK(st.message().find("layer = 1 is out of order") != std::string::npos);
  st = run.layer(2, kv1, q, out);
  CHECK(st.message().find("layer = 2 is out of range") != std::string::npos);
  st = run.layer(-1, kv1, q, out);
  CHECK(st.message().find("layer = -1 is out of range") != std::string::npos);

  REQUIRE(run.layer(0, kv0, q, out).ok());
  st = run.layer(0, kv0, q, out);  // layer 0 twice
  CHECK(st.message().find("layer = 0 is out of order") != std::string::npos);
  auto shrunk = kv1;
  shrunk.batch = 1;
  st = run.layer(1, shrunk, q, out);
  CHECK(st.message().find("kv.batch = 1 changed within a step") != std::string::npos);
  REQUIRE(run.layer(1, kv1, q, out).ok());
  CHECK(run.state.next_layer == 0);

  auto too_many = kv0;
  too_many.batch = 3;
  st = run.layer(0, too_many, q, out);
  CHECK(st.message().find("kv.batch = 3") != std::string::npos);
  auto wrong_heads = kv0;
  wrong_heads.num_kv_heads = 1;
  st = run.layer(0, wrong_heads, q, out);
  CHECK(st.message().find("kv.num_kv_heads = 1") != std::string::npos);

  // A short workspace is an error, never an overrun; a failed layer does not move the cursor.
  const auto io = kvsift::make_query_io(q.data(), out.data(), 1, 4, 64);
  st = run.decoder.decode_layer(kvsift::host::Exec{}, run.state, 0, kv0, io, kvsift::Workspace{run.workspace->get(), run.workspace->bytes() - 1});
  CHECK(st.code() == StatusCode::kInsufficientSpace);
  st = run.decoder.decode_layer(kvsift::host::Exec{}, run.state, 0, kv0, io, kvsift::Workspace{});
  CHECK(st.code() == StatusCode::kNullPointer);
  CHECK(run.state.next_layer == 0);

  // restart_step abandons a half-done step.
  REQUIRE(run.layer(0, kv0, q, out).ok());
  run.state.restart_step();
  REQUIRE(run.layer(0, kv0, q, out).ok());

  // A state made for another configuration, and correction with correction off.
  LycheeDecodeState foreign = run.state;
  foreign.table.capacity = 5;
  st = run.decoder.decode_layer(kvsift::host::Exec{}, foreign, 1, kv1, io, kvsift::Workspace{run.workspace->get(), run.workspace->bytes()});
  CHECK(st.message().find("state") != std::string::npos);
  st = run.decoder.correct_layer(kvsift::host::Exec{}, run.state, 1, kv1, io, kvsift::Workspace{run.workspace->get(), run.workspace->bytes()});
  CHECK(st.message().find("correction_interval = 0") != std::string::npos);

  // State memory too small.
  LycheeDecodeState s;
  kvsift_test::HostBuffer tiny(16);
  st = run.decoder.make_state(tiny.get(), tiny.bytes(), &s);
  CHECK(st.code() == StatusCode::kInsufficientSpace);
}

// ---- fidelity ----

TEST_CASE("LycheeDecode fidelity on planted needles: output error against dense and needle recall") {
  auto rng = kvsift_test::make_rng(709);
  const int L = 6, H = 4, G = 4, D = 64, B = 2, S = 2048, kNeedles = 8;
  auto c = base_config(Model{L, H, G, D, B, S, {}, {}}, "RRRR/SSRS/SSSS/RSSS/SSSR/SSSS");
  c.budget = 128;
  c.sink = 8;
  c.recent = 16;
  std::normal_distribution<float> noise(0.f, 1.f);
  // Per (sequence, KV head) a direction u; needles at the same positions in every layer carry u in
  // their keys, and every query leans on u: a long-range dependency all layers agree on.
  std::vector<std::vector<float>> dir(B * H, std::vector<float>(D));
  for (auto& u : dir) {
    double n2 = 0;
    for (auto& x : u) {
      x = noise(rng);
      n2 += double(x) * x;
    }
    for (auto& x : u) x = float(x / std::sqrt(n2));
  }
  std::vector<std::vector<int>> needles(B);
  for (int b = 0; b < B; ++b) {
    while (int(needles[b].size()) < kNeedles) {
      const int t = kvsift_test::uniform_int(rng, c.sink, S - c.recent - 2);
      if (std::find(needles[b].begin(), needles[b].end(), t) == needles[b].end()) needles[b].push_back(t);
    }
  }
  Model m{L, H, G, D, B, S, {}, {}};
  for (int l = 0; l < L; ++l) {
    std::vector<float> k(std::size_t(B) * S * H * D), v(k.size());
    for (int b = 0; b < B; ++b)
      for (int t = 0; t < S; ++t)
        for (int h = 0; h < H; ++h) {
          const bool needle = std::find(needles[b].begin(), needles[b].end(), t) != needles[b].end();
          for (int i = 0; i < D; ++i) {
            const std::size_t e = ((std::size_t(b) * S + t) * H + h) * D + i;
            k[e] = 0.5f * noise(rng) + (needle ? 64.f * dir[b * H + h][i] : 0.f);
            v[e] = noise(rng) + (needle ? 3.f : 0.f);
          }
        }
    m.k.push_back(std::move(k));
    m.v.push_back(std::move(v));
  }
  PolicyRun run(c);
  std::vector<std::int32_t> lengths = {S, S - 300};
  double err2 = 0, ref2 = 0;
  int found = 0, looked = 0;
  for (int l = 0; l < L; ++l) {
    std::vector<float> q(std::size_t(B) * H * G * D);
    for (int b = 0; b < B; ++b)
      for (int hq = 0; hq < H * G; ++hq)
        for (int i = 0; i < D; ++i)
          q[(std::size_t(b) * H * G + hq) * D + i] = 0.1f * noise(rng) + 1.5f * dir[b * H + hq / G][i];
    const auto kv = kvsift::make_bshd(m.k[l].data(), m.v[l].data(), B, H, S, D, lengths.data());
    std::vector<float> sparse_out, dense_out(q.size());
    REQUIRE(run.layer(l, kv, q, sparse_out).ok());
    auto dense = kvsift::make_decode_attention_params(q.data(), dense_out.data(), 1, H * G, D);
    REQUIRE(kvsift::host::decode_attention(kvsift::host::Exec{}, kv, dense).ok());
    for (std::size_t i = 0; i < q.size(); ++i) {
      err2 += double(sparse_out[i] - dense_out[i]) * (sparse_out[i] - dense_out[i]);
      ref2 += double(dense_out[i]) * dense_out[i];
    }
    for (int b = 0; b < B; ++b)
      for (int h = 0; h < H; ++h) {
        const auto row = run.row(b, h);
        for (int t : needles[b]) {
          if (t >= lengths[b]) continue;
          ++looked;
          found += std::binary_search(row.begin(), row.end(), t) ? 1 : 0;
        }
      }
  }
  const double rel_err = std::sqrt(err2 / ref2), recall = double(found) / looked;
  MESSAGE("LycheeDecode needle fidelity (", L, " layers, budget ", c.budget, " of ", S,
          " tokens): relative error vs dense = ", rel_err, ", needle recall = ", recall);
  CHECK(recall >= 0.99);
  CHECK(rel_err < 0.05);
}

TEST_CASE("shard_head_roles: a rank's roles are its heads' roles, renumbered from 0") {
  using kvsift::HeadRoles;
  const int layers = 6, kv_heads = 8;
  std::vector<std::uint8_t> bytes(std::size_t(layers) * kv_heads);
  auto rng = kvsift_test::make_rng(77);
  for (auto& b : bytes) b = std::uint8_t(kvsift_test::uniform_int(rng, 0, 1));
  HeadRoles roles;
  REQUIRE(kvsift::make_head_roles(layers, kv_heads, bytes.data(), &roles).ok());
  for (int ranks : {1, 2, 4, 8}) {
    const int per = kv_heads / ranks;
    int retrieval = 0;
    for (int r = 0; r < ranks; ++r) {
      HeadRoles shard;
      REQUIRE(kvsift::shard_head_roles(roles, r * per, per, &shard).ok());
      CHECK(shard.layers == layers);
      CHECK(shard.kv_heads == per);
      for (int l = 0; l < layers; ++l)
        for (int h = 0; h < per; ++h) CHECK(shard.is_retrieval(l, h) == (bytes[std::size_t(l) * kv_heads + r * per + h] != 0));
      retrieval += shard.retrieval_count();
    }
    CHECK(retrieval == roles.retrieval_count());
  }
  HeadRoles whole;
  REQUIRE(kvsift::shard_head_roles(roles, 0, kv_heads, &whole).ok());
  CHECK(whole == roles);
  HeadRoles out;
  CHECK(kvsift::shard_head_roles(roles, 6, 4, &out).message().find("KV heads [6, 10) are not inside the roles' [0, 8)") !=
        std::string::npos);
  CHECK(kvsift::shard_head_roles(roles, 0, 0, &out).code() == kvsift::StatusCode::kInvalidArgument);
  CHECK(kvsift::shard_head_roles(roles, -1, 2, &out).code() == kvsift::StatusCode::kInvalidArgument);
  CHECK(kvsift::shard_head_roles(HeadRoles(), 0, 1, &out).code() == kvsift::StatusCode::kInvalidArgument);
}
