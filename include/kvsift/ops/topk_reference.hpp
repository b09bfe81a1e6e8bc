#pragma once
/// \file
/// \brief Host reference of topk (contract in topk.hpp): per row, sort the scored region by (key descending,
/// position ascending), keep the first `budget`, add the forced ranges, write ascending positions.
/// Plain and obviously correct: the oracle the CUDA radix select is tested against.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include "kvsift/core/exec.hpp"
#include "kvsift/core/workspace.hpp"
#include "kvsift/ops/topk.hpp"
#include "kvsift/ops/topk_plan.hpp"

namespace kvsift {
namespace host {

/// Host memory for every pointer. `values` (optional) receives the score
/// of each selected position at the same offset, with row stride out.row_stride.
template <class T, class Key = ScoreKey<T>>
Status topk(const Exec&, StridedView2D<const T> scores, const TopKParams& params, IndexSet out, T* values = nullptr,
            Key key = Key{}, Workspace /*workspace: the reference needs none*/ = {}) {
  static_assert(detail::check_key_policy<T, Key>());
  KVSIFT_TRY(detail::validate_topk(scores, params, out, values, key));
  using K = typename Key::key_type;
  const int cols = static_cast<int>(scores.cols);
  std::vector<std::pair<K, int>> candidates;
  std::vector<int> chosen;
  for (int r = 0; r < scores.rows; ++r) {
    if (topk_skips_row(params, r)) continue;
    const int len = params.lengths ? params.lengths[r] : cols;
    const int k = params.per_row_k ? params.per_row_k[r] : params.k;
    const TopKRowPlan plan = plan_topk_row(cols, len, k, out.capacity, params.sink, params.recent);
    const T* row = scores.row(r);

    candidates.clear();
    for (int i = plan.sink_end; i < plan.recent_begin; ++i) candidates.emplace_back(key(row[i], r, i), i);
    auto better = [](const std::pair<K, int>& a, const std::pair<K, int>& b) {
      return a.first != b.first ? a.first > b.first : a.second < b.second;
    };
    std::partial_sort(candidates.begin(), candidates.begin() + plan.budget, candidates.end(), better);
    chosen.clear();
    for (int j = 0; j < plan.budget; ++j) chosen.push_back(candidates[j].second);
    std::sort(chosen.begin(), chosen.end());

    std::int32_t* dst = out.row(r);
    int o = 0;
    auto emit = [&](int position) {
      dst[o] = position;
      if (values) values[r * out.row_stride + o] = row[position];
      ++o;
    };
    for (int i = 0; i < plan.sink_end; ++i) emit(i);
    for (int i : chosen) emit(i);
    for (int i = plan.recent_begin; i < plan.len; ++i) emit(i);
    out.counts[r] = o;
  }
  return Status();
}

}  // namespace host
}  // namespace kvsift
