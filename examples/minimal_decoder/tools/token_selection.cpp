// The host token selection (token_selection.hpp): one call of kvsift::host::topk.

#include "tools/token_selection.hpp"

#include <algorithm>

#include <kvsift/kvsift.hpp>

#include "engine/errors.hpp"

namespace minimal_decoder {

void select_tokens(const float* scores, int n, const TokenBudget& t, std::vector<std::int32_t>* out) {
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
