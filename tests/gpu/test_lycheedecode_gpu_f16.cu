// LycheeDecode on the GPU with fp16 K/V: CUDA against the host policy (harness and the reason the
// index tables compare exactly: lycheedecode_gpu_cases.cuh).

#include "gpu/lycheedecode_gpu_cases.cuh"

using kvsift::half_t;
using kvsift::LycheeDecodeSelection;
using lycheedecode_test::Case;
using lycheedecode_test::Layout;

TEST_CASE("LycheeDecode fp16: token mode, paged cache") {
  Case c;
  c.layout = Layout::kPagedNHD;
  c.roles = "RRRR/RSRS/SSSS/SRSR";
  lycheedecode_test::run_case<half_t>(c, 851);
}

TEST_CASE("LycheeDecode fp16: ratio mode, contiguous cache") {
  Case c;
  c.selection = LycheeDecodeSelection::kRatio;
  c.rho = 0.6;
  c.steps = 4;
  lycheedecode_test::run_case<half_t>(c, 852);
}

TEST_CASE("LycheeDecode fp16: block mode, paged cache with 64-token pages, head_dim 128") {
  Case c;
  c.layout = Layout::kPagedNHD;
  c.page_size = 64;
  c.selection = LycheeDecodeSelection::kBlock;
  c.block_size = 64;
  c.num_blocks = 4;
  c.lengths = {640, 64, 0, 129};
  lycheedecode_test::run_case<half_t>(c, 853);
}

TEST_CASE("LycheeDecode fp16: head_dim 64, block mode 16, all-retrieval and all-sparse layers") {
  Case c;
  c.d = 64;
  c.roles = "RRRR/SSSS/RRRR/SSSS";
  c.selection = LycheeDecodeSelection::kBlock;
  c.block_size = 16;
  c.num_blocks = 10;
  lycheedecode_test::run_case<half_t>(c, 854);
}
