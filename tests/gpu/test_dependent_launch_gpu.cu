// Exec::dependent_launch: store_kv, decode_attention, topk (every kernel of its plan), a LycheeDecode
// layer (attention, the row plan, top-k) and compress_prompt (every policy's kernels) launched as
// programmatic dependents of an engine kernel that lets them be scheduled at once
// (griddepcontrol.launch_dependents) and writes their inputs only afterwards, after a delay. The ops
// must wait for it: their results equal the same ops launched plainly, bit for bit. A kernel that read before its wait would see the poisoned inputs (or
// half-written ones) and differ.

#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "kvsift/kvsift.cuh"
#include "kvsift/policy/lycheedecode.cuh"
#include "support/device_buffer.cuh"

using kvsift_test::DeviceBuffer;

namespace {

// The engine's kernel: allows its dependents first, then waits ~spin_ns, then copies src to dst.
template <class T>
__global__ void late_copy(const T* src, T* dst, std::int64_t n, long long spin_ns) {
#if __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
  unsigned long long t0, t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
  do {
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  } while (t - t0 < static_cast<unsigned long long>(spin_ns));
  for (std::int64_t i = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; i < n; i += std::int64_t(gridDim.x) * blockDim.x)
    dst[i] = src[i];
}

template <class T>
void launch_late_copy(const T* src, T* dst, std::int64_t n, cudaStream_t stream) {
  // The callers' poisons and uploads (cudaMemset / cudaMemcpy on the legacy stream, which the
  // non-blocking `stream` does not wait for) are done before the writer starts.
  KVSIFT_TEST_CUDA(cudaDeviceSynchronize());
  late_copy<T><<<64, 256, 0, stream>>>(src, dst, n, 200000);  // 0.2 ms: far longer than a launch
  KVSIFT_TEST_CUDA(cudaGetLastError());
}

template <class T>
std::vector<T> random_rows(std::mt19937& rng, std::size_t n) {
  std::normal_distribution<float> normal(0.f, 1.f);
  std::vector<T> x(n);
  for (T& v : x) v = kvsift::from_float<T>(normal(rng));
  return x;
}

template <class T>
bool same_bytes(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

int cc_major() {
  int device = 0, major = 0;
  KVSIFT_TEST_CUDA(cudaGetDevice(&device));
  KVSIFT_TEST_CUDA(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  return major;
}

// store_kv of n rows whose K/V the late kernel writes, into a poisoned cache.
template <class T>
std::vector<T> store_after_late_writer(bool dependent, const std::vector<T>& kin, const std::vector<T>& vin, int n, int heads, int d,
                                       int capacity) {
  cudaStream_t stream = nullptr;
  KVSIFT_TEST_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  std::vector<T> kv_in(kin);  // K rows, then V rows: one late copy writes both
  kv_in.insert(kv_in.end(), vin.begin(), vin.end());
  DeviceBuffer<T> src(kv_in), rows(kv_in.size());
  rows.poison();
  DeviceBuffer<T> cache_k(std::size_t(heads) * capacity * d), cache_v(cache_k.size());
  cache_k.poison();
  cache_v.poison();
  const std::vector<std::int32_t> seq(static_cast<std::size_t>(n), 0), len{capacity};
  std::vector<std::int32_t> pos(static_cast<std::size_t>(n));
  for (int i = 0; i < n; ++i) pos[std::size_t(i)] = i;
  DeviceBuffer<std::int32_t> dseq(seq), dpos(pos), dlen(len);
  kvsift::cuda::Exec exec = kvsift::cuda::Exec::for_current_device(stream);
  exec.dependent_launch = dependent;
  const auto kv = kvsift::make_bhsd(cache_k.get(), cache_v.get(), 1, heads, capacity, d, dlen.get());
  const T* k_rows = rows.get();
  const auto p = kvsift::make_store_kv_params(k_rows, k_rows + kin.size(), n, heads, d, dseq.get(), dpos.get());
  launch_late_copy(src.get(), rows.get(), std::int64_t(kv_in.size()), stream);
  REQUIRE(kvsift::cuda::store_kv(exec, kv, p).ok());
  KVSIFT_TEST_CUDA(cudaStreamSynchronize(stream));
  std::vector<T> out = cache_k.download(), v = cache_v.download();
  out.insert(out.end(), v.begin(), v.end());
  KVSIFT_TEST_CUDA(cudaStreamDestroy(stream));
  return out;
}

// decode_attention over a filled cache, with the queries written by the late kernel; output and LSE.
template <class T>
std::vector<float> attend_after_late_writer(bool dependent, const std::vector<T>& k, const std::vector<T>& v, const std::vector<T>& q,
                                            int batch, int heads, int group, int d, int capacity, const std::vector<std::int32_t>& len) {
  cudaStream_t stream = nullptr;
  KVSIFT_TEST_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  DeviceBuffer<T> dk(k), dv(v), src_q(q), dq(q.size()), dout(q.size());
  dq.poison();
  dout.poison();
  DeviceBuffer<float> dlse(std::size_t(batch) * heads * group);
  dlse.poison();
  DeviceBuffer<std::int32_t> dlen(len);
  kvsift::cuda::Exec exec = kvsift::cuda::Exec::for_current_device(stream);
  exec.dependent_launch = dependent;
  const auto kv = kvsift::make_bhsd(dk.get(), dv.get(), batch, heads, capacity, d, dlen.get());
  auto p = kvsift::make_decode_attention_params(static_cast<const T*>(dq.get()), dout.get(), 1, heads * group, d);
  p.io.lse = dlse.get();
  std::size_t bytes = 0;
  REQUIRE(kvsift::decode_attention_workspace_bytes(exec, kv, p, &bytes).ok());
  DeviceBuffer<unsigned char> ws(bytes + 1);
  launch_late_copy(src_q.get(), dq.get(), std::int64_t(q.size()), stream);
  REQUIRE(kvsift::cuda::decode_attention(exec, kv, p, kvsift::Workspace{ws.get(), bytes}).ok());
  KVSIFT_TEST_CUDA(cudaStreamSynchronize(stream));
  std::vector<float> result;
  for (const T& x : dout.download()) result.push_back(kvsift::to_float(x));
  for (float x : dlse.download()) result.push_back(x);
  KVSIFT_TEST_CUDA(cudaStreamDestroy(stream));
  return result;
}

template <class T>
void check_decode(std::mt19937& rng, int capacity) {
  const int batch = 2, heads = 2, group = 4, d = 128;
  const std::size_t cache = std::size_t(batch) * heads * capacity * d;
  const auto k = random_rows<T>(rng, cache), v = random_rows<T>(rng, cache);
  const auto q = random_rows<T>(rng, std::size_t(batch) * heads * group * d);
  const std::vector<std::int32_t> len{capacity, capacity / 2 + 1};
  const auto plain = attend_after_late_writer<T>(false, k, v, q, batch, heads, group, d, capacity, len);
  const auto dependent = attend_after_late_writer<T>(true, k, v, q, batch, heads, group, d, capacity, len);
  for (float x : plain) REQUIRE(std::isfinite(x));  // the plain launch read the written queries
  CHECK(same_bytes(plain, dependent));
}

// topk of rows the late kernel writes: indices, then counts.
std::vector<std::int32_t> select_after_late_writer(bool dependent, const std::vector<float>& scores, int rows, int cols, int k) {
  cudaStream_t stream = nullptr;
  KVSIFT_TEST_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  DeviceBuffer<float> src(scores), dscores(scores.size());
  dscores.poison();
  DeviceBuffer<std::int32_t> idx(std::size_t(rows) * k), counts{std::size_t(rows)};
  idx.poison();
  counts.poison();
  kvsift::cuda::Exec exec = kvsift::cuda::Exec::for_current_device(stream);
  exec.dependent_launch = dependent;
  kvsift::TopKParams p;
  p.k = k;
  launch_late_copy(src.get(), dscores.get(), std::int64_t(scores.size()), stream);
  REQUIRE(kvsift::cuda::topk(exec, kvsift::make_strided_view<const float>(dscores.get(), rows, cols), p,
                             kvsift::make_index_set(idx.get(), counts.get(), rows, k))
              .ok());
  KVSIFT_TEST_CUDA(cudaStreamSynchronize(stream));
  std::vector<std::int32_t> out = idx.download(), c = counts.download();
  out.insert(out.end(), c.begin(), c.end());
  KVSIFT_TEST_CUDA(cudaStreamDestroy(stream));
  return out;
}

// Two LycheeDecode layers (all retrieval, then one retrieval head of four) over a filled cache, the
// queries of each written by the late kernel: both layers' outputs and the index table.
template <class T>
std::vector<std::int32_t> lycheedecode_after_late_writer(bool dependent, const std::vector<T>& k, const std::vector<T>& v,
                                                         const std::vector<T>& q, int batch, int heads, int group, int d,
                                                         int capacity, const std::vector<std::int32_t>& len) {
  cudaStream_t stream = nullptr;
  KVSIFT_TEST_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  kvsift::LycheeDecodeConfig c;
  c.num_layers = 2;
  c.num_q_heads = heads * group;
  c.num_kv_heads = heads;
  c.head_dim = d;
  std::vector<std::uint8_t> roles(std::size_t(2 * heads), 0);
  for (int h = 0; h < heads; ++h) roles[std::size_t(h)] = 1;
  roles[std::size_t(heads)] = 1;
  REQUIRE(kvsift::make_head_roles(2, heads, roles.data(), &c.roles).ok());
  c.max_batch = batch;
  c.max_kv_length = capacity;
  c.budget = 256;
  c.sink = 16;
  c.recent = 32;
  kvsift::LycheeDecodePolicy policy;
  REQUIRE(kvsift::LycheeDecodePolicy::create(c, &policy).ok());
  kvsift::cuda::Exec exec = kvsift::cuda::Exec::for_current_device(stream);
  exec.dependent_launch = dependent;
  DeviceBuffer<unsigned char> state_memory(policy.state_bytes());
  state_memory.poison();
  kvsift::LycheeDecodeState state;
  REQUIRE(policy.make_state(state_memory.get(), policy.state_bytes(), &state).ok());
  std::size_t bytes = 0;
  REQUIRE(policy.workspace_bytes<T>(exec, &bytes).ok());
  DeviceBuffer<unsigned char> ws(bytes);
  ws.poison();
  DeviceBuffer<T> dk(k), dv(v), src_q(q), dq(q.size()), dout(q.size());
  DeviceBuffer<std::int32_t> dlen(len);
  const auto kv = kvsift::make_bhsd(dk.get(), dv.get(), batch, heads, capacity, d, dlen.get());
  const auto io = kvsift::make_query_io<T>(dq.get(), dout.get(), 1, heads * group, d);
  std::vector<std::int32_t> result;
  for (int layer = 0; layer < 2; ++layer) {
    dq.poison();
    dout.poison();
    launch_late_copy(src_q.get(), dq.get(), std::int64_t(q.size()), stream);
    REQUIRE(policy.decode_layer(exec, state, layer, kv, io, kvsift::Workspace{ws.get(), bytes}).ok());
    KVSIFT_TEST_CUDA(cudaStreamSynchronize(stream));
    for (const T& x : dout.download()) {
      std::int32_t bits = 0;
      std::memcpy(&bits, &x, sizeof(T));
      result.push_back(bits);
    }
  }
  const std::size_t rows = std::size_t(batch) * heads, cap = std::size_t(state.table.capacity);
  std::vector<std::int32_t> indices(rows * cap), counts(rows);
  KVSIFT_TEST_CUDA(cudaMemcpy(indices.data(), state.table.indices, indices.size() * 4, cudaMemcpyDeviceToHost));
  KVSIFT_TEST_CUDA(cudaMemcpy(counts.data(), state.table.counts, counts.size() * 4, cudaMemcpyDeviceToHost));
  for (std::size_t r = 0; r < rows; ++r) {
    result.push_back(counts[r]);
    for (int i = 0; i < counts[r] && i < int(cap); ++i) result.push_back(indices[r * cap + std::size_t(i)]);
  }
  KVSIFT_TEST_CUDA(cudaStreamDestroy(stream));
  return result;
}

// compress_prompt over a prompt cache whose K, V and queries (one buffer: K, then V, then each
// sequence's q_rows queries) the late kernel writes: the compressed K and V, then the kept positions and new lengths, as bytes.
std::vector<unsigned char> compress_after_late_writer(bool dependent, kvsift::CompressionPolicy policy, const float* lse,
                                                      const std::vector<kvsift::bfloat16_t>& kvq, int batch, int heads,
                                                      int q_heads, int capacity, int d, int q_rows,
                                                      const std::vector<std::int32_t>& len) {
  using T = kvsift::bfloat16_t;
  cudaStream_t stream = nullptr;
  KVSIFT_TEST_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  kvsift::PromptCompressionConfig c;
  c.policy = policy;
  c.capacity = 128;
  c.window = 16;
  c.theta = 1e-3f;
  const kvsift::PromptCompressionShape shape{batch, heads, q_heads, capacity};
  kvsift::cuda::Exec exec = kvsift::cuda::Exec::for_current_device(stream);
  exec.dependent_launch = dependent;
  std::size_t bytes = 0;
  REQUIRE(kvsift::compress_prompt_workspace_bytes(exec, c, shape, &bytes).ok());
  DeviceBuffer<unsigned char> ws(bytes);
  ws.poison();
  const std::size_t cache = std::size_t(batch) * heads * capacity * d;
  DeviceBuffer<T> src(kvq), written(kvq.size());
  written.poison();
  DeviceBuffer<std::int32_t> dlen(len), dst_len(std::vector<std::int32_t>(std::size_t(batch), c.capacity));
  DeviceBuffer<T> dk(std::size_t(batch) * heads * c.capacity * d), dv(dk.size());
  DeviceBuffer<std::int32_t> positions(std::size_t(batch) * heads * c.capacity), new_len{std::size_t(batch)};
  for (auto* b : {&dk, &dv}) b->poison();
  positions.poison();
  new_len.poison();
  const auto src_view = kvsift::make_bhsd(written.get(), written.get() + cache, batch, heads, capacity, d, dlen.get());
  const auto dst_view = kvsift::make_bhsd(dk.get(), dv.get(), batch, heads, c.capacity, d, dst_len.get());
  const auto q = kvsift::make_query_rows<T>(written.get() + 2 * cache, q_rows, q_heads, d);
  launch_late_copy(src.get(), written.get(), std::int64_t(kvq.size()), stream);
  REQUIRE(kvsift::compress_prompt(exec, c, shape, src_view, q, lse, dst_view,
                                  kvsift::CompactOutputs{new_len.get(), positions.get(), c.capacity},
                                  kvsift::Workspace{ws.get(), bytes})
              .ok());
  KVSIFT_TEST_CUDA(cudaStreamSynchronize(stream));
  std::vector<unsigned char> result;
  auto append = [&](const auto& v) {
    const auto* p = reinterpret_cast<const unsigned char*>(v.data());
    result.insert(result.end(), p, p + v.size() * sizeof(v[0]));
  };
  append(dk.download());
  append(dv.download());
  append(positions.download());
  append(new_len.download());
  KVSIFT_TEST_CUDA(cudaStreamDestroy(stream));
  return result;
}

}  // namespace

TEST_CASE("Exec::dependent_launch: compress_prompt (scores, clustering or pooling, top-k, compaction) waits for the kernel before it") {
  std::mt19937 rng(9);
  const int batch = 2, heads = 4, q_heads = 16, capacity = 700, d = 128, window = 16;
  const std::vector<std::int32_t> len{capacity, 513};
  const std::size_t cache = std::size_t(batch) * heads * capacity * d;
  using P = kvsift::CompressionPolicy;
  for (const P policy : {P::kClusterAttn, P::kSnapKV, P::kStreamingLLM, P::kH2OPrefill})
    for (const bool give_lse : {false, true}) {
      if (give_lse && policy != P::kClusterAttn) continue;
      INFO(kvsift::to_string(policy), give_lse ? ", with the log-sum-exp" : "");
      const int q_rows = policy == P::kH2OPrefill ? capacity : window;
      const auto kvq = random_rows<kvsift::bfloat16_t>(rng, 2 * cache + std::size_t(batch) * q_rows * q_heads * d);
      // Any finite log-sum-exps do for the comparison (both runs read the same ones).
      std::vector<float> lse_host(std::size_t(batch) * q_heads * window, 6.f);
      DeviceBuffer<float> lse(lse_host);
      const float* l = give_lse ? lse.get() : nullptr;
      const auto plain = compress_after_late_writer(false, policy, l, kvq, batch, heads, q_heads, capacity, d, q_rows, len);
      const auto dependent = compress_after_late_writer(true, policy, l, kvq, batch, heads, q_heads, capacity, d, q_rows, len);
      // The plain run compressed the written cache: each sequence keeps Cp = 128 tokens, and slot 0 of
      // head 0 holds K of the position it names.
      std::int32_t new_len[2], pos0 = 0;
      std::memcpy(new_len, plain.data() + plain.size() - sizeof(new_len), sizeof(new_len));
      REQUIRE(new_len[0] == 128);
      REQUIRE(new_len[1] == 128);
      const std::size_t kv_bytes = std::size_t(batch) * heads * 128 * d * sizeof(kvsift::bfloat16_t);
      std::memcpy(&pos0, plain.data() + 2 * kv_bytes, sizeof(pos0));
      REQUIRE(pos0 >= 0);
      REQUIRE(pos0 < capacity);
      REQUIRE(std::memcmp(plain.data(), &kvq[std::size_t(pos0) * d], d * sizeof(kvsift::bfloat16_t)) == 0);
      CHECK(dependent == plain);
    }
}

TEST_CASE("Exec::dependent_launch: store_kv waits for the kernel before it (the same bytes as a plain launch)") {
  if (cc_major() < 9) MESSAGE("no PDL before compute capability 9.0: both launches are plain");
  std::mt19937 rng(5);
  const int n = 37, heads = 8, d = 128, capacity = 64;
  const auto kin = random_rows<kvsift::bfloat16_t>(rng, std::size_t(n) * heads * d);
  const auto vin = random_rows<kvsift::bfloat16_t>(rng, kin.size());
  const auto plain = store_after_late_writer(false, kin, vin, n, heads, d, capacity);
  const auto dependent = store_after_late_writer(true, kin, vin, n, heads, d, capacity);
  // The plain launch stored the written rows (row i of head h at token i).
  for (int h = 0; h < heads; ++h)
    for (int i = 0; i < n; ++i)
      REQUIRE(std::memcmp(&plain[(std::size_t(h) * capacity + i) * d], &kin[(std::size_t(i) * heads + h) * d],
                          sizeof(kvsift::bfloat16_t) * d) == 0);
  CHECK(same_bytes(plain, dependent));
}

TEST_CASE("Exec::dependent_launch: decode_attention waits for the kernel before it (bf16 tensor-core and f32 paths, split and not)") {
  std::mt19937 rng(6);
  for (int capacity : {48, 4096}) {  // one chunk per head (no merge), and splits with a merge
    INFO("capacity ", capacity);
    check_decode<kvsift::bfloat16_t>(rng, capacity);
    check_decode<float>(rng, capacity);
  }
}

TEST_CASE("Exec::dependent_launch: topk waits for the kernel before it, on every kernel of its plan") {
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.f, 1.f);
  struct Shape { int rows, cols, k; };
  // The short-row select, the register select (256-thread groups of 8; 512-thread groups of 8), the
  // candidate select in CTA groups and the stream select (H200 plans).
  for (const Shape s : {Shape{8, 2048, 64}, Shape{8, 32768, 1024}, Shape{8, 131072, 4096}, Shape{48, 32768, 1024},
                        Shape{256, 32768, 512}}) {
    INFO("rows ", s.rows, ", cols ", s.cols);
    std::vector<float> scores(std::size_t(s.rows) * s.cols);
    for (float& x : scores) x = normal(rng);
    const auto plain = select_after_late_writer(false, scores, s.rows, s.cols, s.k);
    const auto dependent = select_after_late_writer(true, scores, s.rows, s.cols, s.k);
    // The plain launch selected the written rows: the host reference's indices and counts.
    std::vector<std::int32_t> idx(std::size_t(s.rows) * s.k), counts(std::size_t(s.rows));
    kvsift::TopKParams p;
    p.k = s.k;
    REQUIRE(kvsift::host::topk(kvsift::host::Exec{}, kvsift::make_strided_view<const float>(scores.data(), s.rows, s.cols), p,
                               kvsift::make_index_set(idx.data(), counts.data(), s.rows, s.k))
                .ok());
    idx.insert(idx.end(), counts.begin(), counts.end());
    REQUIRE(plain == idx);
    // Where they differ: the first entry (indices row-major, then the counts) and how many.
    std::size_t first = dependent.size(), differ = 0;
    for (std::size_t i = 0; i < dependent.size() && i < plain.size(); ++i)
      if (dependent[i] != plain[i]) {
        if (first == dependent.size()) first = i;
        ++differ;
      }
    INFO("entries differing: ", differ, "; the first at ", first, " (row ", first / std::size_t(s.k), ", slot ",
         first % std::size_t(s.k), "): ", (first < plain.size() ? plain[first] : 0), " plain, ",
         (first < dependent.size() ? dependent[first] : 0), " dependent");
    CHECK(dependent == plain);
  }
}

TEST_CASE("Exec::dependent_launch: a LycheeDecode layer (attention, row plan, top-k) waits for the kernel before it") {
  std::mt19937 rng(8);
  const int batch = 2, heads = 4, group = 4, d = 128, capacity = 3000;
  const std::size_t cache = std::size_t(batch) * heads * capacity * d;
  const auto k = random_rows<kvsift::bfloat16_t>(rng, cache), v = random_rows<kvsift::bfloat16_t>(rng, cache);
  const auto q = random_rows<kvsift::bfloat16_t>(rng, std::size_t(batch) * heads * group * d);
  const std::vector<std::int32_t> len{capacity, 1777};
  const auto plain = lycheedecode_after_late_writer(false, k, v, q, batch, heads, group, d, capacity, len);
  const auto dependent = lycheedecode_after_late_writer(true, k, v, q, batch, heads, group, d, capacity, len);
  // The plain launches attended the written queries: finite bf16 outputs of both layers.
  for (std::size_t i = 0; i < 2 * q.size(); ++i) REQUIRE((plain[i] & 0x7F80) != 0x7F80);
  CHECK(dependent == plain);
}
