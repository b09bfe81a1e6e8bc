#pragma once
// Hopper's warpgroup MMA (wgmma), the form the window scores use: A (16 rows a warp of the 4-warp
// warpgroup) in registers, B (64 rows of 16-bit K-major operands) in shared memory behind a
// descriptor, fp32 accumulators. KVSIFT_WGMMA is 1 where the device code is compiled for sm_90a (the
// arch-specific target, `-arch=sm_90a` / CMAKE_CUDA_ARCHITECTURES 90a, kvsift's default), unless the
// build defines KVSIFT_NO_WGMMA (to measure the mma.sync path on the same target); the callers keep
// their mma.sync path otherwise (sm_90 without the suffix, and other architectures).
//
// Why: one wgmma m64n64k16 does the work of 32 mma.sync m16n8k16 and reads its B operand from shared
// memory itself, so the ldmatrix loads and most of the issue slots of the mma.sync loop go.
//
// The shared-memory layout the descriptor below describes (PTX ISA, "Shared Memory Matrix Layout",
// K-major, 128-byte swizzle): rows of 128 bytes (64 16-bit elements of K), 8-row groups of 1,024 bytes
// one after another, the 16-byte chunk c of row r stored at chunk c ^ (r % 8); a group must start on a
// 1,024-byte boundary. A k-step of 16 elements starts 32 bytes further into the rows (the hardware
// applies the swizzle to the address it forms).

#include <cstdint>

#if defined(__CUDA_ARCH_FEAT_SM90_ALL) && !defined(KVSIFT_NO_WGMMA)
#define KVSIFT_WGMMA 1
#else
#define KVSIFT_WGMMA 0
#endif

namespace kvsift {
namespace detail {

#if KVSIFT_WGMMA

// Descriptor of a K-major, 128-byte-swizzled operand starting at shared address `addr` (16-byte
// aligned; the 8-row groups 1,024 bytes apart). Fields (sm_90): start address >> 4 in bits 0-13,
// leading byte offset >> 4 in 16-29 (unused by swizzled K-major layouts: 1), stride byte offset >> 4
// in 32-45, base offset 0 in 49-51 (the groups are 1,024-byte aligned), layout 1 (128-byte swizzle) in
// 62-63.
__device__ __forceinline__ std::uint64_t wgmma_desc_k128(unsigned addr) {
  return std::uint64_t((addr & 0x3FFFFu) >> 4) | (std::uint64_t(1) << 16) | (std::uint64_t(1024 >> 4) << 32) |
         (std::uint64_t(1) << 62);
}

// The descriptor of the operand `bytes` further on (inside the same shared-memory allocation): one add
// to the start-address field, which cannot carry into the next field, shared addresses being below
// 2^18. Forming each k-step's descriptor from its address took ~3 uniform instructions a wgmma.
__device__ __forceinline__ std::uint64_t wgmma_desc_advance(std::uint64_t desc, unsigned bytes) {
  return desc + std::uint64_t(bytes >> 4);
}

// Orders this thread's earlier register writes (accumulators, A fragments) before the wgmma that read
// them; and its earlier generic-proxy writes to shared memory (cp.async into a ring slot) before the
// async proxy's reads.
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void fence_proxy_async_shared() { asm volatile("fence.proxy.async.shared::cta;" ::: "memory"); }
// Ties a register to this point of the program: an empty asm that reads and writes it, so the compiler
// moves no access to an accumulator across the wgmma fence and wait around it (reading one before the
// wait that covers its wgmma is undefined).
__device__ __forceinline__ void wgmma_fence_operand(float& r) { asm volatile("" : "+f"(r)::"memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(N) : "memory");
}

// d (64 x 64, fp32) += A (64 x 16, registers: a[0..3] as mma.sync m16n8k16's A fragment of this warp's
// 16 rows) x B (16 x 64: 64 K-major rows of 16 elements at descriptor `desc`). d[4 j + e] is the
// mma.sync C fragment of key block j (8 columns): rows g, g + 8 of the warp's 16, columns 8 j + 2 t, + 1.
// `accumulate` 0 overwrites d.
template <bool kBF16>
__device__ __forceinline__ void wgmma_m64n64k16_rs(float (&d)[32], const std::uint32_t (&a)[4], std::uint64_t desc,
                                                   int accumulate) {
#define KVSIFT_WGMMA_D                                                                                              \
  "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]),      \
      "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]),       \
      "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]),      \
      "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
#define KVSIFT_WGMMA_BODY(TYPE)                                                                                    \
  "{\n.reg .pred p;\nsetp.ne.b32 p, %38, 0;\n"                                                                     \
  "wgmma.mma_async.sync.aligned.m64n64k16.f32." TYPE "." TYPE " "                                                  \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, " \
  "%24, %25, %26, %27, %28, %29, %30, %31}, {%32, %33, %34, %35}, %36, p, 1, 1, %37;\n}\n"
  if constexpr (kBF16) {
    asm volatile(KVSIFT_WGMMA_BODY("bf16")
                 : KVSIFT_WGMMA_D
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "n"(0), "r"(accumulate));
  } else {
    asm volatile(KVSIFT_WGMMA_BODY("f16")
                 : KVSIFT_WGMMA_D
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "n"(0), "r"(accumulate));
  }
#undef KVSIFT_WGMMA_BODY
#undef KVSIFT_WGMMA_D
}

#endif  // KVSIFT_WGMMA

}  // namespace detail
}  // namespace kvsift
