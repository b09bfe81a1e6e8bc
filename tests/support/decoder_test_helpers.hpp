#pragma once
// Helpers of the minimal decoder's tests (host, GPU, role training): policy options at test sizes and
// the message of a DecoderError. Include after doctest.

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "engine/errors.hpp"
#include "engine/policy.hpp"

namespace decoder_test {

// A policy of `kind`: prompt compression keeps `capacity` tokens (window 4, theta 0.05, 8 blocks),
// LycheeDecode keeps `budget` tokens per row (`sink` and `recent` forced) and re-runs the last
// `correction` positions densely every `correction` steps (0 = never; LycheeDecode only).
inline minimal_decoder::PolicyOptions test_policy(minimal_decoder::PolicyKind kind, int capacity, int budget, int sink,
                                                  int recent, int correction = 0) {
  minimal_decoder::PolicyOptions p;
  p.kind = kind;
  p.compression.capacity = capacity;
  p.compression.window = 4;
  p.compression.theta = 0.05f;
  p.compression.num_block = 8;
  p.lycheedecode.budget = budget;
  p.lycheedecode.sink = sink;
  p.lycheedecode.recent = recent;
  p.lycheedecode.correction_interval = kind == minimal_decoder::PolicyKind::kLycheeDecode ? correction : 0;
  return p;
}

// Prompts of the given lengths, token ids uniform in [0, vocab), the same for the same seed.
inline std::vector<std::vector<std::int32_t>> random_prompts(const std::vector<int>& lengths, int vocab, unsigned seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> id(0, vocab - 1);
  std::vector<std::vector<std::int32_t>> out;
  for (int n : lengths) {
    std::vector<std::int32_t> p;
    for (int i = 0; i < n; ++i) p.push_back(id(rng));
    out.push_back(p);
  }
  return out;
}

// The message of the DecoderError `f` throws ("" if none).
template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const minimal_decoder::DecoderError& e) {
    return e.what();
  }
  return "";
}

}  // namespace decoder_test

// CHECK that evaluating `expr` throws a DecoderError whose message contains `text`.
#define CHECK_ERROR_CONTAINS(expr, text)                                          \
  do {                                                                            \
    const std::string message_ = decoder_test::error_of([&] { (void)(expr); });  \
    INFO("message: ", message_);                                                  \
    CHECK(message_.find(text) != std::string::npos);                              \
  } while (0)
