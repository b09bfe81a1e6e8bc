// examples/minimal_decoder's tensor parallelism on GPU ranks (one thread per GPU, NCCL all-reduces;
// engine/tensor_parallel_decoder.hpp, engine/cuda/nccl_all_reduce.hpp): one rank through the
// tensor-parallel path (NCCL set up over one GPU) gives the unsharded decoder's logits bit for bit,
// graph-replayed steps included; with two GPUs, two ranks follow one for dense, ClusterAttn and
// LycheeDecode on a ragged batch (logits within fp32 summation-order tolerance, the same greedy
// tokens). Without two GPUs the second case says so and checks nothing; without NCCL in the build the
// file says so.

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <vector>

// kvsift's CUDA launchers before the engine: this file calls the decoders' members itself
// (engine/cuda/cuda_engine.hpp says why).
#include <kvsift/kvsift.cuh>

#include "engine/checkpoint.hpp"
#include "engine/cuda/cuda_engine.hpp"
#include "support/decoder_test_helpers.hpp"

#ifdef MINIMAL_DECODER_NCCL
#include "engine/cuda/nccl_all_reduce.hpp"
#include "engine/tensor_parallel_decoder.hpp"

namespace md = minimal_decoder;

namespace {

md::ModelConfig tp_config() {
  md::ModelConfig c;
  c.name = "gpu-tp-test";
  c.vocab_size = 96;
  c.hidden_size = 128;
  c.intermediate_size = 256;
  c.num_layers = 3;
  c.num_q_heads = 4;
  c.num_kv_heads = 2;
  c.head_dim = 64;
  c.max_positions = 4096;
  return c;
}

md::DecoderLimits tp_limits() {
  md::DecoderLimits lim;
  lim.max_batch = 3;
  lim.max_prompt_len = 70;
  lim.max_new_tokens = 17;
  lim.prefill_chunk = 16;
  return lim;
}

int argmax(const float* x, int n) { return int(std::max_element(x, x + n) - x); }

}  // namespace

TEST_CASE("tensor parallel on GPUs: one rank through the tensor-parallel path is the decoder, bit for bit") {
  const md::ModelConfig c = tp_config();
  const md::HostWeights w = md::random_weights(c, 41);
  const auto prompts = decoder_test::random_prompts({70, 41, 9}, c.vocab_size, 42);
  md::CudaBackend plain_be(0);
  const md::BackendWeights<md::CudaBackend> weights(plain_be, c, w);
  for (bool graph : {true, false}) {
    INFO("graph steps ", graph);
    md::Decoder<md::CudaBackend> plain(plain_be, c, weights, md::PolicyOptions(), tp_limits());
    plain.set_graph_steps(graph);
    plain.set_attention_timing(false);
    md::CudaBackend rank_be(0);
    std::vector<md::CudaBackend*> ranks = {&rank_be};
    md::NcclAllReduce comm(ranks);
    md::TensorParallelDecoder<md::CudaBackend, md::NcclAllReduce> tp(ranks, comm, c, w, md::PolicyOptions(), tp_limits());
    tp.set_graph_steps(graph);
    tp.set_attention_timing(false);
    std::vector<float> want = plain.prefill(prompts), got = tp.prefill(prompts);
    for (int step = 0; step < 16; ++step) {
      REQUIRE(got == want);
      std::vector<std::int32_t> next;
      for (int b = 0; b < 3; ++b) next.push_back(argmax(want.data() + std::int64_t(b) * c.vocab_size, c.vocab_size));
      want = plain.decode(next);
      got = tp.decode(next);
    }
    CHECK(got == want);
  }
}

TEST_CASE("tensor parallel on GPUs: two ranks decode like one (dense, ClusterAttn, LycheeDecode)") {
  int count = 0;
  REQUIRE(cudaGetDeviceCount(&count) == cudaSuccess);
  if (count < 2) {
    MESSAGE("skipped: one GPU here; two ranks need two GPUs (NCCL refuses two ranks on one device)");
    return;
  }
  const md::ModelConfig c = tp_config();
  const md::HostWeights w = md::random_weights(c, 43);
  const auto prompts = decoder_test::random_prompts({70, 41, 9}, c.vocab_size, 44);
  md::PolicyOptions lychee = decoder_test::test_policy(md::PolicyKind::kLycheeDecode, 0, 24, 2, 4);
  lychee.lycheedecode.roles = {1, 1, 0, 1, 1, 0};
  lychee.lycheedecode.roles_name = "test roles";
  const md::PolicyOptions policies[] = {md::PolicyOptions(), decoder_test::test_policy(md::PolicyKind::kClusterAttn, 32, 0, 0, 0),
                                        lychee};
  md::CudaBackend one_be(0);
  const md::BackendWeights<md::CudaBackend> weights(one_be, c, w);
  md::CudaBackend be0(0), be1(1);
  std::vector<md::CudaBackend*> ranks = {&be0, &be1};
  md::NcclAllReduce comm(ranks);
  const int V = c.vocab_size;
  for (const md::PolicyOptions& policy : policies) {
    INFO("policy ", policy.describe());
    one_be.make_current();
    md::Decoder<md::CudaBackend> one(one_be, c, weights, policy, tp_limits());
    md::TensorParallelDecoder<md::CudaBackend, md::NcclAllReduce> tp(ranks, comm, c, w, policy, tp_limits());
    one_be.make_current();
    std::vector<float> want = one.prefill(prompts);
    std::vector<float> got = tp.prefill(prompts);
    int compared = 0, agreed = 0;
    for (int step = 0; step <= 16; ++step) {
      double diff = 0, scale = 0;
      for (std::size_t i = 0; i < want.size(); ++i) {
        diff = std::max(diff, double(std::abs(got[i] - want[i])));
        scale = std::max(scale, double(std::abs(want[i])));
      }
      INFO("step ", step);
      CHECK(diff <= 1e-3 * (1 + scale));
      if (step == 16) break;
      std::vector<std::int32_t> next;
      for (int b = 0; b < 3; ++b) {
        const float* row = want.data() + std::int64_t(b) * V;
        next.push_back(argmax(row, V));
        std::vector<float> sorted(row, row + V);
        std::partial_sort(sorted.begin(), sorted.begin() + 2, sorted.end(), std::greater<float>());
        if (sorted[0] - sorted[1] > 1e-2f) {
          ++compared;
          agreed += argmax(got.data() + std::int64_t(b) * V, V) == next.back();
        }
      }
      one_be.make_current();
      want = one.decode(next);
      got = tp.decode(next);
    }
    CHECK(agreed == compared);
  }
}

#else

TEST_CASE("tensor parallel on GPUs: not built (this build found no NCCL)") {
  MESSAGE("the minimal decoder was built without NCCL: --tp runs CPU ranks only");
}

#endif
