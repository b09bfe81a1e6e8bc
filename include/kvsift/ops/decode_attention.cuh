#pragma once
// CUDA backend of decode_attention (contract in decode_attention.hpp; guide in docs/ops/decode_attention.md).
//
// Two launches on exec.stream: a split kernel (one block per batch x KV head x split x row tile;
// tensor cores for 16-bit K/V, CUDA cores for float K/V) writes normalised partial outputs and their
// log-sum-exp to the workspace, and a merge kernel combines them into `out` and `lse`. Nothing is
// allocated, nothing waits on the host, and the grid comes from host values only.
//
// Every K and V row must be 16-byte aligned (checked for ContiguousKV and PagedKV).

#include <cstdint>
#include <type_traits>

#include "kvsift/core/exec_cuda.cuh"
#include "kvsift/core/cuda_status.cuh"
#include "kvsift/core/dtype_cuda.cuh"
#include "kvsift/core/workspace.hpp"
#include "kvsift/kv/row_alignment.hpp"
#include "kvsift/ops/decode_attention.hpp"
#include "kvsift/ops/detail/decode_attention_common.cuh"
#include "kvsift/ops/detail/decode_attention_mma.cuh"
#include "kvsift/ops/detail/decode_attention_simt.cuh"

namespace kvsift {
namespace detail {

// head_dim from a runtime value to a template parameter: the one place that does it.
template <class F>
Status dispatch_head_dim(int head_dim, F&& f) {
  switch (head_dim) {
    case 64: return f(std::integral_constant<int, 64>{});
    case 128: return f(std::integral_constant<int, 128>{});
    case 256: return f(std::integral_constant<int, 256>{});
  }
  return make_status(StatusCode::kUnsupported, "head_dim = ", head_dim, " is not supported (64, 128 or 256)");
}

template <int D, int R, bool kPrefetch, class View, class QT>
Status launch_decode_split_mma(const DecodeArgs<View, QT>& args, dim3 grid, std::size_t smem, cudaStream_t stream) {
  decode_split_mma_kernel<D, R, kPrefetch, View, QT><<<grid, kDecodeThreads, smem, stream>>>(args);
  KVSIFT_CHECK_LAUNCH();
  return Status();
}

}  // namespace detail

namespace cuda {

template <class View, class T>
Status decode_attention(Exec exec, const View& kv, const DecodeAttentionParams<T>& p, void* workspace,
                        std::size_t workspace_bytes) {
  static_assert(check_kv_view<View>());
  static_assert(is_supported_dtype<T>::value, "decode_attention: Q must be float, half or bfloat16");
  KVSIFT_TRY(detail::validate_decode_attention(kv, p));
  detail::DecodePlan plan;
  KVSIFT_TRY(detail::plan_decode_attention(kv, p, &plan));
  if (kv.batch == 0) return Status();
  KVSIFT_TRY(check_rows_16byte_aligned(kv));  // the kernels move rows with 16-byte loads
  KVSIFT_REQUIRE_NOT_NULL(workspace, "workspace");
  WorkspaceCarver ws(workspace, workspace_bytes);
  float *partial_out, *partial_lse;
  plan.carve(ws, &partial_out, &partial_lse);
  KVSIFT_TRY(ws.status());
  KVSIFT_REQUIRE(kv.batch <= 65535, kUnsupported, "kv.batch = ", kv.batch, " must be <= 65535");

  detail::DecodeArgs<View, T> args{};
  args.kv = kv;
  args.q = p.q;
  args.q_batch_stride = p.q_batch_stride;
  args.q_token_stride = p.q_token_stride;
  args.q_head_stride = p.q_head_stride;
  args.q_len = p.q_len;
  args.group = plan.group;
  args.rows = plan.rows;
  args.row_tile = plan.row_tile;
  args.max_len = plan.max_len;
  args.chunk = plan.chunk;
  args.dense_splits = plan.dense_splits;
  args.gathered_splits = plan.gathered_splits;
  args.ctas_per_tile = plan.ctas_per_tile;
  args.num_dense = plan.num_dense;
  args.scale_log2 = p.sm_scale * kLog2e;
  args.gather = p.gather;
  args.scores = p.scores;
  args.score_row_stride = p.score_row_stride;
  args.score_block_size = p.score_block_size;
  args.score_cols = p.scores ? detail::ceil_div(plan.max_len, p.score_block_size) : 0;
  args.partial_out = partial_out;
  args.partial_lse = partial_lse;
  for (int i = 0; i < kMaxKvHeads; ++i) args.head_at[i] = plan.head_at[i];

  const dim3 grid(plan.ctas_per_tile, plan.row_tiles, kv.batch);
  const int score_blocks = p.scores && p.score_block_size > 1 ? plan.chunk / p.score_block_size : 0;
  KVSIFT_TRY(detail::dispatch_head_dim(p.head_dim, [&](auto head_dim) -> Status {
    constexpr int D = decltype(head_dim)::value;
    if constexpr (detail::decode_uses_tensor_cores<View>()) {
      // Double-buffered fragments fit the register budget up to 128 dims with 8-row tiles.
      if (plan.row_tile == 8) {
        const std::size_t smem = detail::SplitSmem<D, 8>::bytes(score_blocks);
        return detail::launch_decode_split_mma<D, 8, (D <= 128)>(args, grid, smem, exec.stream);
      }
      if constexpr (D != 256) {
        const std::size_t smem = detail::SplitSmem<D, 16>::bytes(score_blocks);
        return detail::launch_decode_split_mma<D, 16, (D <= 64)>(args, grid, smem, exec.stream);
      }
      return make_status(StatusCode::kInternal, "no 16-row tile at head_dim 256");
    } else {
      const std::size_t smem = detail::SplitSmem<D, 8>::bytes(score_blocks);
      detail::decode_split_simt_kernel<D, View, T><<<grid, detail::kDecodeThreads, smem, exec.stream>>>(args);
      KVSIFT_CHECK_LAUNCH();
      return Status();
    }
  }));

  detail::MergeArgs<T> merge{};
  merge.out = p.out;
  merge.out_batch_stride = p.out_batch_stride;
  merge.out_token_stride = p.out_token_stride;
  merge.out_head_stride = p.out_head_stride;
  merge.lse = p.lse;
  merge.partial_out = partial_out;
  merge.partial_lse = partial_lse;
  merge.batch = kv.batch;
  merge.q_len = p.q_len;
  merge.num_q_heads = p.num_q_heads;
  merge.group = plan.group;
  merge.head_dim = p.head_dim;
  merge.row_tile = plan.row_tile;
  merge.row_tiles = plan.row_tiles;
  merge.ctas_per_tile = plan.ctas_per_tile;
  merge.num_dense = plan.num_dense;
  merge.dense_splits = plan.dense_splits;
  merge.gathered_splits = plan.gathered_splits;
  merge.roles = p.roles;
  for (int i = 0; i < kMaxKvHeads; ++i) merge.rank_of[i] = plan.rank_of[i];
  const std::int64_t out_rows = std::int64_t(kv.batch) * p.q_len * p.num_q_heads;
  const unsigned merge_blocks = unsigned((out_rows + detail::kMergeWarps - 1) / detail::kMergeWarps);
  detail::decode_merge_kernel<T><<<merge_blocks, detail::kMergeWarps * 32, 0, exec.stream>>>(merge);
  KVSIFT_CHECK_LAUNCH();
  return Status();
}

}  // namespace cuda
}  // namespace kvsift
