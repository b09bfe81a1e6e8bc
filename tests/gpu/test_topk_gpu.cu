// cuda::topk against host::topk with exact equality (the tie rule makes the answer unique): counts,
// positions and values, over random and adversarial inputs, every dtype, both key policies, every
// launch shape (one CTA per row, clusters, slices too large for shared memory), plus determinism and
// CUDA-graph capture and replay. Outputs are poisoned before every run.

#include <doctest/doctest.h>

#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "kvsift/ops/topk.cuh"
#include "kvsift/ops/topk_reference.hpp"
#include "support/device_buffer.cuh"
#include "support/random.hpp"

using kvsift::bfloat16_t;
using kvsift::half_t;
using kvsift_test::DeviceBuffer;

namespace {

enum class Fill { kRandom, kFewValues, kLeadingBits, kInfinities, kNaNs, kAscending };

float draw(std::mt19937_64& rng, Fill fill, int position) {
  const int u = kvsift_test::uniform_int(rng, 0, 15);
  const float inf = std::numeric_limits<float>::infinity();
  switch (fill) {
    case Fill::kRandom: return std::uniform_real_distribution<float>(-8.f, 8.f)(rng);
    case Fill::kFewValues: return float(u % 3) - 1.f;
    case Fill::kLeadingBits: return 1.0f + float(kvsift_test::uniform_int(rng, 0, 1 << 12)) * 1.2e-7f;
    case Fill::kInfinities: return u == 0 ? inf : (u == 1 ? -inf : float(u) * 0.25f);
    case Fill::kNaNs: return u < 4 ? std::numeric_limits<float>::quiet_NaN() : (u == 4 ? -inf : float(u) - 8.f);
    case Fill::kAscending: return float(position % 65536);
  }
  return 0.f;
}

struct Case {
  int rows = 1, cols = 1, stride_pad = 0, capacity = 1;
  kvsift::TopKParams params;
  std::vector<std::int32_t> lengths, per_row_k;
  Fill fill = Fill::kRandom;
  bool flagged = false;  // FlagFirstKey with random flags
};

template <class T>
struct Inputs {
  std::vector<T> scores;
  std::vector<std::uint8_t> flags;
  std::int64_t stride;
};

template <class T>
Inputs<T> make_inputs(std::mt19937_64& rng, const Case& c) {
  Inputs<T> in;
  in.stride = c.cols + c.stride_pad;
  in.scores.assign(std::size_t(std::max<std::int64_t>(c.rows * in.stride, 1)), kvsift::from_float<T>(3.f));
  for (int r = 0; r < c.rows; ++r)
    for (int i = 0; i < c.cols; ++i) in.scores[r * in.stride + i] = kvsift::from_float<T>(draw(rng, c.fill, i));
  if (c.flagged) {
    in.flags.resize(std::size_t(std::max(c.rows * c.cols, 1)));
    const int density = kvsift_test::uniform_int(rng, 1, 9);
    for (auto& f : in.flags) f = kvsift_test::uniform_int(rng, 0, 9) < density ? 1 : 0;
  }
  return in;
}

struct Result {
  std::vector<std::int32_t> indices, counts;
  std::vector<std::uint16_t> value_bits;  // values compared bitwise (NaN payloads included)
};

template <class T>
std::vector<std::uint16_t> bits_of(const std::vector<T>& v) {
  std::vector<std::uint16_t> b(v.size() * sizeof(T) / 2);
  if (!v.empty()) std::memcpy(b.data(), v.data(), v.size() * sizeof(T));
  return b;
}

// Host reference on host copies.
template <class T>
Result reference(const Case& c, const Inputs<T>& in) {
  Result r;
  r.indices.assign(std::size_t(c.rows) * c.capacity + 1, -1);
  r.counts.assign(std::size_t(c.rows), -1);
  std::vector<T> values(r.indices.size());
  kvsift::TopKParams p = c.params;
  p.lengths = c.lengths.empty() ? nullptr : c.lengths.data();
  p.per_row_k = c.per_row_k.empty() ? nullptr : c.per_row_k.data();
  const auto view = kvsift::make_strided_view<const T>(in.scores.data(), c.rows, c.cols, in.stride);
  const auto out = kvsift::make_index_set(r.indices.data(), r.counts.data(), c.rows, c.capacity);
  kvsift::Status st;
  if (c.flagged) {
    kvsift::FlagFirstKey<T> key;
    key.flags = in.flags.data();
    key.row_stride = c.cols;
    st = kvsift::host::topk(kvsift::host::Exec{}, view, p, out, values.data(), key);
  } else {
    st = kvsift::host::topk(kvsift::host::Exec{}, view, p, out, values.data());
  }
  REQUIRE_MESSAGE(st.ok(), st.to_string());
  r.value_bits = bits_of(values);
  return r;
}

// Device copies of one case's inputs and outputs.
template <class T>
struct DeviceCase {
  DeviceBuffer<T> scores;
  DeviceBuffer<std::uint8_t> flags;
  DeviceBuffer<std::int32_t> lengths, per_row_k, indices, counts;
  DeviceBuffer<T> values;
  DeviceCase(const Case& c, const Inputs<T>& in)
      : scores(in.scores), flags(in.flags), lengths(c.lengths), per_row_k(c.per_row_k),
        indices(std::size_t(c.rows) * c.capacity + 1), counts(std::size_t(c.rows)),
        values(std::size_t(c.rows) * c.capacity + 1) {}

  void poison() {
    indices.poison();
    counts.poison();
    values.poison();
  }
  kvsift::Status launch(const Case& c, std::int64_t stride, cudaStream_t stream) {
    kvsift::TopKParams p = c.params;
    p.lengths = c.lengths.empty() ? nullptr : lengths.get();
    p.per_row_k = c.per_row_k.empty() ? nullptr : per_row_k.get();
    const auto view = kvsift::make_strided_view<const T>(scores.get(), c.rows, c.cols, stride);
    const auto out = kvsift::make_index_set(indices.get(), counts.get(), c.rows, c.capacity);
    const auto exec = kvsift::cuda::Exec::for_current_device(stream);
    if (c.flagged) {
      kvsift::FlagFirstKey<T> key;
      key.flags = flags.get();
      key.row_stride = c.cols;
      return kvsift::cuda::topk(exec, view, p, out, values.get(), key);
    }
    return kvsift::cuda::topk(exec, view, p, out, values.get());
  }
  Result download() const {
    Result r;
    r.indices = indices.download();
    r.counts = counts.download();
    r.value_bits = bits_of(values.download());
    return r;
  }
};

// Compares the first counts[r] entries of every row (the rest of a row is documented as untouched).
void require_equal(const Case& c, const Result& want, const Result& got, int value_halfwords) {
  for (int r = 0; r < c.rows; ++r) {
    INFO("row ", r, " of ", c.rows, ", cols ", c.cols, ", capacity ", c.capacity);
    REQUIRE(got.counts[r] == want.counts[r]);
    for (int j = 0; j < want.counts[r]; ++j) {
      const std::size_t o = std::size_t(r) * c.capacity + j;
      if (got.indices[o] != want.indices[o]) {
        INFO("entry ", j);
        REQUIRE(got.indices[o] == want.indices[o]);
      }
      for (int h = 0; h < value_halfwords; ++h)
        REQUIRE(got.value_bits[o * value_halfwords + h] == want.value_bits[o * value_halfwords + h]);
    }
  }
}

template <class T>
void check_case(std::mt19937_64& rng, const Case& c) {
  const Inputs<T> in = make_inputs<T>(rng, c);
  const Result want = reference(c, in);
  DeviceCase<T> dev(c, in);
  dev.poison();
  const kvsift::Status st = dev.launch(c, in.stride, nullptr);
  REQUIRE_MESSAGE(st.ok(), st.to_string());
  kvsift_test::sync_and_check();
  require_equal(c, want, dev.download(), int(sizeof(T) / 2));
}

template <class T>
void check_all_fills(std::mt19937_64& rng, Case c) {
  for (Fill f : {Fill::kRandom, Fill::kFewValues, Fill::kLeadingBits, Fill::kInfinities, Fill::kNaNs, Fill::kAscending}) {
    c.fill = f;
    CAPTURE(int(f));
    check_case<T>(rng, c);
  }
}

Case shape(int rows, int cols, int capacity, int k) {
  Case c;
  c.rows = rows;
  c.cols = cols;
  c.capacity = capacity;
  c.params.k = k;
  return c;
}

}  // namespace

TEST_CASE("topk gpu: launch shapes x adversarial fills, fp32") {
  auto rng = kvsift_test::make_rng(401);
  check_all_fills<float>(rng, shape(3, 131072, 4096, 4096));   // cluster of 8, cached slices
  check_all_fills<float>(rng, shape(40, 32768, 2048, 1024));   // clusters of 4
  check_all_fills<float>(rng, shape(300, 2048, 64, 64));       // one CTA per row
  check_all_fills<float>(rng, shape(2, 600000, 2048, 2000));   // slices too large to cache: global passes
  Case odd = shape(5, 32771, 1500, 1500);                      // rows not 16-byte aligned: scalar loads
  odd.stride_pad = 3;
  check_all_fills<float>(rng, odd);
}

TEST_CASE("topk gpu: fp16 and bf16 inputs") {
  auto rng = kvsift_test::make_rng(402);
  check_all_fills<half_t>(rng, shape(4, 131072, 2048, 2048));
  check_all_fills<bfloat16_t>(rng, shape(4, 131072, 2048, 2048));
  check_all_fills<half_t>(rng, shape(64, 4099, 100, 77));
  check_all_fills<bfloat16_t>(rng, shape(64, 4099, 100, 77));
  check_case<__half>(rng, shape(8, 50000, 512, 512));
  check_case<__nv_bfloat16>(rng, shape(8, 50000, 512, 512));
}

TEST_CASE("topk gpu: k = 1, k = len, k > len, len = 0, ragged lengths, per-row k") {
  auto rng = kvsift_test::make_rng(403);
  Case c = shape(6, 70000, 70008, 1);
  c.lengths = {0, 1, 70000, 69999, 12345, 8};
  for (int k : {0, 1, 8, 12345, 69999, 70000, 70008}) {
    c.params.k = k;
    CAPTURE(k);
    check_case<float>(rng, c);
  }
  // Ragged batch with per-row k (some out of range: clamped to [0, capacity]).
  for (int trial = 0; trial < 6; ++trial) {
    Case r = shape(kvsift_test::uniform_int(rng, 1, 70), kvsift_test::uniform_int(rng, 1, 140000), 5000, 0);
    for (int i = 0; i < r.rows; ++i) {
      r.lengths.push_back(kvsift_test::uniform_int(rng, -5, r.cols + 5));
      r.per_row_k.push_back(kvsift_test::uniform_int(rng, -3, r.capacity + 100));
    }
    r.fill = trial % 2 ? Fill::kRandom : Fill::kFewValues;
    CAPTURE(trial);
    check_case<float>(rng, r);
  }
}

TEST_CASE("topk gpu: the row filter writes retrieval heads' rows only, in place") {
  // LycheeDecode's table: rows b * H + h; sparse heads' rows keep what an earlier layer wrote.
  auto rng = kvsift_test::make_rng(409);
  for (const Case& base : {shape(8 * 6, 32768, 1024, 1024), shape(3 * 8, 131072, 4096, 4096), shape(5 * 3, 2048, 64, 64)}) {
    Case c = base;
    c.params.num_kv_heads = c.rows % 8 == 0 ? 8 : 3;
    for (int h = 0; h < c.params.num_kv_heads; ++h) c.params.roles.set_sparse(h, h % 3 != 0);
    c.params.sink = 4;
    c.params.recent = 16;
    CAPTURE(c.rows);
    const Inputs<float> in = make_inputs<float>(rng, c);
    const Result want = reference(c, in);
    DeviceCase<float> dev(c, in);
    dev.poison();
    REQUIRE(dev.launch(c, in.stride, nullptr).ok());
    kvsift_test::sync_and_check();
    const Result got = dev.download();
    require_equal(c, want, got, 2);
    for (int r = 0; r < c.rows; ++r) {
      if (!kvsift::topk_skips_row(c.params, r)) {
        CHECK(got.counts[r] >= 0);
        continue;
      }
      INFO("skipped row ", r);
      REQUIRE(got.counts[r] == -1);  // the poison: not written
      for (int j = 0; j < c.capacity; ++j) REQUIRE(got.indices[std::size_t(r) * c.capacity + j] == -1);
    }
  }
}

TEST_CASE("topk gpu: forced sink and recent ranges, overlapping and exceeding the row") {
  auto rng = kvsift_test::make_rng(404);
  Case c = shape(7, 131072, 4096, 4096);
  c.lengths = {131072, 100000, 4000, 383, 200, 1, 0};
  for (auto sr : {std::pair<int, int>{128, 256}, {3000, 1000}, {0, 4096}, {4096, 0}, {17, 5}}) {
    c.params.sink = sr.first;
    c.params.recent = sr.second;
    for (int k : {0, 100, 384, 4096}) {
      c.params.k = k;
      CAPTURE(sr.first);
      CAPTURE(sr.second);
      CAPTURE(k);
      check_case<float>(rng, c);
    }
  }
}

TEST_CASE("topk gpu: composite keys (flag first, then score)") {
  auto rng = kvsift_test::make_rng(405);
  Case c = shape(5, 131072, 4096, 4096);
  c.flagged = true;
  c.lengths = {131072, 131000, 5000, 4096, 0};
  check_all_fills<float>(rng, c);      // 33-bit keys in uint64
  check_all_fills<bfloat16_t>(rng, c); // 17-bit keys in uint32
  check_case<half_t>(rng, c);
  Case small = shape(100, 3000, 512, 500);
  small.flagged = true;
  small.params.sink = 4;
  small.params.recent = 8;
  check_all_fills<float>(rng, small);
  Case huge = shape(1, 700000, 4096, 4096);  // uint64 keys not cached
  huge.flagged = true;
  check_case<float>(rng, huge);
  // Few rows of 32K uint64 keys: clusters of 8 with 32 KB slices, whose static + dynamic shared memory
  // passes the 48 KB default (the launch once failed with cudaErrorInvalidValue there).
  for (int rows : {1, 2, 8}) {
    Case mid = shape(rows, 32768, 992, 992);
    mid.flagged = true;
    check_case<float>(rng, mid);
  }
}

TEST_CASE("topk gpu: two runs give identical bits") {
  auto rng = kvsift_test::make_rng(406);
  Case c = shape(32, 131072, 4096, 4096);
  c.fill = Fill::kFewValues;
  const Inputs<float> in = make_inputs<float>(rng, c);
  DeviceCase<float> dev(c, in);
  dev.poison();
  REQUIRE(dev.launch(c, in.stride, nullptr).ok());
  kvsift_test::sync_and_check();
  const Result first = dev.download();
  dev.poison();
  REQUIRE(dev.launch(c, in.stride, nullptr).ok());
  kvsift_test::sync_and_check();
  const Result second = dev.download();
  CHECK(first.counts == second.counts);
  for (int r = 0; r < c.rows; ++r)
    for (int j = 0; j < first.counts[r]; ++j) REQUIRE(first.indices[r * c.capacity + j] == second.indices[r * c.capacity + j]);
  require_equal(c, reference(c, in), first, 2);
}

TEST_CASE("topk gpu: captured in a CUDA graph and replayed on new data") {
  auto rng = kvsift_test::make_rng(407);
  Case c = shape(16, 131072, 4096, 4096);
  c.params.sink = 128;
  c.params.recent = 256;
  c.lengths.resize(16);
  for (auto& l : c.lengths) l = kvsift_test::uniform_int(rng, 0, c.cols);
  Inputs<float> in = make_inputs<float>(rng, c);
  DeviceCase<float> dev(c, in);
  cudaStream_t stream;
  KVSIFT_TEST_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  cudaGraph_t graph;
  KVSIFT_TEST_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
  const kvsift::Status st = dev.launch(c, in.stride, stream);
  KVSIFT_TEST_CUDA(cudaStreamEndCapture(stream, &graph));
  REQUIRE_MESSAGE(st.ok(), st.to_string());
  cudaGraphExec_t exec;
  KVSIFT_TEST_CUDA(cudaGraphInstantiate(&exec, graph, 0));
  for (int replay = 0; replay < 3; ++replay) {
    // New scores and lengths in the same buffers: the graph must pick them up.
    for (auto& l : c.lengths) l = kvsift_test::uniform_int(rng, 0, c.cols);
    in = make_inputs<float>(rng, c);
    dev.scores.upload(in.scores);
    dev.lengths.upload(c.lengths);
    dev.poison();
    KVSIFT_TEST_CUDA(cudaGraphLaunch(exec, stream));
    KVSIFT_TEST_CUDA(cudaStreamSynchronize(stream));
    kvsift_test::sync_and_check();
    CAPTURE(replay);
    require_equal(c, reference(c, in), dev.download(), 2);
  }
  KVSIFT_TEST_CUDA(cudaGraphExecDestroy(exec));
  KVSIFT_TEST_CUDA(cudaGraphDestroy(graph));
  KVSIFT_TEST_CUDA(cudaStreamDestroy(stream));
}

TEST_CASE("topk gpu: bad parameters are reported before any launch") {
  DeviceBuffer<float> s(64);
  DeviceBuffer<std::int32_t> idx(32), count(2);
  kvsift::TopKParams p;
  p.k = -1;
  const auto st = kvsift::cuda::topk(kvsift::cuda::Exec::for_current_device(), kvsift::make_strided_view<const float>(s.get(), 2, 32), p,
                                     kvsift::make_index_set(idx.get(), count.get(), 2, 16));
  CHECK(st.code() == kvsift::StatusCode::kInvalidArgument);
  CHECK(st.message().find("k = -1") != std::string::npos);
  p.k = 1;
  const auto st2 = kvsift::cuda::topk(kvsift::cuda::Exec::for_current_device(), kvsift::make_strided_view<const float>(s.get(), 2, 32), p,
                                      kvsift::make_index_set(nullptr, count.get(), 2, 16));
  CHECK(st2.code() == kvsift::StatusCode::kNullPointer);
}
