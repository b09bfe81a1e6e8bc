// decode_attention on the GPU, fp16 K/V and queries: the full case matrix.
#include "gpu/decode_attention_gpu_cases.cuh"

TEST_CASE("decode_attention fp16: CUDA matches the host reference across the case matrix") {
  decode_test::run_matrix<kvsift::half_t, kvsift::half_t>(420);
}
