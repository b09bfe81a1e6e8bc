#pragma once
/// \file
/// \brief The launch plan of attention_cosine and its workspace query (contract in attention_similarity.hpp).
/// The CUDA kernel runs one block per (decode query, query head, sequence), keeps the scaled query in
/// dynamic shared memory and recomputes the logits in three passes over the keys: nothing of size L is
/// stored, so there is no scratch on either backend.

#include <cstddef>

#include "kvsift/core/check.hpp"
#include "kvsift/core/query_rows.hpp"
#include "kvsift/ops/attention_similarity.hpp"
#include "kvsift/ops/window_scores.hpp"

namespace kvsift {
namespace detail {

struct AttentionCosinePlan {
  float scale = 0.f;           // resolved sm_scale
  std::size_t smem_bytes = 0;  // the scaled query row
};

template <class View>
AttentionCosinePlan plan_attention_cosine(const View& kv, float sm_scale) {
  return AttentionCosinePlan{resolve_sm_scale(sm_scale, kv.head_dim), sizeof(float) * std::size_t(kv.head_dim)};
}

}  // namespace detail

/// attention_cosine needs no scratch on either backend: `*bytes` = 0 (kNullPointer for a null
/// `bytes`); callers still ask, so a later path can use some without an API change.
template <class Exec, class View, class QT>
Status attention_cosine_workspace_bytes(const Exec&, const View& /*kv*/, const QueryRows<QT>& /*q*/,
                                        int /*num_queries*/, float /*sm_scale*/, const KeptPositions& /*kept*/,
                                        const float* /*cosine*/, std::size_t* bytes) {
  KVSIFT_REQUIRE_NOT_NULL(bytes, "bytes");
  *bytes = 0;
  return Status();
}

}  // namespace kvsift
