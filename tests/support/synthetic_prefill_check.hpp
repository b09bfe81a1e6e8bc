#pragma once
// The minimal decoder's --synthetic-prefill under each policy, on any backend (host and GPU tests):
// two sequences of 300 and 123 random tokens' K/V, then three decode steps. Include after doctest.

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "engine/decoder.hpp"
#include "support/decoder_test_helpers.hpp"

namespace decoder_test {

// Dense, ClusterAttn (Cp 48) and LycheeDecode over a `dtype` cache: the cache lengths after the fill
// (ClusterAttn's compressed) and after the steps, and every logit finite.
template <class Backend>
void check_synthetic_prefill(Backend& be, const minimal_decoder::ModelConfig& c,
                             const minimal_decoder::BackendWeights<Backend>& weights, minimal_decoder::KvDtype dtype) {
  namespace md = minimal_decoder;
  for (md::PolicyKind kind : {md::PolicyKind::kDense, md::PolicyKind::kClusterAttn, md::PolicyKind::kLycheeDecode}) {
    md::PolicyOptions p = test_policy(kind, 48, 32, 4, 8, 2);
    p.compression.window = 8;
    p.compression.num_block = 16;
    INFO("policy ", p.describe(), ", ", std::string(md::kv_dtype_name(dtype)));
    md::DecoderLimits lim;
    lim.max_batch = 2;
    lim.max_prompt_len = 300;
    lim.max_new_tokens = 4;
    lim.kv_dtype = dtype;
    md::Decoder<Backend> decoder(be, c, weights, p, lim);
    decoder.synthetic_prefill({300, 123}, 7);
    const int expect0 = kind == md::PolicyKind::kClusterAttn ? 48 : 300;
    CHECK(decoder.cache_lengths()[0] == expect0);
    for (int s = 0; s < 3; ++s) {
      const std::vector<float> logits = decoder.decode({std::int32_t(s), std::int32_t(s + 1)});
      for (float x : logits) REQUIRE(std::isfinite(x));
    }
    CHECK(decoder.cache_lengths()[0] == expect0 + 3);
  }
}

}  // namespace decoder_test
