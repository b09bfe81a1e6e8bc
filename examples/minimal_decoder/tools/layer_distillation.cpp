// The training targets of head-role training (layer_distillation.hpp), in double on the host.

#include "tools/layer_distillation.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

#include "engine/errors.hpp"

namespace minimal_decoder {

PromptDistiller::PromptDistiller(const DecodeShape& shape, int prompt_len, const TokenBudget& budget)
    : s_(shape), prompt_len_(prompt_len), budget_(budget) {
  if (s_.kv_heads < 1 || s_.q_heads % s_.kv_heads != 0 || s_.head_dim < 1 || s_.steps < 1 || prompt_len < 1)
    throw DecoderError("PromptDistiller: bad shape");
}

template <class Position>
void PromptDistiller::softmax_average(const std::vector<double>& logit, int count, Position pos, const float* v, float* out) {
  const int D = s_.head_dim;
  double mx = -std::numeric_limits<double>::infinity();
  for (int i = 0; i < count; ++i) mx = std::max(mx, logit[std::size_t(pos(i))]);
  acc_.assign(std::size_t(D), 0.0);
  double sum = 0;
  for (int i = 0; i < count; ++i) {
    const int t = pos(i);
    const double e = std::exp(logit[std::size_t(t)] - mx);
    sum += e;
    for (int d = 0; d < D; ++d) acc_[std::size_t(d)] += e * double(v[std::int64_t(t) * D + d]);
  }
  for (int d = 0; d < D; ++d) out[d] = float(acc_[std::size_t(d)] / sum);
}

void PromptDistiller::add_layer(const DecodeLayer& in) {
  const int Hq = s_.q_heads, Hkv = s_.kv_heads, D = s_.head_dim, S = s_.steps, G = Hq / Hkv;
  const int cols = prompt_len_ + S;
  if (in.capacity < cols) throw DecoderError("PromptDistiller: the cache holds fewer tokens than prompt + steps");
  const bool outputs = layers_ > 0;
  const double scale = 1.0 / std::sqrt(double(D));
  std::vector<float> scores(std::size_t(Hkv) * S * cols, 0.f);
  LayerOutputs out;
  if (outputs) {
    out.dense.assign(std::size_t(S) * Hq * D, 0.f);
    out.sparse.assign(out.dense.size(), 0.f);
  }
  std::vector<double> logit(static_cast<std::size_t>(cols)), mean(static_cast<std::size_t>(cols));
  std::vector<std::int32_t> selected;
  for (int j = 0; j < Hkv; ++j) {
    const float* k = in.k + std::int64_t(j) * in.capacity * D;
    const float* v = in.v + std::int64_t(j) * in.capacity * D;
    for (int s = 0; s < S; ++s) {
      const int n = prompt_len_ + s + 1;
      const std::int64_t row = (std::int64_t(j) * S + s) * cols;
      if (outputs) select_tokens(prev_scores_.data() + row, n, budget_, &selected);
      std::fill(mean.begin(), mean.end(), 0.0);
      for (int g = 0; g < G; ++g) {
        const int h = j * G + g;
        const float* q = in.q + (std::int64_t(s) * Hq + h) * D;
        for (int t = 0; t < n; ++t) {
          double dot = 0;
          for (int d = 0; d < D; ++d) dot += double(q[d]) * double(k[std::int64_t(t) * D + d]);
          logit[std::size_t(t)] = dot * scale;
          mean[std::size_t(t)] += dot / G;
        }
        if (!outputs) continue;
        const std::int64_t o = (std::int64_t(s) * Hq + h) * D;
        softmax_average(logit, n, [](int i) { return i; }, v, out.dense.data() + o);
        softmax_average(logit, int(selected.size()), [&](int i) { return int(selected[std::size_t(i)]); }, v,
                        out.sparse.data() + o);
      }
      for (int t = 0; t < n; ++t) scores[std::size_t(row + t)] = float(mean[std::size_t(t)]);
    }
  }
  prev_scores_.swap(scores);
  if (outputs) targets_.push_back(std::move(out));
  ++layers_;
}

}  // namespace minimal_decoder
