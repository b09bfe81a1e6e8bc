#pragma once
// The PTX that the kernels streaming rows through a shared-memory ring share (decode attention's split
// kernel, window_scores' window path): the 16-byte cp.async that fills a slot, its commit and wait,
// and ldmatrix, which reads the slot's 16-bit rows as mma fragments.

#include <cstdint>

namespace kvsift {
namespace detail {

// 16-byte global-to-shared copy through L2 only (K/V are read once); `bytes` 0 zero-fills the
// destination and reads nothing. The L2::128B hint measured best on the H200 (dense decode B=8 128K:
// 1230 us against 1453 with L2::256B and 1333 with no hint).
__device__ __forceinline__ void cp_async16(unsigned dst, const void* src, int bytes) {
  asm volatile("cp.async.cg.shared.global.L2::128B [%0], [%1], 16, %2;" ::"r"(dst), "l"(src), "r"(bytes));
}
// 4-byte copy (per-token scales, index entries, log-sum-exps): the 16-byte form needs .cg, 4 bytes
// need .ca; `bytes` 0 zero-fills.
__device__ __forceinline__ void cp_async4(unsigned dst, const void* src, int bytes) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;" ::"r"(dst), "l"(src), "r"(bytes));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;" ::"n"(N));
}

// Four 8x8 16-bit matrices: lane l gives the address of row l % 8 of matrix l / 8; thread (g, j)
// receives row g, elements 2j and 2j + 1 of each matrix.
__device__ __forceinline__ void ldmatrix_x4(std::uint32_t (&r)[4], unsigned addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
// The same, each matrix transposed: thread (g, j) receives elements (2j, g) and (2j + 1, g).
__device__ __forceinline__ void ldmatrix_x4_trans(std::uint32_t (&r)[4], unsigned addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

}  // namespace detail
}  // namespace kvsift
