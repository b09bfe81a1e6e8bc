// Concurrency on the GPU: 4 host threads, each driving 4 streams, run independent decode steps (one
// decode_attention call, one topk call and one LycheeDecode step over every layer per job; each job
// its own buffers, workspace and state, the LycheeDecodePolicy shared), and every result must equal
// the job's serial run bit for bit. Jobs differ in shape, so the same kernel instantiation is launched
// with different dynamic shared memory from different threads at once: the launchers set
// cudaFuncAttributeMaxDynamicSharedMemorySize on every call (topk.cuh, decode_attention.cuh), and
// a thread that lowers it between another thread's set and launch makes that launch fail (the
// second test case aims at exactly that window). Worker threads record failures in counters;
// doctest assertions run on the main thread only.

#include <doctest/doctest.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "kvsift/kvsift.cuh"
#include "kvsift/policy/lycheedecode.cuh"
#include "support/device_buffer.cuh"
#include "support/random.hpp"
#include "support/tool_scale.hpp"

namespace {

using kvsift::bfloat16_t;
using kvsift_test::DeviceBuffer;

constexpr int kThreads = 4, kStreamsPerThread = 4;

// Rounds of the decode-step case (8) and launches per thread of the topk case (3000), from the
// environment where set (kvsift_test::count_from_env): scripts/gpu-sanitize.sh runs fewer under a
// tool, whose checks see each kernel's own accesses, not the interleaving the repetitions are there to
// provoke.
using kvsift_test::count_from_env;

std::atomic<int>& first_error_code() {
  static std::atomic<int> c{0};
  return c;
}
void note_error(const kvsift::Status& st, std::atomic<int>& errors) {
  if (st.ok()) return;
  ++errors;
  int expected = 0;
  first_error_code().compare_exchange_strong(expected, int(st.code()));
}

struct Job {
  int B = 2, H = 2, G = 4, D = 128, S = 0;
  DeviceBuffer<bfloat16_t> k, v, q, out;
  DeviceBuffer<float> lse, scores;
  DeviceBuffer<std::int32_t> lengths;
  std::unique_ptr<DeviceBuffer<unsigned char>> decode_ws;
  std::size_t decode_ws_bytes = 0;
  int rows = 0, cols = 0, capacity = 0;
  DeviceBuffer<float> topk_in;
  DeviceBuffer<std::int32_t> topk_idx, topk_counts;
  const kvsift::LycheeDecodePolicy* policy = nullptr;
  DeviceBuffer<unsigned char> state_mem;
  std::unique_ptr<DeviceBuffer<unsigned char>> lychee_ws;
  kvsift::LycheeDecodeState state;
  DeviceBuffer<bfloat16_t> lq, lout;
  cudaStream_t stream = nullptr;

  Job(std::mt19937_64& rng, int id, const kvsift::LycheeDecodePolicy* p)
      : S(100 + 37 * id),
        k(kvsift_test::random_values<bfloat16_t>(rng, std::size_t(B) * S * H * D)),
        v(kvsift_test::random_values<bfloat16_t>(rng, std::size_t(B) * S * H * D)),
        q(kvsift_test::random_values<bfloat16_t>(rng, std::size_t(B) * H * G * D, -2.f, 2.f)),
        out(std::size_t(B) * H * G * D), lse(std::size_t(B) * H * G), scores(std::size_t(B) * H * S),
        lengths(std::vector<std::int32_t>{S, kvsift_test::uniform_int(rng, 1, S)}),
        rows(4 + id % 5), cols(1500 + 1700 * id), capacity(32 + id),
        topk_in(kvsift_test::random_values<float>(rng, std::size_t(4 + id % 5) * (1500 + 1700 * id))),
        topk_idx(std::size_t(4 + id % 5) * (32 + id)), topk_counts(std::size_t(4 + id % 5)), policy(p),
        state_mem(p->state_bytes()),
        lq(kvsift_test::random_values<bfloat16_t>(rng, std::size_t(B) * H * G * D, -2.f, 2.f)),
        lout(std::size_t(B) * H * G * D) {
    KVSIFT_TEST_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    state_mem.poison();
    REQUIRE(policy->make_state(state_mem.get(), state_mem.size(), &state).ok());
    const auto exec = kvsift::cuda::Exec::for_current_device(stream);
    std::size_t bytes = 0;
    REQUIRE(policy->workspace_bytes<bfloat16_t>(exec, &bytes).ok());
    lychee_ws = std::make_unique<DeviceBuffer<unsigned char>>(std::max<std::size_t>(bytes, 1));
    REQUIRE(kvsift::decode_attention_workspace_bytes(exec, view(), params(), &decode_ws_bytes).ok());
    decode_ws = std::make_unique<DeviceBuffer<unsigned char>>(std::max<std::size_t>(decode_ws_bytes, 1));
    // The uploads and the poison above ran on the legacy stream, which may return before the device is
    // done and which the job's non-blocking stream does not wait for.
    KVSIFT_TEST_CUDA(cudaDeviceSynchronize());
  }
  Job(const Job&) = delete;
  ~Job() {
    if (stream) cudaStreamDestroy(stream);
  }

  kvsift::ContiguousKV<bfloat16_t> view() const { return kvsift::make_bshd(k.get(), v.get(), B, H, S, D, lengths.get()); }
  kvsift::DecodeAttentionParams<bfloat16_t> params() const {
    auto p = kvsift::make_decode_attention_params<bfloat16_t>(q.get(), out.get(), 1, H * G, D);
    p.io.lse = lse.get();
    p.scores = scores.get();
    p.score_row_stride = S;
    p.score_block_size = 1;
    return p;
  }

  // Enqueues the job on its stream: outputs poisoned first, then the three steps. No host sync.
  void enqueue(std::atomic<int>& errors) {
    const auto exec = kvsift::cuda::Exec::for_current_device(stream);
    for (auto* b : {&out, &lout}) cudaMemsetAsync(b->get(), kvsift_test::kPoisonByte, b->size() * 2, stream);
    for (auto* b : {&lse, &scores}) cudaMemsetAsync(b->get(), kvsift_test::kPoisonByte, b->size() * 4, stream);
    for (auto* b : {&topk_idx, &topk_counts}) cudaMemsetAsync(b->get(), kvsift_test::kPoisonByte, b->size() * 4, stream);
    note_error(kvsift::cuda::decode_attention(exec, view(), params(), kvsift::Workspace{decode_ws->get(), decode_ws_bytes}),
               errors);
    kvsift::TopKParams tp;
    tp.k = capacity;
    tp.sink = 4;
    tp.recent = 4;
    note_error(kvsift::cuda::topk(exec, kvsift::make_strided_view<const float>(topk_in.get(), rows, cols), tp,
                                  kvsift::make_index_set(topk_idx.get(), topk_counts.get(), rows, capacity)),
               errors);
    for (int l = 0; l < policy->config().num_layers; ++l) {
      const auto io = kvsift::make_query_io<bfloat16_t>(lq.get(), lout.get(), 1, H * G, D);
      note_error(policy->decode_layer(exec, state, l, view(), io, kvsift::Workspace{lychee_ws->get(), lychee_ws->size()}),
                 errors);
    }
  }

  // Every output's bytes, after the stream drained (host copies on the job's stream).
  std::vector<unsigned char> snapshot() const {
    std::vector<unsigned char> r;
    auto add = [&](const void* p, std::size_t n) {
      const std::size_t at = r.size();
      r.resize(at + n);
      cudaMemcpyAsync(r.data() + at, p, n, cudaMemcpyDeviceToHost, stream);
      cudaStreamSynchronize(stream);
    };
    add(out.get(), out.size() * 2);
    add(lse.get(), lse.size() * 4);
    add(scores.get(), scores.size() * 4);
    add(topk_idx.get(), topk_idx.size() * 4);
    add(topk_counts.get(), topk_counts.size() * 4);
    add(lout.get(), lout.size() * 2);
    add(state.table.indices, std::size_t(state.table.rows) * state.table.row_stride * 4);
    add(state.table.counts, std::size_t(state.table.rows) * 4);
    return r;
  }
};

kvsift::LycheeDecodeConfig lychee_config(int max_len) {
  kvsift::LycheeDecodeConfig c;
  c.num_layers = 3;
  c.num_kv_heads = 2;
  c.num_q_heads = 8;
  c.head_dim = 128;
  c.roles = kvsift_test::roles_from("RR/RS/SR");
  c.max_batch = 2;
  c.max_kv_length = max_len;
  c.budget = 64;
  c.sink = 4;
  c.recent = 8;
  return c;
}

}  // namespace

TEST_CASE("gpu: 4 threads x 4 streams of independent decode steps give the serial results bit for bit") {
  auto rng = kvsift_test::make_rng(1802);
  const int jobs_n = kThreads * kStreamsPerThread;
  kvsift::LycheeDecodePolicy policy;
  REQUIRE(kvsift::LycheeDecodePolicy::create(lychee_config(100 + 37 * (jobs_n - 1)), &policy).ok());
  std::vector<std::unique_ptr<Job>> jobs;
  std::vector<std::vector<unsigned char>> serial;
  std::atomic<int> errors{0}, mismatches{0};
  for (int j = 0; j < jobs_n; ++j) {
    jobs.push_back(std::make_unique<Job>(rng, j, &policy));
    jobs.back()->enqueue(errors);  // serial: one job at a time, drained before the next
    serial.push_back(jobs.back()->snapshot());
  }
  kvsift_test::sync_and_check();
  REQUIRE(errors == 0);
  const int rounds = count_from_env("KVSIFT_CONCURRENCY_ROUNDS", 8);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t)
    threads.emplace_back([&, t] {
      for (int round = 0; round < rounds; ++round) {
        // All of this thread's streams in flight at once, then each checked.
        for (int s = 0; s < kStreamsPerThread; ++s) jobs[std::size_t(t * kStreamsPerThread + s)]->enqueue(errors);
        for (int s = 0; s < kStreamsPerThread; ++s) {
          const int j = t * kStreamsPerThread + s;
          if (jobs[std::size_t(j)]->snapshot() != serial[std::size_t(j)]) ++mismatches;
        }
      }
    });
  for (auto& th : threads) th.join();
  kvsift_test::sync_and_check();
  CHECK_MESSAGE(errors == 0, "launch errors from concurrent threads; first status code ", first_error_code().load());
  CHECK(mismatches == 0);
}

// The shared-memory attribute window: the same topk instantiation (fp32, candidate select, 512
// threads) launched by 4 threads with slices of very different sizes, thousands of times. Each
// launch sets the kernel's maximum dynamic shared memory to its own need just before launching; if
// another thread lowers it in between, cudaLaunchKernelEx fails (too much shared memory requested).
// A pass here does not prove the window closed (it is narrow); a failure proves it open.
TEST_CASE("gpu: concurrent topk launches needing different shared memory all succeed") {
  auto rng = kvsift_test::make_rng(1803);
  struct Shape {
    int rows, cols;
  };
  const Shape shapes[kThreads] = {{2, 9000}, {2, 30000}, {2, 4500}, {2, 60000}};  // slices 36 KB .. 360 KB of keys+offsets
  std::vector<DeviceBuffer<float>> in;
  std::vector<DeviceBuffer<std::int32_t>> idx, counts;
  std::vector<cudaStream_t> streams(kThreads);
  for (int t = 0; t < kThreads; ++t) {
    in.emplace_back(kvsift_test::random_values<float>(rng, std::size_t(shapes[t].rows) * shapes[t].cols));
    idx.emplace_back(std::size_t(shapes[t].rows) * 64);
    counts.emplace_back(std::size_t(shapes[t].rows));
    KVSIFT_TEST_CUDA(cudaStreamCreateWithFlags(&streams[std::size_t(t)], cudaStreamNonBlocking));
  }
  KVSIFT_TEST_CUDA(cudaDeviceSynchronize());  // the uploads (legacy stream) before the non-blocking streams
  const int launches = count_from_env("KVSIFT_CONCURRENCY_LAUNCHES", 3000);
  std::atomic<int> errors{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t)
    threads.emplace_back([&, t] {
      const auto exec = kvsift::cuda::Exec::for_current_device(streams[std::size_t(t)]);
      kvsift::TopKParams tp;
      tp.k = 64;
      for (int i = 0; i < launches; ++i) {
        note_error(kvsift::cuda::topk(exec, kvsift::make_strided_view<const float>(in[std::size_t(t)].get(), shapes[t].rows, shapes[t].cols),
                                      tp, kvsift::make_index_set(idx[std::size_t(t)].get(), counts[std::size_t(t)].get(), shapes[t].rows, 64)),
                   errors);
        if (i % 64 == 0) cudaStreamSynchronize(streams[std::size_t(t)]);
      }
      cudaStreamSynchronize(streams[std::size_t(t)]);
    });
  for (auto& th : threads) th.join();
  for (auto s : streams) cudaStreamDestroy(s);
  const cudaError_t sticky = cudaGetLastError();
  CHECK_MESSAGE(errors == 0, errors.load(), " of ", kThreads * launches, " launches failed; first status code ",
                first_error_code().load(), " (", cudaGetErrorString(sticky), ")");
  kvsift_test::sync_and_check();
}
