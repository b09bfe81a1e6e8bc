// decode_attention on the GPU, fp16 K/V and queries: the full case matrix, randomized adversarial
// index rows, split-boundary shapes, and issue 14's case 2.
#include "gpu/decode_attention_gpu_cases.cuh"

using decode_test::Case;
using decode_test::Layout;
using kvsift::half_t;

TEST_CASE("decode_attention fp16: CUDA matches the host reference across the case matrix") {
  decode_test::run_matrix<half_t, half_t>(420);
}

TEST_CASE("decode_attention fp16: randomized shapes with adversarial index rows") {
  decode_test::run_random<half_t, half_t>(421, 40);
}

TEST_CASE("decode_attention fp16: shapes at the split boundaries, graph replay bit-identical") {
  decode_test::run_boundary<half_t, half_t>(422);
}

// Issue 14 case 2: a view of 64 tokens, block 64, capacity 3: the pre-fix plan covered one entry per
// row, so a row whose in-range block 0 sits after an out-of-range entry returned 0 (at [b 1, q head
// 8]: row 9 = [1, 0, 0]; block 1 lies past the view).
TEST_CASE("decode_attention fp16 regression: paged NHD, G 8, in-range blocks after out-of-range entries") {
  auto rng = kvsift_test::make_rng(423);
  Case c;
  c.label = "issue 14 case 2";
  c.layout = Layout::kPagedNHD;
  c.page_size = 64;
  c.cap = 64;
  c.d = 128;
  c.hkv = 8;
  c.group = 8;
  c.batch = 2;
  c.lengths = {37, 55};
  c.roles = kvsift::HeadRoleMask::all_sparse(8);
  c.gather = decode_test::Gather::kBlock;
  c.gather_block = 64;
  c.idx_cap = 3;
  c.max_kv_length = 0;
  const std::int32_t kMax = std::numeric_limits<std::int32_t>::max();
  c.idx = {0, 1, 0,        //  0: block 0 twice
           1, 0, 5,        //  1
           -1, -1, 0,      //  2
           0, 0, 0,        //  3 count 0
           0, 0, 0,        //  4 count 1000 -> 3
           1 << 26, 0, 0,  //  5 count 2: 2^26 * 64 = 2^32 wraps to 0 in 32 bits
           2, 0, 0,        //  6 count -1
           0, 2, 0,        //  7 count 2
           0, 0, 0,        //  8
           1, 0, 0,        //  9: [b 1, h 1] = q heads 8..15
           -3, 0, 1,       // 10
           5, 1, 0,        // 11
           0, 1, 2,        // 12 count 2
           1, 1, 1,        // 13: nothing visible
           kMax, 0, 0,     // 14 count 2
           0, 0, 0};       // 15 count -7
  c.counts = {3, 3, 3, 0, 1000, 2, -1, 2, 3, 3, 3, 3, 2, 3, 2, -7};
  decode_test::run_regression<half_t, half_t>(c, rng);
}
