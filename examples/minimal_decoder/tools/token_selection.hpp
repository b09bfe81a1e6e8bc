#pragma once
// LycheeDecode's token-mode selection of one row (one KV head at one decode step), on the host, for
// the offline tools that recompute it outside the policy (the head probe, head-role training).
//
// It is kvsift's own top-k (kvsift::host::topk), called with the parameters LycheeDecodePolicy hands it,
// so the semantics are the library's: scores are the group-mean raw q.k (no 1/sqrt(d), no softmax);
// the first `sink` and the last `recent` of the n tokens are forced and count inside `budget`; the
// rest of the budget goes to the best scores in between, ties to the lower position; a row keeps
// max(forced, min(budget, n)) tokens (budget >= n: every token), in ascending order.

#include <cstdint>
#include <vector>

namespace minimal_decoder {

struct TokenBudget {
  int budget = 0, sink = 0, recent = 0;
};

// The selected positions of a row of n scores, ascending, into *out (resized to the count).
void select_tokens(const float* scores, int n, const TokenBudget& t, std::vector<std::int32_t>* out);

}  // namespace minimal_decoder
