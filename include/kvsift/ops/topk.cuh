#pragma once
// CUDA backend of topk (contract in topk.hpp, design notes in docs/ops/topk.md).
//
// One launch. The launch shape comes from the shape of the score matrix (rows, cols), the dtype and
// the GPU, never from lengths or k in device memory, so a call can be captured in a CUDA graph.

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "kvsift/core/exec_cuda.cuh"
#include "kvsift/core/cuda_status.cuh"
#include "kvsift/core/dtype_cuda.cuh"
#include "kvsift/ops/detail/topk_radix_select.cuh"
#include "kvsift/ops/topk.hpp"

namespace kvsift {
namespace detail {

// Slices of about 64 KiB of keys stream well (eight 16-byte loads in flight per thread) and let two
// CTAs share an SM; up to 128 KiB a slice is still cached rather than re-read on every pass.
inline constexpr std::size_t kTopkPreferredSliceBytes = std::size_t(64) << 10;
inline constexpr std::size_t kTopkMaxCachedSliceBytes = std::size_t(128) << 10;
inline constexpr int kTopkMinSlice = 2048;  // below this a CTA is mostly barriers

struct TopkLaunchShape {
  int cluster_size = 1;
  int slice = 0;  // positions per CTA, a multiple of 8 (16-byte vectors never straddle two CTAs)
  bool cached = false;
  std::size_t smem_bytes = 0;
};

// Few long rows get clusters of up to 8 CTAs (enough CTAs to fill the GPU); many rows get the
// smallest cluster whose slices fit shared memory.
template <class KeyT>
TopkLaunchShape plan_topk_launch(std::int64_t rows, int cols, int sm_count, bool clusters_available) {
  auto slice_for = [cols](int c) { return int((std::int64_t(cols) + c - 1) / c + 7) / 8 * 8; };
  TopkLaunchShape s;
  const int max_cluster = clusters_available ? kTopkMaxCluster : 1;
  int c = 1;
  while (c < max_cluster && std::size_t(slice_for(c)) * sizeof(KeyT) > kTopkPreferredSliceBytes) c *= 2;
  while (c < max_cluster && rows * c < 2 * std::int64_t(sm_count) && slice_for(2 * c) >= kTopkMinSlice) c *= 2;
  s.cluster_size = c;
  s.slice = slice_for(c);
  s.cached = std::size_t(s.slice) * sizeof(KeyT) <= kTopkMaxCachedSliceBytes;
  s.smem_bytes = s.cached ? std::size_t(s.slice) * sizeof(KeyT) : 0;
  return s;
}

}  // namespace detail

namespace cuda {

// Same contract as host::topk; pointers are device pointers. Asynchronous on exec.stream: no
// allocation, no synchronization, no read of device data by the host. Needs no workspace today
// (topk_workspace_bytes returns 0); a workspace passed anyway is ignored.
template <class T, class Key = ScoreKey<T>>
Status topk(Exec exec, StridedView2D<const T> scores, const TopKParams& params, IndexSet out, T* values = nullptr,
            Key key = Key{}, void* workspace = nullptr, std::size_t workspace_bytes = 0) {
  static_assert(detail::check_key_policy<T, Key>());
  (void)workspace;
  (void)workspace_bytes;
  KVSIFT_TRY(detail::validate_topk(scores, params, out, values, key));
  if (scores.rows == 0) return Status();

  int device = 0, sm_count = 0, cc_major = 0;
  KVSIFT_CUDA_TRY(cudaGetDevice(&device));
  KVSIFT_CUDA_TRY(cudaDeviceGetAttribute(&sm_count, cudaDevAttrMultiProcessorCount, device));
  KVSIFT_CUDA_TRY(cudaDeviceGetAttribute(&cc_major, cudaDevAttrComputeCapabilityMajor, device));
  using K = typename Key::key_type;
  const detail::TopkLaunchShape shape =
      detail::plan_topk_launch<K>(scores.rows, int(scores.cols), sm_count, cc_major >= 9);
  KVSIFT_REQUIRE(scores.rows * shape.cluster_size <= INT32_MAX, kUnsupported, "scores.rows = ", scores.rows,
                 " is too many rows for one launch");

  detail::TopkKernelArgs<T, Key> args;
  args.scores = scores.data;
  args.score_stride = scores.row_stride;
  args.cols = int(scores.cols);
  args.params = params;
  args.out_indices = out.indices;
  args.out_counts = out.counts;
  args.out_stride = out.row_stride;
  args.capacity = out.capacity;
  args.values = values;
  args.key = key;
  args.cluster_size = shape.cluster_size;
  args.slice = shape.slice;
  args.cached = shape.cached;
  // 16-byte loads need every row to start on a 16-byte boundary; otherwise the kernel reads scalars.
  args.vector_loads = reinterpret_cast<std::uintptr_t>(scores.data) % 16 == 0 &&
                      (scores.row_stride * std::int64_t(sizeof(T))) % 16 == 0;

  auto kernel = detail::topk_cluster_select_kernel<T, Key>;
  // Static shared memory (about 19 KB) counts against the 48 KB default too, so the dynamic limit is
  // raised for every cached launch, not only for slices above 48 KB.
  if (shape.smem_bytes > 0)
    KVSIFT_CUDA_TRY(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(shape.smem_bytes)));

  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(unsigned(scores.rows * shape.cluster_size));
  config.blockDim = dim3(detail::kTopkThreads);
  config.dynamicSmemBytes = shape.smem_bytes;
  config.stream = exec.stream;
  cudaLaunchAttribute cluster_dim;
  cluster_dim.id = cudaLaunchAttributeClusterDimension;
  cluster_dim.val.clusterDim.x = unsigned(shape.cluster_size);
  cluster_dim.val.clusterDim.y = 1;
  cluster_dim.val.clusterDim.z = 1;
  config.attrs = &cluster_dim;
  config.numAttrs = cc_major >= 9 ? 1 : 0;
  KVSIFT_CUDA_TRY(cudaLaunchKernelEx(&config, kernel, args));
  return Status();
}

}  // namespace cuda
}  // namespace kvsift
