#pragma once
// Choosing the next token from logits, and the measures --check reports between two logit vectors.

#include <cstdint>
#include <random>
#include <vector>

namespace minimal_decoder {

struct SamplingOptions {
  float temperature = 0.f;  // 0: greedy (argmax, ties to the lower id)
  float top_p = 1.f;        // nucleus: sample among the most likely tokens whose mass reaches top_p
  std::uint64_t seed = 0;
};

int argmax(const float* logits, int n);

std::vector<double> log_softmax(const float* logits, int n, double temperature = 1.0);

// KL(p || q) of the softmaxes of two logit vectors, in nats (p: the reference, here dense).
double kl_divergence(const float* p_logits, const float* q_logits, int n);

class Sampler {
 public:
  explicit Sampler(const SamplingOptions& o) : opt_(o), rng_(o.seed) {}
  int next(const float* logits, int n);

 private:
  SamplingOptions opt_;
  std::mt19937_64 rng_;
};

}  // namespace minimal_decoder
