#pragma once
/// \file
/// \brief Host reference of compact_kv (contract in compact_kv.hpp): every destination slot from the same
/// slot map the CUDA kernel uses. Host memory for every pointer; no workspace.

#include <cstdint>

#include "kvsift/core/check.hpp"
#include "kvsift/core/exec.hpp"
#include "kvsift/core/workspace.hpp"
#include "kvsift/kv/index_set.hpp"
#include "kvsift/kv/kv_view.hpp"
#include "kvsift/ops/compact_kv.hpp"
#include "kvsift/ops/compact_kv_plan.hpp"
#include "kvsift/ops/store_kv.hpp"  // check_writable_scales

namespace kvsift {
namespace host {

/// Copies the kept prefix rows and the last `window` tokens of `src` into `dst` and fills `out`, as
/// the file comment of compact_kv.hpp says. Host memory for every pointer; no workspace. Errors name
/// the parameter: kInvalidArgument for mismatched views or a `kept` of block granularity, too few rows
/// or a short positions_stride; kInsufficientSpace for a dst capacity below kept.capacity + window.
template <class Src, class Dst>
Status compact_kv(const Exec&, const Src& src, ConstIndexSet kept, int window, const Dst& dst, CompactOutputs out,
                  Workspace /*workspace: none needed*/ = {}) {
  static_assert(check_kv_view<Src>());
  static_assert(check_kv_view<Dst>());
  static_assert(detail::check_writable_scales<Dst>());
  KVSIFT_TRY(detail::validate_compact_kv(src, kept, window, dst, out));
  KVSIFT_TRY(validate_view_host(src));
  const int group = dst.num_kv_heads / src.num_kv_heads;
  const int slots = kept.capacity + window;
  for (int b = 0; b < dst.batch; ++b) {
    const int len = src.length(b);
    for (int h = 0; h < dst.num_kv_heads; ++h) {
      const int r = b * dst.num_kv_heads + h;
      for (int s = 0; s < slots; ++s) {
        const int p = detail::compact_source_position(kept, r, s, len, window);
        if (out.positions) out.positions[r * out.positions_stride + s] = p;
        detail::compact_copy_scales(src, dst, b, h, h / group, s, p);
        if (p < 0) continue;
        const auto* ks = src.k_row(b, h / group, p);
        const auto* vs = src.v_row(b, h / group, p);
        auto* kd = dst.k_row(b, h, s);
        auto* vd = dst.v_row(b, h, s);
        for (int e = 0; e < src.head_dim; ++e) {
          kd[e] = ks[e];
          vd[e] = vs[e];
        }
      }
    }
    const int w = window < len ? window : len;
    out.new_lengths[b] = kept.count(b * dst.num_kv_heads) + w;
  }
  return Status();
}

}  // namespace host
}  // namespace kvsift
