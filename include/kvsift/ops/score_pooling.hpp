#pragma once
/// \file
/// \brief pool_scores: SnapKV's smoothing of per-token scores before top-k, so neighbours of a strong token
/// are kept with it. A 1-D pool along each row with an odd kernel, stride 1 and "same" padding of
/// kernel / 2 on both sides, exactly as torch's avg_pool1d / max_pool1d with padding = kernel // 2:
///
///   kAvg:  out[j] = (sum of in[t], t in [j - p, j + p] and inside the row) / kernel   (pads count as 0)
///   kMax:  out[j] = max of in[t], t in [j - p, j + p] and inside the row             (pads are -inf)
///
/// NaN is where the two differ from torch's: kMax never takes a NaN (a window of only NaN gives -inf;
/// max_pool1d would give NaN), so one NaN score does not spread to its neighbours before top-k (which
/// ranks NaN lowest); kAvg propagates it, as avg_pool1d does.
///
/// Row r uses columns [0, row_lengths[r]) (clamped to the row width); other columns are untouched.
///
/// This header is the contract (parameters, validation). The workspace query is in score_pooling_plan.hpp,
/// the host reference in score_pooling_reference.hpp, the CUDA launcher in score_pooling.cuh (kernel in
/// detail/score_pooling_kernel.cuh).

#include <cmath>
#include <cstdint>

#include "kvsift/core/check.hpp"
#include "kvsift/core/config.hpp"
#include "kvsift/core/strided_view.hpp"

namespace kvsift {

/// The pool: kAvg (torch's avg_pool1d, pads count as 0) or kMax (max_pool1d, pads are -inf).
enum class PoolKind : int { kAvg, kMax };

/// The 1-D pool pool_scores applies along each row (see the file comment); SnapKV's is kMax, 7.
struct PoolParams {
  PoolKind kind = PoolKind::kMax;  ///< kAvg or kMax
  int kernel = 7;  ///< window width in columns: odd, >= 1; 1 is the identity
};

namespace detail {

KVSIFT_HD inline int clamp_row_length(const std::int32_t* row_lengths, std::int64_t r, std::int64_t cols) {
  const int n = row_lengths ? row_lengths[r] : int(cols);
  return n < 0 ? 0 : (n > cols ? int(cols) : n);
}

KVSIFT_HD inline float pool_at(const float* row, int n, int j, PoolParams p) {
  const int half = p.kernel / 2;
  const int lo = j - half < 0 ? 0 : j - half;
  const int hi = j + half >= n ? n - 1 : j + half;
  if (p.kind == PoolKind::kMax) {
    float m = -INFINITY;
    for (int t = lo; t <= hi; ++t) m = row[t] > m ? row[t] : m;
    return m;
  }
  float s = 0.f;
  for (int t = lo; t <= hi; ++t) s += row[t];
  return s / float(p.kernel);
}

inline Status validate_pool_params(const PoolParams& p) {
  KVSIFT_REQUIRE(p.kernel >= 1 && p.kernel % 2 == 1, kInvalidArgument, "pool.kernel = ", p.kernel,
                 " must be odd and >= 1");
  KVSIFT_REQUIRE(p.kind == PoolKind::kAvg || p.kind == PoolKind::kMax, kInvalidArgument, "pool.kind = ",
                 static_cast<int>(p.kind), " is not kAvg or kMax");
  return Status();
}

inline Status validate_pool_scores(const StridedView2D<const float>& in, const PoolParams& p,
                                   const StridedView2D<float>& out) {
  KVSIFT_TRY(validate_pool_params(p));
  KVSIFT_TRY(in.validate("scores"));
  KVSIFT_TRY(out.validate("pooled"));
  KVSIFT_REQUIRE(out.rows >= in.rows && out.cols >= in.cols, kInvalidArgument, "pooled = ", out.rows, " x ",
                 out.cols, " must be at least scores = ", in.rows, " x ", in.cols);
  KVSIFT_REQUIRE(in.data != out.data || in.rows == 0, kInvalidArgument,
                 "pooled must not alias scores (each output reads its neighbours)");
  return Status();
}

}  // namespace detail

}  // namespace kvsift
