#pragma once
// The targets of head-role training (gate_training.hpp), from one prompt's dense decode: for every
// layer l >= 1 and decode step s (n = prompt + s + 1 keys, the decode token included),
//   O_dense[s, h]   softmax(q_h . k / sqrt(D)) V over all n keys of layer l;
//   O_sparse[s, h]  the same over only the tokens that LycheeDecode's token mode selects for KV head
//                   j = h / G from layer l-1's *dense* group-mean scores (1/G) sum_g q_g . k
//                   (select_tokens: sink and recent forced, the rest of the budget by score).
// Layer l-1's selection is the one LycheeDecode's training mixes in (specs/lycheedecode.md §6.2: the
// sparse mask of layer l comes from layer l-1's full attention); at inference a sparse head reads the
// latest retrieval head of its index, which is layer l-1's whenever that head is a retrieval head.
//
// Why layer-local: queries, keys and values are the teacher's (the dense model's) at every layer, so
// layer l's mixed output depends on layer l's gates only, and each head's objective is exact given
// those inputs: no student forward and no backward pass through the model are needed. What it cannot
// see is how a sparse head's error grows through later layers (LycheeDecode distils the final hidden
// state instead). Everything is computed in double from host float copies of queries and caches.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "gate_training.hpp"
#include "token_selection.hpp"

namespace minimal_decoder {

struct DecodeShape {
  int q_heads = 0, kv_heads = 0, head_dim = 0;
  int steps = 0;  // decode steps of the prompt
};

// One layer of one prompt, host memory.
struct DecodeLayer {
  const float* q = nullptr;  // [steps, q_heads, head_dim]: the post-RoPE queries of the decode steps
  const float* k = nullptr;  // [kv_heads, capacity, head_dim]: the layer's cache after the last step
  const float* v = nullptr;
  int capacity = 0;          // rows per head in k and v, >= prompt_len + steps
};

// Fed the layers of one prompt in order (layer 0 first); keeps only the previous layer's scores.
class PromptDistiller {
 public:
  PromptDistiller(const DecodeShape& shape, int prompt_len, const TokenBudget& budget)
      : s_(shape), prompt_len_(prompt_len), budget_(budget) {
    if (s_.kv_heads < 1 || s_.q_heads % s_.kv_heads != 0 || s_.head_dim < 1 || s_.steps < 1 || prompt_len < 1)
      throw DecoderError("PromptDistiller: bad shape");
  }

  // Layer 0 only provides the scores of layer 1's selection; every later layer adds its outputs.
  void add_layer(const DecodeLayer& in) {
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

  // Layers 1 .. (layers added - 1), ready for train_head_gates.
  PromptTargets take() { return std::move(targets_); }

 private:
  // out[d] = sum over the `count` positions pos(i) of softmax(logit)[pos(i)] * v[pos(i)][d], in double.
  template <class Position>
  void softmax_average(const std::vector<double>& logit, int count, Position pos, const float* v, float* out) {
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

  DecodeShape s_;
  int prompt_len_;
  TokenBudget budget_;
  int layers_ = 0;
  std::vector<float> prev_scores_;  // [kv_heads, steps, prompt_len + steps]: group-mean q.k of the last layer
  std::vector<double> acc_;
  PromptTargets targets_;
};

}  // namespace minimal_decoder
