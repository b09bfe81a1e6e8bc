#pragma once
/// \file
/// \brief attention_cosine: how close attention over a compressed cache stays to attention over the
/// full one.
///
/// For decode query t < T = num_queries of sequence b and query head h (query rows q.row(b, t, h)),
/// with logits l_j = sm_scale * q . k_j (sm_scale <= 0: 1 / sqrt(head_dim)) over the full prompt
/// cache [0, L):
///   a_full = softmax over all j < L,   a_kept = softmax over the kept positions, 0 elsewhere,
///   cosine[(b * Hq + h) * T + t] = dot(a_full, a_kept) / (|a_full| |a_kept|)
/// The kept positions of a head are kept.data[r * kept.stride + s], s < kept.count (r = b * H_kept +
/// h_kept, h_kept = h or h / G as the selection was per query head or per KV head), entries outside
/// [0, L) ignored: exactly what compact_kv reports in CompactOutputs::positions. The cosine is 0 when
/// either distribution is empty. This is ClusterAttn's criterion for choosing num_block
/// (calibrate_num_block) and the fidelity number the benchmarks and the quickstart print.
///
/// This header is the contract (the kept-positions view, validation). The plan and workspace query are
/// in attention_similarity_plan.hpp, the host reference in attention_similarity_reference.hpp, the CUDA
/// launcher in attention_similarity.cuh (kernel in detail/attention_similarity_kernel.cuh).

#include <cstdint>

#include "kvsift/core/check.hpp"
#include "kvsift/core/query_rows.hpp"
#include "kvsift/kv/kv_view.hpp"
#include "kvsift/ops/window_scores.hpp"  // detail::resolve_sm_scale

namespace kvsift {

/// Kept original positions per row, as CompactOutputs::positions holds them: a const view in the
/// backend's memory space; entries < 0 or >= L are ignored.
struct KeptPositions {
  const std::int32_t* data = nullptr;  ///< [rows, stride]; may be null when count = 0
  int rows = 0;        ///< >= batch * heads
  int heads = 0;       ///< rows per sequence: kv heads or query heads
  int count = 0;       ///< entries per row, >= 0
  std::int64_t stride = 0;  ///< entries between rows, >= count
};

namespace detail {

template <class View, class QT>
Status validate_attention_cosine(const View& kv, const QueryRows<QT>& q, int num_queries, const KeptPositions& kept,
                                 const float* cosine) {
  KVSIFT_TRY(kv.validate());
  KVSIFT_REQUIRE(q.num_heads > 0 && q.num_heads % kv.num_kv_heads == 0, kInvalidArgument, "q.num_heads = ",
                 q.num_heads, " must be a positive multiple of kv.num_kv_heads = ", kv.num_kv_heads);
  KVSIFT_REQUIRE(num_queries >= 0 && num_queries <= q.capacity, kInvalidArgument, "num_queries = ", num_queries,
                 " must be in [0, q.capacity = ", q.capacity, "]");
  KVSIFT_REQUIRE(kept.heads == kv.num_kv_heads || kept.heads == q.num_heads, kInvalidArgument, "kept.heads = ",
                 kept.heads, " must be the KV or the query head count");
  KVSIFT_REQUIRE(kept.rows >= kv.batch * kept.heads, kInvalidArgument, "kept.rows = ", kept.rows,
                 " must be >= batch * kept.heads = ", kv.batch * kept.heads);
  KVSIFT_REQUIRE(kept.stride >= kept.count && kept.count >= 0, kInvalidArgument, "kept.stride = ", kept.stride,
                 " must be >= kept.count = ", kept.count, " >= 0");
  if (kv.batch > 0 && num_queries > 0) {
    KVSIFT_REQUIRE_NOT_NULL(q.data, "q.data");
    KVSIFT_REQUIRE_NOT_NULL(cosine, "cosine");
    KVSIFT_REQUIRE(kept.count == 0 || kept.data != nullptr, kNullPointer, "kept.data is null");
  }
  return Status();
}

}  // namespace detail

}  // namespace kvsift
