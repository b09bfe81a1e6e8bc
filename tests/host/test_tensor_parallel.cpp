// examples/minimal_decoder sharded over N CPU ranks (engine/tensor_parallel.hpp): the shard
// arithmetic on the llama3-8b shape and its errors; sharded weights reassemble into the model's; and
// a TensorParallelDecoder over 2 and 4 ranks (4: each KV head replicated on two ranks) against the
// unsharded decoder on the same prompts, for dense, ClusterAttn and LycheeDecode, a ragged batch:
// logits within fp32 summation-order tolerance and the same greedy tokens over 32 steps. The device
// random weights' layout (random_device_layout.hpp): a rank's blocks are the slices shard_weights
// takes, at the unsharded streams and scales, and one rank's layout is the unsharded generator's.

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "engine/checkpoint.hpp"
#include "engine/host_all_reduce.hpp"
#include "engine/host_engine.hpp"
#include "engine/random_device_layout.hpp"
#include "engine/tensor_parallel.hpp"
#include "engine/tensor_parallel_decoder.hpp"
#include "support/decoder_test_helpers.hpp"

namespace md = minimal_decoder;

namespace {

md::ModelConfig small_config() {
  md::ModelConfig c;
  c.vocab_size = 50;  // not a multiple of 4: the vocabulary slices are uneven
  c.hidden_size = 96;
  c.intermediate_size = 80;
  c.num_layers = 3;
  c.num_q_heads = 4;
  c.num_kv_heads = 2;
  c.head_dim = 64;
  c.rms_norm_eps = 1e-5f;
  c.rope_theta = 10000.f;
  c.max_positions = 4096;
  return c;
}

using decoder_test::random_prompts;

int argmax(const float* x, int n) { return int(std::max_element(x, x + n) - x); }

// The gap between the two largest values: below it, a different summation order may pick the other.
float top2_gap(const float* x, int n) {
  std::vector<float> v(x, x + n);
  std::partial_sort(v.begin(), v.begin() + 2, v.end(), std::greater<float>());
  return v[0] - v[1];
}

}  // namespace

TEST_CASE("tensor parallel: the shard arithmetic of llama3-8b over 1, 2, 4, 8 and 16 ranks") {
  const md::ModelConfig c = md::named_model_config("llama3-8b");
  for (int n : {1, 2, 4, 8, 16}) {
    CAPTURE(n);
    int q = 0, vocab = 0, inter = 0;
    std::vector<int> kv_owners(std::size_t(c.num_kv_heads), 0);
    for (int r = 0; r < n; ++r) {
      const md::TensorParallelShard s = md::tensor_parallel_shard(c, n, r);
      CHECK(s.first_q_head == q);
      q += s.q_heads;
      CHECK(s.first_vocab == vocab);
      vocab += s.vocab;
      CHECK(s.first_intermediate == inter);
      inter += s.intermediate;
      for (int h = s.first_kv_head; h < s.first_kv_head + s.kv_heads; ++h) ++kv_owners[std::size_t(h)];
      // A rank's query heads all belong to its KV heads (GQA groups of num_q / num_kv).
      const int group = c.num_q_heads / c.num_kv_heads;
      CHECK(s.first_q_head / group >= s.first_kv_head);
      CHECK((s.first_q_head + s.q_heads - 1) / group < s.first_kv_head + s.kv_heads);
      const md::ModelConfig local = s.config(c);
      CHECK(local.num_q_heads % local.num_kv_heads == 0);
      CHECK(local.hidden_size == c.hidden_size);
      CHECK(local.vocab_size == c.vocab_size);  // the embedding stays whole
    }
    CHECK(q == c.num_q_heads);
    CHECK(vocab == c.vocab_size);
    CHECK(inter == c.intermediate_size);
    for (int owners : kv_owners) CHECK(owners == std::max(1, n / c.num_kv_heads));
  }
  md::ModelConfig odd = small_config();
  odd.num_q_heads = 6;
  CHECK_ERROR_CONTAINS(md::tensor_parallel_shard(odd, 4, 0), "--tp 4: num_attention_heads = 6 is not a multiple of the ranks");
  odd.num_q_heads = 6;  // 6 q heads, 2 KV heads over 3 ranks: the KV heads cannot be split or replicated
  CHECK_ERROR_CONTAINS(md::tensor_parallel_shard(odd, 3, 0), "num_key_value_heads = 2 must be a multiple of the ranks");
  odd = small_config();
  odd.intermediate_size = 90;
  CHECK_ERROR_CONTAINS(md::tensor_parallel_shard(odd, 4, 1), "intermediate_size = 90 is not a multiple of the ranks");
  CHECK_ERROR_CONTAINS(md::tensor_parallel_shard(small_config(), 0, 0), "the number of ranks must be >= 1");
}

TEST_CASE("tensor parallel: the ranks' weights reassemble into the model's") {
  const md::ModelConfig c = small_config();
  const md::HostWeights w = md::random_weights(c, 3);
  const int n = 2, H = c.hidden_size, D = c.head_dim;
  std::vector<md::HostWeights> parts;
  std::vector<md::TensorParallelShard> shards;
  for (int r = 0; r < n; ++r) {
    shards.push_back(md::tensor_parallel_shard(c, n, r));
    parts.push_back(md::shard_weights(w, c, shards.back()));
  }
  std::vector<float> lm, wq, wk, gate;
  for (int r = 0; r < n; ++r) {
    lm.insert(lm.end(), parts[std::size_t(r)].lm_head.begin(), parts[std::size_t(r)].lm_head.end());
    wq.insert(wq.end(), parts[std::size_t(r)].layers[1].wq.begin(), parts[std::size_t(r)].layers[1].wq.end());
    wk.insert(wk.end(), parts[std::size_t(r)].layers[1].wk.begin(), parts[std::size_t(r)].layers[1].wk.end());
    gate.insert(gate.end(), parts[std::size_t(r)].layers[1].w_gate.begin(), parts[std::size_t(r)].layers[1].w_gate.end());
    CHECK(parts[std::size_t(r)].embed == w.embed);
  }
  CHECK(lm == w.lm_head);
  CHECK(wq == w.layers[1].wq);
  CHECK(wk == w.layers[1].wk);
  CHECK(gate == w.layers[1].w_gate);
  // Row-parallel matrices: rank r holds columns [first, first + count) of every row.
  const int Q = c.num_q_heads * D, I = c.intermediate_size;
  for (int row = 0; row < H; ++row)
    for (int r = 0; r < n; ++r) {
      const auto& s = shards[std::size_t(r)];
      for (int j = 0; j < s.q_heads * D; ++j)
        REQUIRE(parts[std::size_t(r)].layers[2].wo[std::size_t(row) * s.q_heads * D + j] ==
                w.layers[2].wo[std::size_t(row) * Q + s.first_q_head * D + j]);
      for (int j = 0; j < s.intermediate; ++j)
        REQUIRE(parts[std::size_t(r)].layers[2].w_down[std::size_t(row) * s.intermediate + j] ==
                w.layers[2].w_down[std::size_t(row) * I + s.first_intermediate + j]);
    }
}

namespace {

// Host weights of `c` whose every element is its own flat index in its tensor (exact in float for
// tensors below 2^24 elements), the norms ones: what shard_weights keeps of them names the positions.
md::HostWeights index_weights(const md::ModelConfig& c) {
  auto indices = [](std::int64_t n) {
    REQUIRE(n < (std::int64_t(1) << 24));
    std::vector<float> v(static_cast<std::size_t>(n));
    for (std::int64_t i = 0; i < n; ++i) v[std::size_t(i)] = float(i);
    return v;
  };
  const std::int64_t H = c.hidden_size, I = c.intermediate_size, V = c.vocab_size;
  md::HostWeights w;
  w.embed = indices(V * H);
  w.lm_head = w.embed;  // tied or not, the same positions
  w.final_norm.assign(std::size_t(H), 1.f);
  w.layers.resize(std::size_t(c.num_layers));
  for (md::LayerWeights& l : w.layers) {
    l.attn_norm = l.mlp_norm = w.final_norm;
    l.wq = indices(c.q_dim() * H);
    l.wk = l.wv = indices(c.kv_dim() * H);
    l.wo = indices(H * c.q_dim());
    l.w_gate = l.w_up = indices(I * H);
    l.w_down = indices(H * I);
  }
  return w;
}

// A rank's random tensor against the unsharded one and the slice shard_weights took of the index
// weights: the same stream and scale, and element i drawn at the full tensor's index slice[i]. The
// kernel's draw is a function of (stream, index) alone (cuda_kernels.cuh, hashed_normal), so equal
// streams and indices are equal values.
void check_block(const char* name, const md::RandomTensor& mine, const md::RandomTensor& whole,
                 const std::vector<float>& slice, std::int64_t rows, std::int64_t cols) {
  INFO(name);
  CHECK(mine.seed == whole.seed);
  CHECK(mine.scale == whole.scale);
  CHECK(mine.block.rows == rows);
  CHECK(mine.block.cols == cols);
  std::vector<float> drawn_at(static_cast<std::size_t>(mine.block.elements()));
  for (std::size_t i = 0; i < drawn_at.size(); ++i) drawn_at[i] = float(mine.block.global_index(std::int64_t(i)));
  CHECK(drawn_at == slice);
}

}  // namespace

TEST_CASE("tensor parallel: a rank's device-random blocks are its slices of the unsharded tensors") {
  CHECK(md::TensorBlock::col_range(3, 10, 4, 2).global_index(3) == 1 * 10 + 4 + 1);  // row 1, column 4 + 1
  CHECK(md::TensorBlock::row_range(2, 3, 7).global_index(8) == (2 + 1) * 7 + 1);
  md::ModelConfig tied = small_config();
  tied.tie_word_embeddings = true;
  for (const md::ModelConfig& c : {md::named_model_config("tiny"), small_config(), tied}) {
    CAPTURE(c.vocab_size);
    CAPTURE(c.tie_word_embeddings);
    const std::uint64_t seed = 7;
    const md::RandomDeviceLayout whole = md::random_device_layout(c, seed, md::tensor_parallel_shard(c, 1, 0));
    // One rank is the unsharded generator (the numbers of --random llama3-8b without --tp): one
    // stream per matrix, in order, from seed * 0x100000001b3; whole matrices (element i at index i);
    // 1 / sqrt(fan_in) but the embedding.
    std::uint64_t stream = seed * 0x100000001b3ull;
    CHECK(whole.embed.seed == ++stream);
    CHECK(whole.embed.scale == 1.f);
    CHECK(whole.lm_head.seed == (c.tie_word_embeddings ? stream : ++stream));
    CHECK(whole.lm_head.scale == (c.tie_word_embeddings ? 1.f : 1.f / std::sqrt(float(c.hidden_size))));
    for (const auto& l : whole.layers)
      for (const md::RandomTensor* t : {&l.wq, &l.wk, &l.wv, &l.wo, &l.w_gate, &l.w_up, &l.w_down}) {
        CHECK(t->seed == ++stream);
        CHECK(t->scale == 1.f / std::sqrt(float(t->block.cols)));
        CHECK((t->block.row0 == 0 && t->block.col0 == 0 && t->block.cols == t->block.full_cols));
      }
    const md::HostWeights iw = index_weights(c);
    for (int n : {1, 2, 4}) {
      for (int r = 0; r < n; ++r) {
        CAPTURE(n);
        CAPTURE(r);
        const md::TensorParallelShard s = md::tensor_parallel_shard(c, n, r);
        const md::ModelConfig local = s.config(c);
        const md::RandomDeviceLayout mine = md::random_device_layout(c, seed, s);
        const md::HostWeights sliced = md::shard_weights(iw, c, s);
        const std::int64_t H = c.hidden_size, Q = local.q_dim(), K = local.kv_dim(), I = local.intermediate_size;
        check_block("embed", mine.embed, whole.embed, sliced.embed, c.vocab_size, H);
        check_block("lm_head", mine.lm_head, whole.lm_head, sliced.lm_head, s.vocab, H);
        REQUIRE(mine.layers.size() == whole.layers.size());
        for (std::size_t l = 0; l < mine.layers.size(); ++l) {
          CAPTURE(l);
          const auto &m = mine.layers[l], &w = whole.layers[l];
          const md::LayerWeights& x = sliced.layers[l];
          check_block("wq", m.wq, w.wq, x.wq, Q, H);
          check_block("wk", m.wk, w.wk, x.wk, K, H);
          check_block("wv", m.wv, w.wv, x.wv, K, H);
          check_block("wo", m.wo, w.wo, x.wo, H, Q);
          check_block("w_gate", m.w_gate, w.w_gate, x.w_gate, I, H);
          check_block("w_up", m.w_up, w.w_up, x.w_up, I, H);
          check_block("w_down", m.w_down, w.w_down, x.w_down, H, I);
        }
      }
    }
  }
}

TEST_CASE("tensor parallel: 2 and 4 CPU ranks decode like one (dense, ClusterAttn, LycheeDecode; 4 ranks dense)") {
  const md::ModelConfig c = small_config();
  const md::HostWeights hw = md::random_weights(c, 21);
  md::HostBackend be;
  const md::BackendWeights<md::HostBackend> weights(be, c, hw);
  const auto prompts = random_prompts({57, 40, 23}, c.vocab_size, 22);  // ragged
  md::DecoderLimits lim;
  lim.max_batch = 3;
  lim.max_prompt_len = 57;
  lim.max_new_tokens = 33;
  lim.prefill_chunk = 16;
  // LycheeDecode with learned-like roles: a retrieval head in layer 0 (both heads) and in layer 2
  // (head 1 only), so each rank of 2 has its own chain of retrieval and sparse heads.
  md::PolicyOptions lychee = decoder_test::test_policy(md::PolicyKind::kLycheeDecode, 0, 24, 2, 4);
  lychee.lycheedecode.roles = {1, 1, 0, 0, 0, 1};
  lychee.lycheedecode.roles_name = "test roles";
  const md::PolicyOptions policies[] = {decoder_test::test_policy(md::PolicyKind::kDense, 0, 0, 0, 0),
                                        decoder_test::test_policy(md::PolicyKind::kClusterAttn, 24, 0, 0, 0), lychee};
  const int V = c.vocab_size, steps = 32;
  for (const md::PolicyOptions& policy : policies) {
    for (int ranks : {1, 2, 4}) {
      INFO("policy ", policy.describe(), ", ranks ", ranks);
      if (ranks == 4 && policy.kind != md::PolicyKind::kDense) {
        // 4 ranks replicate the 2 KV heads, which splits their query groups: refused for the
        // policies that score a KV head with its group.
        std::vector<md::HostBackend> four(4);
        std::vector<md::HostBackend*> p4 = {&four[0], &four[1], &four[2], &four[3]};
        md::HostAllReduce comm4(4);
        CHECK_ERROR_CONTAINS((md::TensorParallelDecoder<md::HostBackend, md::HostAllReduce>(p4, comm4, c, hw, policy, lim)),
                             "replicates each of the 2 KV heads on 2 ranks");
        continue;
      }
      md::Decoder<md::HostBackend> again(be, c, weights, policy, lim);
      std::vector<float> want = again.prefill(prompts);
      std::vector<md::HostBackend> backends(static_cast<std::size_t>(ranks));
      std::vector<md::HostBackend*> bp;
      for (auto& b : backends) bp.push_back(&b);
      md::HostAllReduce comm(ranks);
      md::TensorParallelDecoder<md::HostBackend, md::HostAllReduce> tp(bp, comm, c, hw, policy, lim);
      std::vector<float> got = tp.prefill(prompts);
      int compared = 0, agreed = 0;
      for (int step = 0; step <= steps; ++step) {
        REQUIRE(got.size() == want.size());
        double max_diff = 0, max_ref = 0;
        for (std::size_t i = 0; i < got.size(); ++i) {
          max_diff = std::max(max_diff, double(std::abs(got[i] - want[i])));
          max_ref = std::max(max_ref, double(std::abs(want[i])));
        }
        INFO("step ", step);
        // With one rank the path is the unsharded decoder's, bit for bit; with several, the o and
        // down projections add their parts in another order (fp32).
        if (ranks == 1)
          CHECK(got == want);
        else
          CHECK(max_diff <= 1e-4 * (1 + max_ref));
        if (step == steps) break;
        // Teacher forcing with the unsharded decoder's greedy tokens; both must pick them wherever
        // the choice is not a near tie.
        std::vector<std::int32_t> next;
        for (int b = 0; b < 3; ++b) {
          const float* w = want.data() + std::int64_t(b) * V;
          next.push_back(argmax(w, V));
          if (top2_gap(w, V) > 1e-3f) {
            ++compared;
            agreed += argmax(got.data() + std::int64_t(b) * V, V) == next.back();
          }
        }
        want = again.decode(next);
        got = tp.decode(next);
      }
      CHECK(agreed == compared);
      CHECK(compared >= 3 * steps * 9 / 10);
    }
  }
}

TEST_CASE("tensor parallel: a rank's error reaches the caller, and no rank waits for it") {
  const md::ModelConfig c = small_config();
  const md::HostWeights hw = md::random_weights(c, 5);
  md::DecoderLimits lim;
  lim.max_batch = 2;
  lim.max_prompt_len = 20;
  lim.max_new_tokens = 4;
  std::vector<md::HostBackend> backends(2);
  std::vector<md::HostBackend*> bp = {&backends[0], &backends[1]};
  md::HostAllReduce two(2);
  md::TensorParallelDecoder<md::HostBackend, md::HostAllReduce> tp(bp, two, c, hw,
                                                                   decoder_test::test_policy(md::PolicyKind::kDense, 0, 0, 0, 0), lim);
  (void)tp.prefill(random_prompts({20, 11}, c.vocab_size, 6));
  CHECK_ERROR_CONTAINS(tp.decode({3, c.vocab_size}), "sequence 1: token id 50 outside the vocabulary [0, 50)");
  CHECK_ERROR_CONTAINS(tp.decode({3}), "decode needs one token per sequence");
  CHECK(tp.decode({3, 4}).size() == std::size_t(2) * c.vocab_size);  // still usable: the checks come first
  // An all-reduce whose other rank gave up throws instead of waiting.
  md::HostAllReduce comm(2);
  comm.abort();
  float x = 1.f;
  CHECK_ERROR_CONTAINS(comm.all_reduce(0, &x, 1), "another rank failed");
}

TEST_CASE("tensor parallel: generate over 2 CPU ranks gives generate's tokens, --check included") {
  const md::ModelConfig c = small_config();
  const md::HostWeights hw = md::random_weights(c, 31);
  md::HostBackend be;
  const md::BackendWeights<md::HostBackend> weights(be, c, hw);
  for (md::PolicyKind kind : {md::PolicyKind::kDense, md::PolicyKind::kLycheeDecode}) {
    md::GenerationRequest req;
    req.prompts = random_prompts({33, 18}, c.vocab_size, 32);
    req.new_tokens = 10;
    req.prefill_chunk = 8;
    req.check = true;
    req.policy = decoder_test::test_policy(kind, 0, 12, 2, 4);
    INFO("policy ", req.policy.describe());
    const md::GenerationReport one = md::generate(be, c, weights, req);
    std::vector<md::HostBackend> backends(2);
    std::vector<md::HostBackend*> ranks = {&backends[0], &backends[1]};
    md::HostAllReduce comm(2);
    const md::GenerationReport two = md::generate_tensor_parallel(ranks, comm, c, hw, req);
    CHECK(one.ranks == 1);
    CHECK(two.ranks == 2);
    CHECK(one.all_reduce_ms() == 0);  // one rank: no all-reduce; two: timed with the attention (on)
    CHECK(two.all_reduce_ms() > 0);
    CHECK(two.generated == one.generated);
    CHECK(two.compared == one.compared);
    CHECK(two.top1_agree == one.top1_agree);
    CHECK(std::abs(two.kl_max - one.kl_max) <= 1e-5);
    CHECK(two.kv_bytes_used == one.kv_bytes_used);  // the ranks' caches add up to the whole
    CHECK(two.step_bytes.size() == one.step_bytes.size());
  }
}
