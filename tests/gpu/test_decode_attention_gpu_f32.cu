// decode_attention on the GPU, fp32 K/V and queries (the CUDA-core kernel): the full case matrix,
// randomized adversarial index rows, split-boundary shapes, and issue 14's case 4.
#include "gpu/decode_attention_gpu_cases.cuh"

using decode_test::Case;
using decode_test::Layout;

TEST_CASE("decode_attention fp32: CUDA matches the host reference across the case matrix") {
  decode_test::run_matrix<float, float>(430);
}

TEST_CASE("decode_attention fp32: randomized shapes with adversarial index rows") {
  decode_test::run_random<float, float>(431, 40);
}

TEST_CASE("decode_attention fp32: shapes at the split boundaries, graph replay bit-identical") {
  decode_test::run_boundary<float, float>(432);
}

// Issue 14 case 4: one dense and one gathered KV head; the pre-fix plan covered max_len = 64
// positions (one block of 64) of the sparse row, so block 0 listed five times counted once: LSE
// 3.80 for 5.41 (ln 5 too small).
TEST_CASE("decode_attention fp32 regression: BSHD, mixed roles, duplicate blocks, num_sms 3") {
  auto rng = kvsift_test::make_rng(433);
  Case c;
  c.label = "issue 14 case 4";
  c.layout = Layout::kBSHD;
  c.cap = 64;
  c.d = 64;
  c.hkv = 2;
  c.group = 2;
  c.batch = 4;
  c.lengths = {43, 57, 1, 29};
  c.roles.set_sparse(1, true);
  c.gather = decode_test::Gather::kBlock;
  c.gather_block = 64;
  c.idx_cap = 5;
  c.max_kv_length = 0;
  c.num_sms = 3;
  c.idx = {0, 0, 0, 0, 0,    // row 0 (dense head): unused
           0, 0, 0, 0, 0,    // row 1: block 0 five times
           0, 0, 0, 0, 0,    // row 2 (dense)
           0, -1, 0, 1, 0,   // row 3 count 6 -> 5: three listings, -1 and block 1 (past the view) skipped
           0, 0, 0, 0, 0,    // row 4 (dense)
           1, 0, 0, 0, 0,    // row 5 count 2: block 0 after a block past the view
           0, 0, 0, 0, 0,    // row 6 (dense)
           2, 0, 0, 0, 0};   // row 7 count 3: two listings
  c.counts = {0, 5, 0, 6, 0, 2, 0, 3};
  decode_test::run_regression<float, float>(c, rng);
}
