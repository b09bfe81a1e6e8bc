// decode_attention on the GPU, bf16 K/V: the full case matrix, fp32 queries over a bf16 cache, a
// user-defined view, CUDA-graph replay with new lengths, and the launcher's own checks.

#include "gpu/decode_attention_gpu_cases.cuh"

using decode_test::Case;
using decode_test::Layout;
using kvsift::bfloat16_t;

namespace {

// A user view (not a kvsift type): BSHD addressing written by hand, so the generic row path runs.
struct UserKV {
  using value_type = bfloat16_t;
  bfloat16_t* k;
  bfloat16_t* v;
  int batch, num_kv_heads, head_dim, capacity;
  const std::int32_t* lengths;
  KVSIFT_HD bfloat16_t* k_row(int b, int h, int t) const {
    return k + ((std::int64_t(b) * capacity + t) * num_kv_heads + h) * head_dim;
  }
  KVSIFT_HD bfloat16_t* v_row(int b, int h, int t) const {
    return v + ((std::int64_t(b) * capacity + t) * num_kv_heads + h) * head_dim;
  }
  KVSIFT_HD int length(int b) const { return lengths[b] < capacity ? lengths[b] : capacity; }
  kvsift::Status validate() const { return kvsift::Status(); }
};

}  // namespace

TEST_CASE("decode_attention bf16: CUDA matches the host reference across the case matrix") {
  decode_test::run_matrix<bfloat16_t, bfloat16_t>(410);
}

TEST_CASE("decode_attention bf16: randomized shapes with adversarial index rows") {
  decode_test::run_random<bfloat16_t, bfloat16_t>(414, 40);
}

TEST_CASE("decode_attention bf16: shapes at the split boundaries, graph replay bit-identical") {
  decode_test::run_boundary<bfloat16_t, bfloat16_t>(415);
}

TEST_CASE("decode_attention bf16: heads at the most splits the plan gives, graph replay bit-identical") {
  decode_test::run_many_splits<bfloat16_t, bfloat16_t>(416);
}

TEST_CASE("decode_attention bf16: score candidates in a cluster plan, a retrieval head with empty splits") {
  decode_test::run_clustered_candidates<bfloat16_t, bfloat16_t>(417);
}

// Issue 14, "A defect to fix first", case 1: before 9b81d59 the split plan covered only the first
// max_len = 64 positions of a sparse row (2 blocks of 32), so a row whose in-range block comes after
// out-of-range or duplicate entries lost it: output 0 at [b 3, h 1] (row 13 = [1, -1, 0]: block 1 is
// past the 6 tokens of b 3, -1 is negative, block 0 is in range at slot 2).
TEST_CASE("decode_attention bf16 regression: paged NHD, block-gathered rows with in-range blocks after out-of-range ones") {
  auto rng = kvsift_test::make_rng(416);
  Case c;
  c.label = "issue 14 case 1";
  c.layout = Layout::kPagedNHD;
  c.page_size = 64;
  c.cap = 64;
  c.d = 256;
  c.hkv = 4;
  c.group = 1;
  c.batch = 4;
  c.lengths = {6, 9, 4, 6};
  c.roles = kvsift::HeadRoleMask::all_sparse(4);
  c.gather = decode_test::Gather::kBlock;
  c.gather_block = 32;
  c.idx_cap = 4;
  c.max_kv_length = 0;
  c.num_sms = 1;
  const std::int32_t kMax = std::numeric_limits<std::int32_t>::max(), kMin = std::numeric_limits<std::int32_t>::min();
  c.idx = {0, 0,    0,       0,   //  0 count -2: nothing (the slots are in-range decoys)
           0, 1,    0,       0,   //  1 count 0
           0, 0,    0,       0,   //  2 count -1
           1, 0,    0,       0,   //  3: past the end, then block 0 twice
           2, 0,    -1,      0,   //  4 count 7 -> 4
           0, 1,    0,       0,   //  5 count 2
           kMax, 1, 0,       0,   //  6
           0, 0,    0,       0,   //  7 count 1
           -1, 1 << 27, 3,   0,   //  8 count 5 -> 4: 2^27 * 32 = 2^32 wraps to 0 in 32 bits
           0, 0,    0,       0,   //  9
           1, 0,    0,       0,   // 10 count 2
           0, kMin, 0,       2,   // 11
           0, 1,    0,       1,   // 12 count 9 -> 4
           1, -1,   0,       0,   // 13 count 3: [b 3, h 1]
           -5, 0,   0,       0,   // 14 count 2
           2, 1,    1,       0};  // 15
  c.counts = {-2, 0, -1, 3, 7, 2, 4, 1, 5, 3, 2, 4, 9, 3, 2, 4};
  decode_test::run_regression<bfloat16_t, bfloat16_t>(c, rng);
}

// Issue 14 case 3: max_kv_length 52 below every length; the pre-fix plan covered 52 positions of a
// sparse row (the first 52 tokens of its first entry), so a row listing block 0 eight times had an
// LSE ln 8 too small (4.22 for 6.30). Mixed roles, causal q_len 3.
TEST_CASE("decode_attention bf16 regression: BHSD, duplicate blocks, max_kv_length below the lengths, q_len 3") {
  auto rng = kvsift_test::make_rng(417);
  Case c;
  c.label = "issue 14 case 3";
  c.layout = Layout::kBHSD;
  c.cap = 1152;
  c.d = 128;
  c.hkv = 8;
  c.group = 4;
  c.batch = 3;
  c.q_len = 3;
  c.lengths = {1107, 112, 669};
  for (int h : {1, 2, 3, 5, 6, 7}) c.roles.set_sparse(h, true);
  c.gather = decode_test::Gather::kBlock;
  c.gather_block = 64;
  c.idx_cap = 8;
  c.max_kv_length = 52;
  const std::vector<std::int32_t> variants[4] = {
      {0, 0, 0, 0, 0, 0, 0, 0},     // block 0 eight times
      {0, 3, 0, 17, 0, -1, 0, 0},   // duplicates between entries past max_kv_length
      {1, 0, 0, 0, 0, 0, 0, 0},     // block 1 is inside the cache but past max_kv_length; count 12 -> 8
      {0, 0, 5, 0, 0, 0, 0, 0}};    // count 3: two listings of block 0, the rest decoys
  const std::int32_t variant_counts[4] = {8, 8, 12, 3};
  for (int r = 0; r < c.batch * c.hkv; ++r) {
    const int v = r % 4;
    c.idx.insert(c.idx.end(), variants[v].begin(), variants[v].end());
    c.counts.push_back(c.roles.is_sparse(r % c.hkv) ? variant_counts[v] : -1);
  }
  decode_test::run_regression<bfloat16_t, bfloat16_t>(c, rng);
}

TEST_CASE("decode_attention bf16 K/V with float queries") {
  auto rng = kvsift_test::make_rng(411);
  Case c;
  c.lengths = std::vector<std::int32_t>{200, 17, 1};
  c.batch = 3;
  c.score_block = 64;
  c.roles.set_sparse(0, true);
  c.gather = decode_test::Gather::kToken;
  c.num_sms = 5;
  decode_test::run_case<bfloat16_t, float>(c, rng);
}

TEST_CASE("decode_attention bf16 through a user-defined view") {
  auto rng = kvsift_test::make_rng(412);
  Case c;
  c.lengths = std::vector<std::int32_t>{200, 0, 77};
  c.q_len = 3;
  c.score_block = 1;
  c.num_sms = 4;
  c.max_kv_length = c.cap;
  const decode_test::Cache<bfloat16_t> cache(rng, c);
  decode_test::run_case_with<bfloat16_t, bfloat16_t>(
      c, rng, cache, [&](bfloat16_t* k, bfloat16_t* v, const std::int32_t*, const std::int32_t* len) {
        UserKV kv{k, v, c.batch, c.hkv, c.d, c.cap, len};
        return kv;
      });
}

TEST_CASE("decode_attention replays from a CUDA graph with new lengths") {
  auto rng = kvsift_test::make_rng(413);
  const int B = 2, H = 2, G = 4, D = 128, S = 300;
  auto kh = kvsift_test::random_values<bfloat16_t>(rng, std::size_t(B) * H * S * D);
  auto vh = kvsift_test::random_values<bfloat16_t>(rng, kh.size());
  auto qh = kvsift_test::random_values<bfloat16_t>(rng, std::size_t(B) * H * G * D);
  std::vector<std::int32_t> len_a = {300, 5}, len_b = {42, 299};
  kvsift_test::DeviceBuffer<bfloat16_t> k(kh), v(kh.size()), q(qh), out(qh.size());
  v.upload(vh);
  kvsift_test::DeviceBuffer<std::int32_t> len(len_a);
  const auto kv = kvsift::make_bhsd(k.get(), v.get(), B, H, S, D, len.get());
  const auto p = kvsift::make_decode_attention_params(q.get(), out.get(), 1, H * G, D);
  cudaStream_t stream;
  KVSIFT_TEST_CUDA(cudaStreamCreate(&stream));
  const auto on_stream = kvsift::cuda::Exec::for_current_device(stream);
  std::size_t bytes = 0;
  REQUIRE(kvsift::decode_attention_workspace_bytes(on_stream, kv, p, &bytes).ok());
  kvsift_test::DeviceBuffer<unsigned char> ws(bytes);

  cudaGraph_t graph;
  KVSIFT_TEST_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  const auto st = kvsift::cuda::decode_attention(on_stream, kv, p, kvsift::Workspace{ws.get(), bytes});
  KVSIFT_TEST_CUDA(cudaStreamEndCapture(stream, &graph));
  REQUIRE_MESSAGE(st.ok(), st.to_string());
  cudaGraphExec_t exec;
  KVSIFT_TEST_CUDA(cudaGraphInstantiate(&exec, graph, 0));
  for (const auto& lens : {len_a, len_b}) {
    len.upload(lens);
    out.poison();
    KVSIFT_TEST_CUDA(cudaGraphLaunch(exec, stream));
    KVSIFT_TEST_CUDA(cudaStreamSynchronize(stream));
    std::vector<bfloat16_t> ref(qh.size());
    const auto hkv = kvsift::make_bhsd(kh.data(), vh.data(), B, H, S, D, lens.data());
    REQUIRE(kvsift::host::decode_attention(kvsift::host::Exec{}, hkv,
                                           kvsift::make_decode_attention_params(qh.data(), ref.data(), 1, H * G, D))
                .ok());
    const auto got = out.download();
    for (std::size_t i = 0; i < got.size(); ++i)
      REQUIRE(decode_test::close(kvsift::to_float(got[i]), kvsift::to_float(ref[i]), 2e-2));
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
}

TEST_CASE("decode_attention CUDA launcher: a call with one split per head needs no workspace") {
  std::vector<std::int32_t> lh = {4};
  // Written inputs: the kernel runs, and initcheck tracks what it reads.
  auto rng = kvsift_test::make_rng(31);
  kvsift_test::DeviceBuffer<bfloat16_t> k(kvsift_test::random_values<bfloat16_t>(rng, 4 * 128)),
      q(kvsift_test::random_values<bfloat16_t>(rng, 4 * 128)), out(4 * 128);
  kvsift_test::DeviceBuffer<std::int32_t> len(lh);
  const auto kv = kvsift::make_bhsd(k.get(), k.get(), 1, 1, 4, 128, len.get());
  const auto p = kvsift::make_decode_attention_params(q.get(), out.get(), 1, 4, 128);
  const auto exec = kvsift::cuda::Exec::for_current_device();
  std::size_t bytes = 1;
  REQUIRE(kvsift::decode_attention_workspace_bytes(exec, kv, p, &bytes).ok());
  CHECK(bytes == 0);
  CHECK(kvsift::cuda::decode_attention(exec, kv, p).ok());
  CHECK(cudaDeviceSynchronize() == cudaSuccess);
}

TEST_CASE("decode_attention CUDA launcher rejects a small or missing workspace") {
  // 64K tokens of one head split over many blocks, so the call needs partials and the merge kernel.
  constexpr int kCap = 65536;
  std::vector<std::int32_t> lh = {kCap};
  kvsift_test::DeviceBuffer<bfloat16_t> k(std::size_t(kCap) * 128), q(4 * 128), out(4 * 128);
  kvsift_test::DeviceBuffer<std::int32_t> len(lh);
  const auto kv = kvsift::make_bhsd(k.get(), k.get(), 1, 1, kCap, 128, len.get());
  const auto p = kvsift::make_decode_attention_params(q.get(), out.get(), 1, 4, 128);
  const auto exec = kvsift::cuda::Exec::for_current_device();
  std::size_t bytes = 0;
  REQUIRE(kvsift::decode_attention_workspace_bytes(exec, kv, p, &bytes).ok());
  REQUIRE(bytes > 0);
  kvsift_test::DeviceBuffer<unsigned char> ws(bytes);
  auto st = kvsift::cuda::decode_attention(exec, kv, p, kvsift::Workspace{ws.get(), bytes - 1});
  CHECK(st.code() == kvsift::StatusCode::kInsufficientSpace);
  CHECK(st.message().find("workspace.bytes = ") != std::string::npos);
  st = kvsift::cuda::decode_attention(exec, kv, p, kvsift::Workspace{nullptr, bytes});
  CHECK(st.code() == kvsift::StatusCode::kNullPointer);
  CHECK(st.message() == "workspace.data (ask decode_attention_workspace_bytes) is null");
  // An Exec without device facts is refused with a message that says how to make one.
  st = kvsift::cuda::decode_attention(kvsift::cuda::Exec{}, kv, p, kvsift::Workspace{ws.get(), bytes});
  CHECK(st.code() == kvsift::StatusCode::kInvalidArgument);
  CHECK(st.message().find("Exec::for_current_device") != std::string::npos);
  auto misaligned = kv;
  misaligned.k_token_stride = 130;
  misaligned.k_head_stride = 4 * 130;
  st = kvsift::cuda::decode_attention(exec, misaligned, p, kvsift::Workspace{ws.get(), bytes});
  CHECK(st.code() == kvsift::StatusCode::kMisaligned);
}

TEST_CASE("decode_attention CUDA launcher names bad fp8 scale layouts") {
  std::vector<std::int32_t> lh = {4};
  kvsift_test::DeviceBuffer<kvsift::fp8_e4m3_t> k(4 * 128);
  kvsift_test::DeviceBuffer<bfloat16_t> q(4 * 128), out(4 * 128);
  kvsift_test::DeviceBuffer<float> scales(std::vector<float>{1.f});
  kvsift_test::DeviceBuffer<std::int32_t> len(lh);
  auto kv = kvsift::make_bhsd(k.get(), k.get(), 1, 1, 4, 128, len.get());
  const auto p = kvsift::make_decode_attention_params(q.get(), out.get(), 1, 4, 128);
  const auto exec = kvsift::cuda::Exec::for_current_device();
  // No scales at all: an fp8 view cannot be dequantized.
  auto st = kvsift::cuda::decode_attention(exec, kv, p);
  CHECK(st.code() == kvsift::StatusCode::kNullPointer);
  CHECK(st.message().find("kv.scales.k") != std::string::npos);
  // Per-head scales carrying a token stride were built for the other granularity.
  kv.scales = kvsift::make_per_head_scales(scales.get(), scales.get());
  kv.scales.token_stride = 1;
  st = kvsift::cuda::decode_attention(exec, kv, p);
  CHECK(st.code() == kvsift::StatusCode::kInvalidArgument);
  CHECK(st.message().find("kv.scales.token_stride") != std::string::npos);
  // A V scale pointer missing alone is named too.
  kv.scales = kvsift::make_per_head_scales(scales.get(), nullptr);
  st = kvsift::cuda::decode_attention(exec, kv, p);
  CHECK(st.code() == kvsift::StatusCode::kNullPointer);
  CHECK(st.message().find("kv.scales.v") != std::string::npos);
}
