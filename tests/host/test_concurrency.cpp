// Concurrency on the host backend: 4 threads run independent decode steps at once (each job its own
// inputs, outputs, workspace and LycheeDecode state; the LycheeDecodePolicy object itself is shared,
// as docs/integration.md allows) and every result must be bit-identical to the same job run alone.
// A job is one decode_attention call, one topk call and one LycheeDecode step over every layer;
// jobs differ in shape, so a thread-unsafe cache keyed on anything shape-dependent would show.
// Worker threads record mismatches in plain counters; doctest assertions run on the main thread only.

#include <doctest/doctest.h>

#include <atomic>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

#include "kvsift/kvsift.hpp"
#include "support/host_buffer.hpp"
#include "support/random.hpp"

namespace {

using kvsift::bfloat16_t;

constexpr int kThreads = 4, kJobsPerThread = 4, kRounds = 6;

struct Job {
  // decode attention: BSHD bf16, dense, per-token scores
  int B = 2, H = 2, G = 4, D = 64, S = 0;
  std::vector<bfloat16_t> k, v, q, out;
  std::vector<float> lse, scores;
  std::vector<std::int32_t> lengths;
  // topk
  int rows = 6, cols = 0, capacity = 0;
  std::vector<float> topk_in;
  std::vector<std::int32_t> topk_idx, topk_counts;
  // LycheeDecode: two layers sharing the job's K/V
  std::shared_ptr<kvsift::LycheeDecodePolicy> policy;
  std::unique_ptr<kvsift_test::HostBuffer> state_mem, ws;
  kvsift::LycheeDecodeState state;
  std::vector<bfloat16_t> lq, lout;

  Job(std::mt19937_64& rng, int id, std::shared_ptr<kvsift::LycheeDecodePolicy> shared_policy) : policy(std::move(shared_policy)) {
    S = 48 + 40 * id;
    k = kvsift_test::random_values<bfloat16_t>(rng, std::size_t(B) * S * H * D);
    v = kvsift_test::random_values<bfloat16_t>(rng, k.size());
    q = kvsift_test::random_values<bfloat16_t>(rng, std::size_t(B) * H * G * D, -2.f, 2.f);
    lengths = {S, kvsift_test::uniform_int(rng, 1, S)};
    cols = 200 + 150 * id;
    capacity = 16 + id;
    topk_in = kvsift_test::random_values<float>(rng, std::size_t(rows) * cols);
    lq = kvsift_test::random_values<bfloat16_t>(rng, q.size(), -2.f, 2.f);
    state_mem = std::make_unique<kvsift_test::HostBuffer>(policy->state_bytes());
    REQUIRE(policy->make_state(state_mem->get(), state_mem->bytes(), &state).ok());
    std::size_t bytes = 0;
    REQUIRE(policy->workspace_bytes<bfloat16_t>(kvsift::host::Exec{}, &bytes).ok());
    ws = std::make_unique<kvsift_test::HostBuffer>(bytes);
  }

  // Runs the job; false on any error status.
  bool run() {
    const kvsift::host::Exec exec;
    out.assign(q.size(), kvsift::from_float<bfloat16_t>(NAN));
    lse.assign(std::size_t(B) * H * G, NAN);
    scores.assign(std::size_t(B) * H * S, NAN);
    auto kv = kvsift::make_bshd(k.data(), v.data(), B, H, S, D, lengths.data());
    auto p = kvsift::make_decode_attention_params(q.data(), out.data(), 1, H * G, D);
    p.io.lse = lse.data();
    p.scores = scores.data();
    p.score_row_stride = S;
    if (!kvsift::host::decode_attention(exec, kv, p).ok()) return false;

    topk_idx.assign(std::size_t(rows) * capacity, -1);
    topk_counts.assign(std::size_t(rows), -1);
    kvsift::TopKParams tp;
    tp.k = capacity;
    tp.sink = 2;
    if (!kvsift::host::topk(exec, kvsift::make_strided_view<const float>(topk_in.data(), rows, cols), tp,
                            kvsift::make_index_set(topk_idx.data(), topk_counts.data(), rows, capacity)).ok())
      return false;

    lout.assign(lq.size(), kvsift::from_float<bfloat16_t>(NAN));
    for (int l = 0; l < policy->config().num_layers; ++l) {
      const auto io = kvsift::make_query_io(lq.data(), lout.data(), 1, H * G, D);
      if (!policy->decode_layer(exec, state, l, kv, io, kvsift::Workspace{ws->get(), ws->bytes()}).ok()) return false;
    }
    return true;
  }

  struct Result {
    std::vector<unsigned char> bytes;
  };
  Result snapshot() const {
    Result r;
    auto add = [&](const void* p, std::size_t n) {
      const auto* c = static_cast<const unsigned char*>(p);
      r.bytes.insert(r.bytes.end(), c, c + n);
    };
    add(out.data(), out.size() * sizeof(bfloat16_t));
    add(lse.data(), lse.size() * 4);
    add(scores.data(), scores.size() * 4);
    add(topk_idx.data(), topk_idx.size() * 4);
    add(topk_counts.data(), topk_counts.size() * 4);
    add(lout.data(), lout.size() * sizeof(bfloat16_t));
    const auto& t = state.table;
    add(t.indices, std::size_t(t.rows) * t.row_stride * 4);
    add(t.counts, std::size_t(t.rows) * 4);
    return r;
  }
};

}  // namespace

TEST_CASE("host backend: 4 threads x 4 independent decode steps give the serial results bit for bit") {
  auto rng = kvsift_test::make_rng(1801);
  kvsift::LycheeDecodeConfig c;
  c.num_layers = 2;
  c.num_kv_heads = 2;
  c.num_q_heads = 8;
  c.head_dim = 64;
  c.roles = kvsift_test::roles_from("RR/RS");
  c.max_batch = 2;
  c.max_kv_length = 48 + 40 * (kThreads * kJobsPerThread - 1);
  c.budget = 24;
  c.sink = 2;
  c.recent = 4;
  auto policy = std::make_shared<kvsift::LycheeDecodePolicy>();
  REQUIRE(kvsift::LycheeDecodePolicy::create(c, policy.get()).ok());

  std::vector<std::unique_ptr<Job>> jobs;
  std::vector<Job::Result> serial;
  for (int j = 0; j < kThreads * kJobsPerThread; ++j) {
    jobs.push_back(std::make_unique<Job>(rng, j, policy));
    REQUIRE(jobs.back()->run());
    serial.push_back(jobs.back()->snapshot());
  }
  std::atomic<int> errors{0}, mismatches{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t)
    threads.emplace_back([&, t] {
      for (int round = 0; round < kRounds; ++round)
        for (int j = t * kJobsPerThread; j < (t + 1) * kJobsPerThread; ++j) {
          if (!jobs[std::size_t(j)]->run()) ++errors;
          if (jobs[std::size_t(j)]->snapshot().bytes != serial[std::size_t(j)].bytes) ++mismatches;
        }
    });
  for (auto& th : threads) th.join();
  CHECK(errors == 0);
  CHECK(mismatches == 0);
}
