// decode_attention on the GPU, fp32 K/V and queries (the CUDA-core kernel): the full case matrix.
#include "gpu/decode_attention_gpu_cases.cuh"

TEST_CASE("decode_attention fp32: CUDA matches the host reference across the case matrix") {
  decode_test::run_matrix<float, float>(430);
}
