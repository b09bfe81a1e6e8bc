#pragma once
// LycheeDecode's token-mode selection of one row (one KV head at one decode step), on the host, for
// the offline tools that recompute it outside the policy (the head probe, head-role training).
//
// It is kvsift's own top-k (kvsift::host::topk), called with the parameters LycheeDecodePolicy hands it,
// so the semantics are the library's: scores are the group-mean raw q.k (no 1/sqrt(d), no softmax);
// the first `sink` and the last `recent` of the n tokens are forced and count inside `budget`; the
// rest of the budget goes to the best scores in between, ties to the lower position; a row keeps
// max(forced, min(budget, n)) tokens (budget >= n: every token), in ascending order.

#include <algorithm>
#include <cstdint>
#include <vector>

#include <kvsift/kvsift.hpp>

#include "errors.hpp"

namespace minimal_decoder {

struct TokenBudget {
  int budget = 0, sink = 0, recent = 0;
};

// The selected positions of a row of n scores, ascending, into *out (resized to the count).
inline void select_tokens(const float* scores, int n, const TokenBudget& t, std::vector<std::int32_t>* out) {
  const int capacity = std::max(t.budget, t.sink + t.recent);
  out->assign(std::size_t(std::max(capacity, 1)), 0);
  std::int32_t count = 0;
  kvsift::TopKParams p;
  p.k = t.budget;
  p.sink = t.sink;
  p.recent = t.recent;
  check(kvsift::host::topk(kvsift::host::Exec{}, kvsift::make_strided_view<const float>(scores, 1, n), p,
                           kvsift::make_index_set(out->data(), &count, 1, capacity)),
        "token selection (top-k)");
  out->resize(std::size_t(count));
}

}  // namespace minimal_decoder
