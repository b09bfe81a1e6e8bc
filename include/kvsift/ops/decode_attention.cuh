#pragma once
/// \file
/// \brief CUDA backend of decode_attention (contract in decode_attention.hpp, plan in
/// decode_attention_plan.hpp; guide in docs/ops/decode_attention.md).
///
/// One kernel launch on exec.stream, plus a merge kernel when some head has more than one split: one
/// block per batch x KV head x split x row tile, tensor cores for 16-bit and fp8 K/V, CUDA cores for
/// float K/V. A head with one split writes `out` and `lse` directly; otherwise each block writes its
/// normalised partial and log-sum-exp to the workspace, and the merge kernel, launched as a
/// programmatic dependent (it is scheduled while the split kernel runs and waits for it on the
/// device), combines them. Small calls (DecodePlan::cluster) launch a head's splits as one
/// thread-block cluster instead, and the splits merge through distributed shared memory before they
/// exit: one launch and no partials. Nothing is allocated, nothing waits on the host, and the grids come from
/// host values only.
///
/// Every K and V row must be 16-byte aligned (checked for ContiguousKV and PagedKV).

#include <cstdint>
#include <type_traits>

#include "kvsift/core/exec_cuda.cuh"
#include "kvsift/core/smem_limit.cuh"
#include "kvsift/core/cuda_status.cuh"
#include "kvsift/core/dtype_cuda.cuh"
#include "kvsift/core/workspace.hpp"
#include "kvsift/kv/row_alignment.hpp"
#include "kvsift/ops/decode_attention.hpp"
#include "kvsift/ops/decode_attention_plan.hpp"
#include "kvsift/ops/detail/decode_attention_common.cuh"
#include "kvsift/ops/detail/decode_attention_merge.cuh"
#include "kvsift/ops/detail/decode_attention_mma.cuh"
#include "kvsift/ops/detail/decode_attention_simt.cuh"

namespace kvsift {
namespace detail {

// ContiguousKV and PagedKV (whose fp8 scale addressing KvRows hoists).
template <class V>
struct is_shipped_view : std::false_type {};
template <class E>
struct is_shipped_view<ContiguousKV<E>> : std::true_type {};
template <class E>
struct is_shipped_view<PagedKV<E>> : std::true_type {};

/// head_dim from a runtime value to a template parameter: the one place that does it.
template <class F>
Status dispatch_head_dim(int head_dim, F&& f) {
  switch (head_dim) {
    case 64: return f(std::integral_constant<int, 64>{});
    case 128: return f(std::integral_constant<int, 128>{});
    case 256: return f(std::integral_constant<int, 256>{});
  }
  return make_status(StatusCode::kUnsupported, "head_dim = ", head_dim, " is not supported (64, 128 or 256)");
}

// Opts the kernel into the dynamic shared memory it needs (static shared memory counts against the
// 48 KiB default too, so it is asked for every size; core/smem_limit.cuh says why the limit is only
// ever raised). The plan counts on kDecodeCtasPerSm resident blocks, hence the largest carveout.
template <class Kernel>
Status allow_dynamic_smem(Kernel kernel, std::size_t bytes) {
  return raise_dynamic_smem_limit(kernel, bytes, /*max_carveout=*/true, "decode_attention: cudaFuncSetAttribute");
}

template <int D, int R, class View, class QT>
Status launch_decode_split_mma(const DecodeLaunch<View, QT>& launch, dim3 grid, int score_blocks, cudaStream_t stream, bool pdl) {
  const std::size_t smem = mma_smem_bytes<D, R, int(sizeof(typename View::value_type))>(score_blocks);
  KVSIFT_TRY(allow_dynamic_smem(decode_split_mma_kernel<D, R, View, QT>, smem));
  // A head's splits form one cluster when they merge there (DecodePlan::cluster).
  const unsigned cluster = launch.plan.cluster > 1 ? unsigned(launch.plan.cluster) : 0u;
  return from_cuda(launch_with_attributes(pdl, cluster, decode_split_mma_kernel<D, R, View, QT>, grid, dim3(kDecodeThreads), smem,
                                          stream, launch),
                   "decode_attention: the split launch");
}

}  // namespace detail

namespace detail {

// The launch proper (16- and 32-bit K/V), after the plan and the row checks.
template <class View, class T>
Status launch_decode_attention(const cuda::Exec& exec, const View& kv, DecodeLaunch<View, T>& launch, Workspace workspace) {
  const DecodeAttentionParams<T>& p = launch.p;
  if (kv.batch == 0) return Status();
  KVSIFT_TRY(check_rows_16byte_aligned(kv));  // the kernels move rows with 16-byte copies
  const detail::DecodePlan& plan = launch.plan;
  if (plan.merge_kernel()) {
    KVSIFT_REQUIRE_NOT_NULL(workspace.data, "workspace.data (ask decode_attention_workspace_bytes)");
    WorkspaceCarver ws(workspace);
    plan.carve(ws, &launch.partial_out, &launch.partial_lse);
    KVSIFT_TRY(ws.status());
  }
  KVSIFT_REQUIRE(kv.batch <= 65535, kUnsupported, "kv.batch = ", kv.batch, " must be <= 65535");

  const dim3 grid(plan.ctas_per_tile, plan.row_tiles, kv.batch);
  const int score_blocks = p.scores && p.score_block_size > 1 ? plan.chunk / p.score_block_size : 0;
  // The split kernel (a programmatic dependent of the kernel before it with Exec::dependent_launch),
  // then (when some head splits) the merge kernel as its programmatic dependent.
  const bool pdl = exec.launches_dependent();
  auto merge = [&](auto head_dim, auto row_tile) -> Status {
    if (!plan.merge_kernel()) return Status();
    constexpr int D = decltype(head_dim)::value, R = decltype(row_tile)::value;
    const dim3 merge_grid(plan.merged_heads * plan.merge_blocks_per_head, plan.row_tiles, kv.batch);
    return launch_dependent(exec.device, decode_merge_kernel<D, R, View, T>, merge_grid, dim3(kDecodeMergeThreads), 0,
                            exec.stream, "decode_attention: the merge launch", launch);
  };
  using R8 = std::integral_constant<int, 8>;
  using R16 = std::integral_constant<int, 16>;
  return detail::dispatch_head_dim(p.head_dim, [&](auto head_dim) -> Status {
    constexpr int D = decltype(head_dim)::value;
    if constexpr (detail::decode_uses_tensor_cores<View>()) {
      if (plan.row_tile == 8) {
        KVSIFT_TRY((detail::launch_decode_split_mma<D, 8>(launch, grid, score_blocks, exec.stream, pdl)));
        return merge(head_dim, R8{});
      }
      if constexpr (D != 256) {
        KVSIFT_TRY((detail::launch_decode_split_mma<D, 16>(launch, grid, score_blocks, exec.stream, pdl)));
        return merge(head_dim, R16{});
      }
      return make_status(StatusCode::kInternal, "no 16-row tile at head_dim 256");
    } else {
      const std::size_t smem = detail::SplitSmem<D, 8>::bytes(score_blocks);
      KVSIFT_TRY(detail::allow_dynamic_smem(detail::decode_split_simt_kernel<D, View, T>, smem));
      KVSIFT_TRY(from_cuda(detail::launch_with_pdl(pdl, detail::decode_split_simt_kernel<D, View, T>, grid,
                                                   dim3(detail::kDecodeThreads), smem, exec.stream, launch),
                           "decode_attention: the split launch"));
      return merge(head_dim, R8{});
    }
  });
}

}  // namespace detail

namespace cuda {

/// decode_attention on `exec.stream` (see decode_attention.hpp); every pointer is device memory, and
/// `workspace` must hold decode_attention_workspace_bytes(exec, kv, p) bytes, 256-byte aligned. Errors:
/// those of the contract, a zero exec.device.num_sms, misaligned K/V rows (kMisaligned), a null or
/// too small workspace (kNullPointer, kInsufficientSpace), batch > 65535, or a launch error.
template <class View, class T>
Status decode_attention(const Exec& exec, const View& kv, const DecodeAttentionParams<T>& p,
                        Workspace workspace = {}) {
  static_assert(check_kv_view<View>());
  static_assert(is_supported_dtype<T>::value, "decode_attention: Q must be float, half or bfloat16");
  detail::DecodeLaunch<View, T> launch{kv, p, detail::DecodePlan(), nullptr, nullptr, exec.data_error};
  // The plan validates the shapes and values; what it cannot see without data is checked here.
  KVSIFT_TRY(detail::plan_decode_attention(exec.device, kv, p, &launch.plan));
  KVSIFT_TRY(detail::validate_decode_attention_rows(kv, p));
  if constexpr (is_fp8_view_v<View> && !detail::is_shipped_view<View>::value) {
    // The kernel hoists the scale addressing of the shipped views; a custom fp8 view has no such form.
    return make_status(StatusCode::kUnsupported,
                       "decode_attention: fp8 KV on the GPU needs a ContiguousKV or PagedKV view");
  } else {
    return detail::launch_decode_attention(exec, kv, launch, workspace);
  }
}

}  // namespace cuda

}  // namespace kvsift
