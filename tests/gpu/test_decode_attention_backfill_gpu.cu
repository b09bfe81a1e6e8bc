// decode_attention on the GPU with the split plan's backfill built in (KVSIFT_DECODE_BACKFILL=1, set for
// this target only; the library's default leaves it off until measured): grids of more blocks than one
// wave, the retrieval blocks first in the grid's linear order, the sparse heads in short splits.

#include "gpu/decode_attention_gpu_cases.cuh"

static_assert(kvsift::detail::kDecodeBackfill, "this test builds the backfill in (tests/CMakeLists.txt)");

TEST_CASE("decode_attention bf16: backfilling grids (retrieval blocks first, short sparse splits), graph replay bit-identical") {
  decode_test::run_backfill<kvsift::bfloat16_t, kvsift::bfloat16_t>(418);
}

TEST_CASE("decode_attention fp16: backfilling grids (retrieval blocks first, short sparse splits), graph replay bit-identical") {
  decode_test::run_backfill<kvsift::half_t, kvsift::half_t>(424);
}

TEST_CASE("decode_attention bf16: the case matrix and random shapes with the backfill built in") {
  decode_test::run_matrix<kvsift::bfloat16_t, kvsift::bfloat16_t>(419);
  decode_test::run_random<kvsift::bfloat16_t, kvsift::bfloat16_t>(417, 40);
}
