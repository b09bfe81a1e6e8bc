#pragma once
/// \file
/// \brief Host reference of store_kv (contract in store_kv.hpp): the same per-row steps as the CUDA kernel,
/// in order. Host memory for every pointer; no workspace.

#include <cstdint>
#include <type_traits>
#include <vector>

#include "kvsift/core/check.hpp"
#include "kvsift/core/exec.hpp"
#include "kvsift/core/workspace.hpp"
#include "kvsift/kv/kv_view.hpp"
#include "kvsift/ops/store_kv.hpp"
#include "kvsift/ops/store_kv_plan.hpp"

namespace kvsift {
namespace host {

/// Writes the n rows of `p` into `kv` (quantizing to fp8, and writing per-token scales, for an fp8 view)
/// as the file comment of store_kv.hpp says. Host memory for every pointer; no workspace. Errors name the
/// parameter: the view's own validation (an fp8 view without scales: kNullPointer "kv.scales.k is
/// null"), kInvalidArgument for negative n or strides, kNullPointer for a null k, v, seq or pos.
template <class View, class T>
Status store_kv(const Exec&, const View& kv, const StoreKvParams<T>& p, Workspace /*workspace: none needed*/ = {}) {
  static_assert(check_kv_view<View>());
  static_assert(detail::check_writable_scales<View>());
  KVSIFT_TRY(detail::validate_store_kv(kv, p));
  using KT = std::remove_const_t<typename View::value_type>;
  const int d = kv.head_dim, cap = kv_capacity(kv);
  const StoreKvRotary<T>& r = p.rotary;
  std::vector<float> row[2] = {std::vector<float>(std::size_t(d)), std::vector<float>(std::size_t(d))};
  // One head's row turned by RoPE in place (StoreKvRotary), pair by pair.
  const auto rotate = [&](float* x, int i) {
    for (int j = 0; j < r.rotary_dim / 2; ++j) {
      float c, s;
      detail::rotary_cos_sin(r.position[i], r.inv_freq[j], &c, &s);
      detail::rotate_pair(x[j], x[j + r.rotary_dim / 2], c, s);
    }
  };
  if (kv.batch == 0) return Status();
  for (int i = 0; i < p.n; ++i) {
    if (r.inv_freq && r.q)  // Q is rotated whether or not the row lands in the view
      for (int h = 0; h < r.num_q_heads; ++h) {
        T* q = r.q + i * r.q_row_stride + std::int64_t(h) * d;
        for (int e = 0; e < d; ++e) row[0][std::size_t(e)] = to_float(q[e]);
        rotate(row[0].data(), i);
        for (int e = 0; e < r.rotary_dim; ++e) q[e] = from_float<std::remove_const_t<T>>(row[0][std::size_t(e)]);
      }
    const int b = p.seq[i], t = p.pos[i];
    if (!detail::store_row_in_range(b, t, kv.batch, cap)) continue;
    for (int h = 0; h < kv.num_kv_heads; ++h) {
      const T* src[2] = {p.k + i * p.row_stride + h * p.head_stride, p.v + i * p.row_stride + h * p.head_stride};
      KT* dst[2] = {kv.k_row(b, h, t), kv.v_row(b, h, t)};
      for (int kvi = 0; kvi < 2; ++kvi) {
        float* x = row[kvi].data();
        for (int e = 0; e < d; ++e) x[e] = to_float(src[kvi][e]);
        if (kvi == 0 && r.inv_freq) rotate(x, i);
        float scale = 1.f;
        if constexpr (is_fp8_dtype<KT>::value) {
          float* scales = kvi == 0 ? kv.scales.k : kv.scales.v;
          const std::int64_t at = kv.scale_offset(b, h, t);
          if (kv.scales.granularity == ScaleGranularity::kPerToken) {
            float amax = 0.f;
            for (int e = 0; e < d; ++e) amax = detail::fold_amax(amax, x[e]);
            scale = detail::per_token_scale<KT>(amax);
            scales[at] = scale;
          } else {
            scale = scales[at];
          }
        }
        for (int e = 0; e < d; ++e) dst[kvi][e] = detail::quantize_element<KT>(x[e], scale);
      }
    }
  }
  return Status();
}

}  // namespace host
}  // namespace kvsift
