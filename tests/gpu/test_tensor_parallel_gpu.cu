// examples/minimal_decoder's tensor parallelism on GPU ranks (one thread per GPU, NCCL all-reduces;
// engine/tensor_parallel_decoder.hpp, engine/cuda/nccl_all_reduce.hpp): one rank through the
// tensor-parallel path (NCCL set up over one GPU) gives the unsharded decoder's logits bit for bit,
// graph-replayed steps included, on host weights and on device-random weights generated per rank;
// with two GPUs, two ranks follow one for dense, ClusterAttn and LycheeDecode on a ragged batch
// (logits within fp32 summation-order tolerance, the same greedy tokens). Without two GPUs the
// second case says so and checks nothing. The device-random shards of 2 and 4 ranks (generated on
// one GPU, rank by rank) are the slices of the unsharded random weights, bit for bit; that case needs
// no NCCL, the others say so without it.

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

// kvsift's CUDA launchers before the engine: this file calls the decoders' members itself
// (engine/cuda/cuda_engine.hpp says why).
#include <kvsift/kvsift.cuh>

#include "engine/checkpoint.hpp"
#include "engine/cuda/cuda_engine.hpp"
#include "engine/tensor_parallel.hpp"
#include "support/decoder_test_helpers.hpp"
#include "support/tool_scale.hpp"

#ifdef MINIMAL_DECODER_NCCL
#include "engine/cuda/nccl_all_reduce.hpp"
#include "engine/tensor_parallel_decoder.hpp"
#include "engine/tensor_parallel_weights.hpp"
#endif

namespace md = minimal_decoder;

namespace {

// A device matrix's bf16 values as floats, exactly (a bf16 is the top half of its float's bits).
std::vector<float> host_matrix(const md::CudaBackend::Matrix& m) {
  std::vector<std::uint16_t> bits(std::size_t(m.rows) * std::size_t(m.cols));
  REQUIRE(bits.size() == m.data.size());
  REQUIRE(cudaMemcpy(bits.data(), m.data.data(), bits.size() * sizeof(std::uint16_t), cudaMemcpyDeviceToHost) == cudaSuccess);
  std::vector<float> out(bits.size());
  for (std::size_t i = 0; i < bits.size(); ++i) {
    const std::uint32_t f = std::uint32_t(bits[i]) << 16;
    std::memcpy(&out[i], &f, sizeof f);
  }
  return out;
}

std::vector<float> host_vector(const md::DeviceBuffer<float>& v) {
  std::vector<float> out(v.size());
  REQUIRE(cudaMemcpy(out.data(), v.data(), out.size() * sizeof(float), cudaMemcpyDeviceToHost) == cudaSuccess);
  return out;
}

// Device weights back on the host, in HostWeights' layout (norms included), for shard_weights.
md::HostWeights host_copy(const md::BackendWeights<md::CudaBackend>& w, bool qk_norm) {
  md::HostWeights h;
  h.embed = host_matrix(w.embed);
  h.lm_head = host_matrix(w.lm_head);
  h.final_norm = host_vector(w.final_norm);
  for (const auto& l : w.layers) {
    md::LayerWeights o;
    o.attn_norm = host_vector(l.attn_norm);
    o.mlp_norm = host_vector(l.mlp_norm);
    if (qk_norm) o.q_norm = host_vector(l.q_norm), o.k_norm = host_vector(l.k_norm);
    o.wq = host_matrix(l.wq);
    o.wk = host_matrix(l.wk);
    o.wv = host_matrix(l.wv);
    o.wo = host_matrix(l.wo);
    o.w_gate = host_matrix(l.w_gate);
    o.w_up = host_matrix(l.w_up);
    o.w_down = host_matrix(l.w_down);
    h.layers.push_back(std::move(o));
  }
  return h;
}

// The same bits (not only equal values: a -0 against a +0 fails).
bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

}  // namespace

TEST_CASE("tensor parallel on GPUs: device-random shards of 2 and 4 ranks are slices of the unsharded weights, bit for bit") {
  const md::ModelConfig c = md::named_model_config("tiny");  // 2 KV heads: over 4 ranks each on two
  md::CudaBackend be(0);
  const md::HostWeights whole = host_copy(md::random_device_weights(be, c, 11), c.qk_norm);
  for (int n : {2, 4}) {
    for (int r = 0; r < n; ++r) {
      INFO("rank ", r, " of ", n);
      const md::TensorParallelShard s = md::tensor_parallel_shard(c, n, r);
      const md::HostWeights want = md::shard_weights(whole, c, s);
      const md::HostWeights got = host_copy(md::random_device_weights(be, c, 11, s), c.qk_norm);
      CHECK(same_bits(got.embed, want.embed));
      CHECK(same_bits(got.lm_head, want.lm_head));
      CHECK(same_bits(got.final_norm, want.final_norm));
      REQUIRE(got.layers.size() == want.layers.size());
      for (std::size_t l = 0; l < got.layers.size(); ++l) {
        INFO("layer ", l);
        const md::LayerWeights &g = got.layers[l], &w = want.layers[l];
        CHECK(same_bits(g.attn_norm, w.attn_norm));
        CHECK(same_bits(g.mlp_norm, w.mlp_norm));
        CHECK(same_bits(g.wq, w.wq));
        CHECK(same_bits(g.wk, w.wk));
        CHECK(same_bits(g.wv, w.wv));
        CHECK(same_bits(g.wo, w.wo));
        CHECK(same_bits(g.w_gate, w.w_gate));
        CHECK(same_bits(g.w_up, w.w_up));
        CHECK(same_bits(g.w_down, w.w_down));
      }
    }
  }
}

#ifdef MINIMAL_DECODER_NCCL

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

// The prefill and 16 greedy decode steps of `tp` give `plain`'s logits bit for bit.
template <class Plain, class Tp>
void require_same_steps(Plain& plain, Tp& tp, const std::vector<std::vector<std::int32_t>>& prompts, int vocab) {
  std::vector<float> want = plain.prefill(prompts), got = tp.prefill(prompts);
  // Under a sanitizer 4 steps: the first records the step's graph, the others replay it.
  for (int step = 0, steps = kvsift_test::repetitions(16, 4); step < steps; ++step) {
    REQUIRE(got == want);
    std::vector<std::int32_t> next;
    for (std::size_t b = 0; b < prompts.size(); ++b) next.push_back(argmax(want.data() + std::int64_t(b) * vocab, vocab));
    want = plain.decode(next);
    got = tp.decode(next);
  }
  CHECK(got == want);
}

}  // namespace

TEST_CASE("tensor parallel on GPUs: one rank through the tensor-parallel path is the decoder, bit for bit") {
  const md::ModelConfig c = tp_config();
  const md::HostWeights w = md::random_weights(c, 41);
  const auto prompts = decoder_test::random_prompts({70, 41, 9}, c.vocab_size, 42);
  md::CudaBackend plain_be(0);
  const md::BackendWeights<md::CudaBackend> weights(plain_be, c, w);
  for (bool graph : {true, false}) {
    if (!graph && kvsift_test::under_tool()) continue;  // a sanitizer: direct launches run the graph's kernels
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
    require_same_steps(plain, tp, prompts, c.vocab_size);
  }
}

TEST_CASE("tensor parallel on GPUs: one rank on device-random weights generated for its shard is the decoder, bit for bit") {
  // The weights --tp N --random llama3-8b runs on (each rank generates its shard on its GPU), at the
  // tiny shape: one rank's "shard" is the whole model, generated the unsharded way.
  const md::ModelConfig c = md::named_model_config("tiny");
  const auto prompts = decoder_test::random_prompts({70, 41, 9}, c.vocab_size, 46);
  md::CudaBackend plain_be(0);
  const md::BackendWeights<md::CudaBackend> weights = md::random_device_weights(plain_be, c, 45);
  md::CudaBackend rank_be(0);
  std::vector<md::CudaBackend*> ranks = {&rank_be};
  md::NcclAllReduce comm(ranks);
  const md::TensorParallelWeights<md::CudaBackend> shards(
      ranks, c, [&](const md::CudaBackend& be, const md::TensorParallelShard& s) { return md::random_device_weights(be, c, 45, s); });
  for (bool graph : {true, false}) {
    if (!graph && kvsift_test::under_tool()) continue;  // a sanitizer: direct launches run the graph's kernels
    INFO("graph steps ", graph);
    plain_be.make_current();
    md::Decoder<md::CudaBackend> plain(plain_be, c, weights, md::PolicyOptions(), tp_limits());
    plain.set_graph_steps(graph);
    plain.set_attention_timing(false);
    md::TensorParallelDecoder<md::CudaBackend, md::NcclAllReduce> tp(comm, shards, md::PolicyOptions(), tp_limits());
    tp.set_graph_steps(graph);
    tp.set_attention_timing(false);
    require_same_steps(plain, tp, prompts, c.vocab_size);
  }
  // And through the decode loop the command line runs (generate_tensor_parallel over the shards, the
  // --check reference sharing them): generate's tokens and logits.
  md::GenerationRequest req;
  req.prompts = prompts;
  req.new_tokens = kvsift_test::repetitions(12, 4);
  req.prefill_chunk = 16;
  req.keep_logits = true;
  req.check = true;
  req.time_attention = false;
  const md::GenerationReport one = md::generate(plain_be, c, weights, req);
  const md::GenerationReport tp = md::generate_tensor_parallel(comm, shards, req);
  CHECK(tp.ranks == 1);
  CHECK(tp.generated == one.generated);
  CHECK(tp.prefill_logits == one.prefill_logits);
  CHECK(tp.step_logits == one.step_logits);
  CHECK(tp.top1_agree == tp.compared);
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
