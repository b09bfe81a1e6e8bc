#pragma once
// The targets of head-role training (gate_training.hpp), from one prompt's dense decode: for every
// layer l >= 1 and decode step s (n = prompt + s + 1 keys, the decode token included),
//   O_dense[s, h]   softmax(q_h . k / sqrt(D)) V over all n keys of layer l;
//   O_sparse[s, h]  the same over only the tokens that LycheeDecode's token mode selects for KV head
//                   j = h / G from layer l-1's *dense* group-mean scores (1/G) sum_g q_g . k
//                   (select_tokens: sink and recent forced, the rest of the budget by score).
// Layer l-1's selection is the one LycheeDecode's training mixes in (the
// sparse mask of layer l comes from layer l-1's full attention); at inference a sparse head reads the
// latest retrieval head of its index, which is layer l-1's whenever that head is a retrieval head.
//
// Why layer-local: queries, keys and values are the teacher's (the dense model's) at every layer, so
// layer l's mixed output depends on layer l's gates only, and each head's objective is exact given
// those inputs: no student forward and no backward pass through the model are needed. What it cannot
// see is how a sparse head's error grows through later layers (LycheeDecode distils the final hidden
// state instead). Everything is computed in double from host float copies of queries and caches.

#include <cstdint>
#include <vector>

#include "tools/gate_training.hpp"
#include "tools/token_selection.hpp"

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
  PromptDistiller(const DecodeShape& shape, int prompt_len, const TokenBudget& budget);

  // Layer 0 only provides the scores of layer 1's selection; every later layer adds its outputs.
  void add_layer(const DecodeLayer& in);

  // Layers 1 .. (layers added - 1), ready for train_head_gates.
  PromptTargets take() { return std::move(targets_); }

 private:
  // out[d] = sum over the `count` positions pos(i) of softmax(logit)[pos(i)] * v[pos(i)][d], in double.
  template <class Position>
  void softmax_average(const std::vector<double>& logit, int count, Position pos, const float* v, float* out);

  DecodeShape s_;
  int prompt_len_;
  TokenBudget budget_;
  int layers_ = 0;
  std::vector<float> prev_scores_;  // [kv_heads, steps, prompt_len + steps]: group-mean q.k of the last layer
  std::vector<double> acc_;
  PromptTargets targets_;
};

}  // namespace minimal_decoder
