// Greedy and nucleus sampling, log-softmax and KL (sampling.hpp).

#include "engine/sampling.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>

namespace minimal_decoder {

int argmax(const float* logits, int n) { return int(std::max_element(logits, logits + n) - logits); }

std::vector<double> log_softmax(const float* logits, int n, double temperature) {
  double m = -INFINITY;
  for (int i = 0; i < n; ++i) m = std::max(m, double(logits[i]) / temperature);
  double sum = 0;
  for (int i = 0; i < n; ++i) sum += std::exp(double(logits[i]) / temperature - m);
  std::vector<double> out(static_cast<std::size_t>(n));
  for (int i = 0; i < n; ++i) out[std::size_t(i)] = double(logits[i]) / temperature - m - std::log(sum);
  return out;
}

double kl_divergence(const float* p_logits, const float* q_logits, int n) {
  const std::vector<double> lp = log_softmax(p_logits, n), lq = log_softmax(q_logits, n);
  double kl = 0;
  for (int i = 0; i < n; ++i) kl += std::exp(lp[std::size_t(i)]) * (lp[std::size_t(i)] - lq[std::size_t(i)]);
  return std::max(0.0, kl);
}

int Sampler::next(const float* logits, int n) {
  if (opt_.temperature <= 0.f) return argmax(logits, n);
  const std::vector<double> lp = log_softmax(logits, n, opt_.temperature);
  std::vector<int> order(static_cast<std::size_t>(n));
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return lp[std::size_t(a)] > lp[std::size_t(b)]; });
  // The nucleus: the shortest prefix of the sorted tokens whose probability reaches top_p.
  double mass = 0;
  std::size_t keep = 0;
  while (keep < order.size() && (keep == 0 || mass < opt_.top_p)) mass += std::exp(lp[std::size_t(order[keep++])]);
  double u = std::uniform_real_distribution<double>(0.0, mass)(rng_);
  for (std::size_t i = 0; i < keep; ++i) {
    u -= std::exp(lp[std::size_t(order[i])]);
    if (u <= 0) return order[i];
  }
  return order[keep - 1];
}

}  // namespace minimal_decoder
