#pragma once
/// \file
/// \brief Host reference of decode_attention (contract in decode_attention.hpp): double accumulation, the
/// semantics of the contract written out directly, no splits. The oracle every GPU test compares
/// with; it also checks what only host memory allows (q_len against each sequence's length).
/// An fp8 view's elements are dequantized as double(to_float(code)) * double(k_scale(b, h, t)) (and
/// v_scale for V): exact in double, the value the kernels approximate in fp32.

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "kvsift/core/check.hpp"
#include "kvsift/core/dtype.hpp"
#include "kvsift/core/exec.hpp"
#include "kvsift/core/workspace.hpp"
#include "kvsift/kv/kv_view.hpp"
#include "kvsift/ops/decode_attention.hpp"

namespace kvsift {
namespace host {

/// Host memory for every pointer (views, lengths, index set, q, out, lse, scores).
template <class View, class T>
Status decode_attention(const Exec&, const View& kv, const DecodeAttentionParams<T>& p,
                        Workspace /*workspace: the reference needs none*/ = {}) {
  static_assert(check_kv_view<View>());
  KVSIFT_TRY(detail::validate_decode_attention(kv, p));
  KVSIFT_TRY(validate_view_host(kv));
  using KT = typename View::value_type;
  const int d = p.head_dim, Hkv = kv.num_kv_heads, G = p.num_q_heads / Hkv;
  const int max_len = detail::decode_max_length(kv, p);
  std::vector<double> qv(d), acc(d), logits;
  std::vector<int> keys;
  for (int b = 0; b < kv.batch; ++b) {
    const int len = std::min(kv.length(b), max_len);
    // Lengths are host memory here, so the reference can check what the CUDA launcher cannot.
    KVSIFT_REQUIRE(len == 0 || p.q_len <= len, kInvalidArgument, "q_len = ", p.q_len, " exceeds kv.length(", b,
                   ") = ", len);
    for (int h = 0; h < Hkv; ++h) {
      const bool sparse = p.roles.is_sparse(h);
      keys.clear();
      if (!sparse) {
        for (int t = 0; t < len; ++t) keys.push_back(t);
      } else {
        const int row = b * Hkv + h, bs = p.index_set.block_size;
        for (int e = 0; e < p.index_set.count(row); ++e) {
          const std::int64_t first = std::int64_t(p.index_set.row(row)[e]) * bs;
          for (int i = 0; i < bs; ++i)
            if (first + i >= 0 && first + i < len) keys.push_back(int(first + i));
        }
      }
      for (int qi = 0; qi < p.q_len; ++qi) {
        const int limit = len - p.q_len + qi;  // last visible token
        for (int g = 0; g < G; ++g) {
          const int hq = h * G + g;
          const T* q = p.io.q.row(b, qi, hq);
          for (int i = 0; i < d; ++i) qv[i] = to_float(q[i]);
          logits.clear();
          double m = -INFINITY;
          for (int t : keys) {
            if (t > limit) continue;
            const KT* k = kv.k_row(b, h, t);
            double s = 0;
            for (int i = 0; i < d; ++i) s += qv[i] * double(to_float(k[i]));
            // The scale is constant over the row, so it multiplies the dot product: the same value as
            // scaling each element, exactly (in double).
            s *= double(kv_k_scale(kv, b, h, t));
            logits.push_back(s * p.sm_scale);
            m = std::max(m, logits.back());
          }
          std::fill(acc.begin(), acc.end(), 0.0);
          double sum = 0;
          std::size_t n = 0;
          for (int t : keys) {
            if (t > limit) continue;
            const double w = std::exp(logits[n++] - m);
            sum += w;
            const KT* v = kv.v_row(b, h, t);
            const double wv = w * double(kv_v_scale(kv, b, h, t));
            for (int i = 0; i < d; ++i) acc[i] += wv * double(to_float(v[i]));
          }
          T* o = p.io.out.row(b, qi, hq);
          for (int i = 0; i < d; ++i) o[i] = from_float<T>(sum > 0 ? float(acc[i] / sum) : 0.f);
          if (p.io.lse) p.io.lse[(std::int64_t(b) * p.q_len + qi) * p.num_q_heads + hq] = sum > 0 ? float(m + std::log(sum)) : -INFINITY;
        }
      }
      if (p.scores && !sparse) {
        std::fill(qv.begin(), qv.end(), 0.0);
        for (int g = 0; g < G; ++g) {
          const T* q = p.io.q.row(b, p.q_len - 1, h * G + g);
          for (int i = 0; i < d; ++i) qv[i] += double(to_float(q[i])) / G;
        }
        float* row = p.scores + (std::int64_t(b) * Hkv + h) * p.score_row_stride;
        const int bs = p.score_block_size;
        const int cols = detail::ceil_div(max_len, bs);
        for (int j = 0; j < cols; ++j) row[j] = -INFINITY;
        for (int t = 0; t < len; ++t) {
          const KT* k = kv.k_row(b, h, t);
          double s = 0;
          for (int i = 0; i < d; ++i) s += qv[i] * double(to_float(k[i]));
          s *= double(kv_k_scale(kv, b, h, t));
          row[t / bs] = std::max(row[t / bs], float(s));
        }
      }
    }
  }
  return Status();
}

}  // namespace host
}  // namespace kvsift
