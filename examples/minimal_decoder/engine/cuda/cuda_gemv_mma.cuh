#pragma once
// The decode GEMV on tensor cores: gemv_bf16_pipelined's weight stream (persistent blocks, a cp.async
// ring of 64 KB per block, the first stages issued before the PDL wait, the bf16 inputs cached in
// shared memory) with the products done by mma.sync.m16n8k16 (bf16 operands, fp32 accumulation).
//
// Why: the scalar GEMVs spend per 16 bytes of weights 8 unpacks plus 8 FMAs per input row, and their
// input chunk's conversion per row again. At 4-8 input rows that is 250-450 instructions per 64 bytes
// a thread streams, which at the HBM rate of one SM (~34 GB/s) is half to all of its issue slots: the
// batch-4 projections ran at ~52% of the read ceiling (docs/performance.md). One mma does a 16-row by
// 16-column block of weights against 8 input rows, so the arithmetic per byte no longer depends on
// the number of input rows (1-8: the batch fills the mma's N; unused columns are zeros).
//
// Layout. A tile is 16 weight rows (the mma's M). Warp w streams columns 64 u .. 64 u + 63 of the
// tile's 16 rows per step, u = w, w + 8, ... (a block covers 512 columns of 16 rows a step), into its
// own 2 KB of the stage: 16 rows of 8 16-byte chunks. Its four copy instructions each take 4 whole
// rows' 128 bytes (lane l: row 4 h + l / 8, chunk l % 8), so every instruction reads whole 128-byte
// lines: one L2 request a line. (Before, each thread copied the chunks it consumes, chunks t and t + 4
// of rows g and g + 8, and each instruction took 64 bytes of each of 8 rows, so every line took two
// requests; with chunks 2t and 2t + 1 every instruction read half of each 32-byte sector, which
// doubled the L2 requests and halved the speed, measured.) The consumer, lane 4 g + t, reads chunks t
// and t + 4 of rows g and g + 8 out of the warp's stage. A thread's 16 values per row feed four mmas
// of k16; which column of the matrix sits in which k slot of an mma does not matter to a dot product
// as long as the weights (A) and the inputs (B) use the same map, so the thread's registers are the
// mma fragments as read, with no shuffle and no ldmatrix: for mma m, A's k slots 2t, 2t + 1 hold the
// thread's values 4m, 4m + 1 and slots 2t + 8, 2t + 9 its values 4m + 2, 4m + 3, and B (input row n =
// g, from the thread's own input chunks) the same values of the input. Chunk c of stage row r sits at
// c ^ (4 (r & 1)): the 8 lanes of a quarter warp read rows g and g + 1, chunks t (or t + 4), which so
// fall in disjoint banks; a copy instruction's quarter warp writes one row's 8 chunks, a permutation.
// Since lanes read each other's copies, a warp barrier (no block barrier) follows each step's wait,
// and one precedes the refill of the slot the warp read last. The cached input rows are padded by 64
// bytes for the same reason (lanes of rows g and g + 1 read chunks t of both). One block barrier per
// tile sums the 8 warps' fragments in a fixed order, and one after the prologue publishes the input,
// which all threads fill together (below).
//
// The result is deterministic (the mma's order is fixed, the warps' sum is fixed, and neither
// depends on the grid or on which block takes which tile), so graph replay and direct launches agree
// bit for bit; it differs from the scalar GEMVs' bits by summation order only (the products are the
// same bf16 x bf16 products, exact in fp32).

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <type_traits>

#include "cuda_gemv_pipelined.cuh"

namespace minimal_decoder {
namespace kernels {

constexpr int kMmaTileRows = 16;  // weight rows per tile: the mma's M
constexpr int kMmaStages = 4;     // steps in flight per thread; a power of two
constexpr int kMmaSlots = 4;      // 16-byte copies per thread per step: 4 rows' 128-byte lines a warp each
constexpr int kMmaInputs = 8;     // the mma's N: input rows per launch at most
constexpr int kMmaInputPad = 4;   // 16-byte chunks after each cached input row (bank spread)

// A stage row's chunk c sits at c ^ mma_chunk_swizzle(r) (the layout note above).
__device__ inline int mma_chunk_swizzle(int row) { return (row & 1) * 4; }

// 16 bytes global -> shared, or 16 zero bytes when !valid (past the last column; src must still be an
// address of the row, it is not read).
__device__ inline void cp_async16_or_zero(uint4* smem_dst, const uint4* src, bool valid, std::uint64_t policy) {
  const unsigned dst = static_cast<unsigned>(__cvta_generic_to_shared(smem_dst));
  const int bytes = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global.L2::cache_hint [%0], [%1], 16, %2, %3;" ::"r"(dst), "l"(src), "r"(bytes), "l"(policy)
               : "memory");
}

// c += a b: a 16x16 bf16 (row), b 16x8 bf16 (col), c 16x8 fp32.
__device__ inline void mma_m16n8k16_bf16(float (&c)[4], std::uint32_t a0, std::uint32_t a1, std::uint32_t a2, std::uint32_t a3,
                                         std::uint32_t b0, std::uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// Requires cols % 8 == 0 and 16-byte aligned w, x, up; the grid no larger than the tile count.
// Dynamic shared memory: gemv_mma_ring_bytes (+ gemv_mma_input_bytes with kCacheInput).
// The launch bounds' blocks an SM are the ones the shared memory allows (3 at one input row, else 2 or
// fewer): told them, ptxas keeps the prologue's loads in flight together within the registers that
// leaves; told none, it held them to ~40 registers and put each chunk's rounding before the next
// chunk's loads. kPairs: the SwiGLU pairs (GemvTargets::swiglu): a tile's rows 0-7 are 8 rows of the gate,
// rows 8-15 the same rows of the up, so lane (g, t)'s accumulators hold both factors of row g.
template <int N, int S, bool kSwiGLU, bool kCacheInput, bool kNorm, bool kPairs = false>
__global__ void __launch_bounds__(kGemvThreads, N == 1 ? 3 : 2) gemv_bf16_mma(const __grid_constant__ GemvTargets targets, int cols,
                                                              const float* __restrict__ x, const float* __restrict__ up,
                                                              const __grid_constant__ NormInput norm) {
  static_assert(N >= 1 && N <= kMmaInputs, "input rows: the mma's N");
  static_assert(!kPairs || (kCacheInput && !kSwiGLU), "the pairs' gate/up read a cached input");
  static_assert((S & (S - 1)) == 0 && S >= 2, "stages: a power of two, at least 2");
  static_assert(!kNorm || (kCacheInput && !kSwiGLU), "the norm is computed once, into the input cache");
  static_assert(kGemvThreads == kThreads, "the norm's partial sums follow the norm kernel's thread layout");
  constexpr int R = kMmaTileRows;
  constexpr int kWarps = kGemvThreads / 32;
  extern __shared__ uint4 gemv_smem[];
  uint4* const ring = gemv_smem;                                  // [S][warp][16 rows][8 chunks]
  uint4* const input = gemv_smem + S * kMmaSlots * kGemvThreads;  // [N][chunks + kMmaInputPad] bf16 inputs (kCacheInput)
  __shared__ float partial[2][kWarps][R][N];                      // double-buffered as in gemv_bf16_pipelined

  const int tid = int(threadIdx.x), warp = tid / 32, lane = tid % 32;
  const int g = lane / 4, t = lane % 4;  // the mma's group (A row, B column) and thread in group
  const int chunks = cols / 8;
  const int in_stride = chunks + kMmaInputPad;  // a cached input row, in chunks
  const int groups = (chunks + 7) / 8;  // 64-column groups of a row; warp w takes w, w + 8, ...
  const int tiles = targets.first_block[targets.count];
  const int per_tile = warp < groups ? (groups - 1 - warp) / kWarps + 1 : 0;  // the same in a whole warp
  const int my_tiles = int(blockIdx.x) < tiles ? (tiles - 1 - int(blockIdx.x)) / int(gridDim.x) + 1 : 0;
  const int steps = per_tile * my_tiles;
  const std::uint64_t policy = l2_evict_first_policy();
  // This lane's copies: chunk c8 of stage rows 4 h + l / 8, h < kMmaSlots.
  const int copy_row = lane / 8, c8 = lane % 8;
  constexpr int kStageChunks = R * 8;  // a warp's part of a stage: 16 rows of 8 chunks
  static_assert(kWarps * kStageChunks == kMmaSlots * kGemvThreads && R == 4 * kMmaSlots, "a lane's copies fill its warp's stage");
  const auto stage = [&](int step) { return ring + ((step & (S - 1)) * kWarps + warp) * kStageChunks; };

  // The issue cursor runs S - 1 steps ahead of consumption, across tile boundaries.
  int issued = 0, issue_j = 0, issue_tile = int(blockIdx.x);
  const uint4* issue_rows[kMmaSlots];
  const auto aim = [&](int tile) {
    const GemvTile gt = gemv_tile<R, kPairs>(targets, tile);
    const int rows = targets.rows[gt.target];
    for (int h = 0; h < kMmaSlots; ++h) {  // rows past the end re-read the last row and are not written
      const int r = 4 * h + copy_row, target = kPairs ? r / (R / 2) : gt.target, row = kPairs ? gt.first_row + r % (R / 2) : gt.first_row + r;
      issue_rows[h] = reinterpret_cast<const uint4*>(targets.w[target] + std::int64_t(min(row, rows - 1)) * cols);
    }
  };
  const auto issue = [&] {
    if (issued < steps) {
      uint4* slot = stage(issued);
      const int c = 8 * (warp + issue_j * kWarps) + c8;  // this lane's chunk of its 4 rows
      for (int h = 0; h < kMmaSlots; ++h) {
        const int r = 4 * h + copy_row;
        cp_async16_or_zero(slot + r * 8 + (c8 ^ mma_chunk_swizzle(r)), issue_rows[h] + min(c, chunks - 1), c < chunks, policy);
      }
      ++issued;
      if (++issue_j == per_tile) {
        issue_j = 0;
        issue_tile += int(gridDim.x);
        if (issued < steps) aim(issue_tile);
      }
    }
    cp_async_commit();  // one group per call, empty or not: group g is step g
  };

  if (steps > 0) aim(issue_tile);
  for (int p = 0; p < S - 1; ++p) issue();  // weights only: before the dependency wait
  wait_for_previous_kernel();
  allow_next_kernel_launch();

  // The norm of every input row, as gemv_bf16_pipelined computes it (all threads take part in every
  // row's block reduction).
  [[maybe_unused]] float inv[N];
  if constexpr (kNorm) fused_norm_inverse_rms<N>(norm, cols, inv);
  // The whole input, rounded to bf16, into shared memory before the first tile, by all threads
  // together: every tile spans every column, and a block often has a single tile (q/k/v: 384 tiles for
  // 396 blocks), so inputs fetched step by step inside the loop put an L2 round trip into every step
  // (the down projection ran at half speed in the decoder so, measured). A round's kUnroll chunks a
  // thread are all loaded before any is rounded (InputChunk): 4 input rows of 4096 columns (8 chunks a
  // thread) take one L2 round trip, not 8 in series as when each chunk was rounded as it came. Past
  // the last chunk a thread loads the last one again (no branch between the loads) and stores nothing.
  if constexpr (kCacheInput) {
    // Chunks a round: at one input row (3 blocks an SM, 80 registers) 2, a 4096-column row's share;
    // from 2 rows (up to 128 registers) 8, or 4 of the SwiGLU's two inputs; the norm's chunks (x,
    // delta and the weight: 24 registers each) 2.
    constexpr int kUnroll = N == 1 || kNorm ? 2 : kSwiGLU ? 4 : 8;
    using Raw = std::conditional_t<kNorm, NormedChunk, InputChunk<kSwiGLU>>;
    const int total = N * chunks;
    for (int base = tid; base < total; base += kUnroll * kGemvThreads) {
      Raw raw[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int e = min(base + u * kGemvThreads, total - 1);
        if constexpr (kNorm) raw[u] = load_normed_chunk(norm, e, 8 * (e % chunks));
        else raw[u] = load_input_chunk<kSwiGLU>(x, up, e);
      }
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        // Every chunk rounded, the store predicated: with a branch past the last chunk the compiler
        // sank each chunk's loads into its branch, behind the previous chunk's rounding.
        const int e = min(base + u * kGemvThreads, total - 1);
        uint4 v;
        if constexpr (kNorm) {
          float row_inv = inv[0];  // inv[e / chunks], selected (an indexed register array would go to local memory)
          for (int i = 1; i < N; ++i)
            if (e / chunks == i) row_inv = inv[i];
          v = round_normed_chunk(norm, raw[u], row_inv);
        } else {
          v = round_input_chunk<kSwiGLU>(raw[u]);
        }
        if (base + u * kGemvThreads < total) input[(e / chunks) * in_stride + e % chunks] = v;
      }
    }
    __syncthreads();
  }

  int s = 0;
  for (int k = 0; k < my_tiles; ++k) {
    float acc[4] = {};
    for (int j = 0; j < per_tile; ++j, ++s) {
      __syncwarp();            // every lane has read the slot that issue() refills (consumed in the previous iteration)
      issue();                 // refills the slot consumed in the previous iteration (see gemv_bf16_pipelined)
      cp_async_wait<S - 1>();  // this lane's copies of step s landed
      __syncwarp();            // and every other lane's: the warp reads them all
      const uint4* slot = stage(s);
      const int sw = mma_chunk_swizzle(g);  // rows g and g + 8 alike
      const uint4 w0 = slot[g * 8 + (t ^ sw)], w1 = slot[g * 8 + ((t + 4) ^ sw)];
      const uint4 w8 = slot[(g + 8) * 8 + (t ^ sw)], w9 = slot[(g + 8) * 8 + ((t + 4) ^ sw)];
      // This thread's input chunks (row g; zeros past the input rows and the last column).
      uint4 in[2] = {make_uint4(0, 0, 0, 0), make_uint4(0, 0, 0, 0)};
      if (g < N) {
        const int c = 8 * (warp + j * kWarps) + t;
        for (int q = 0; q < 2; ++q) {
          const int cq = c + 4 * q;
          if (cq >= chunks) break;
          if constexpr (kCacheInput) in[q] = input[g * in_stride + cq];
          else in[q] = load_input_bf16<kSwiGLU>(x, up, std::int64_t(g) * chunks + cq);  // slow: the backend routes these away
        }
      }
      // mma m takes the thread's values 4m..4m+3 of each row: words 2m and 2m + 1 of its 16 values.
      const std::uint32_t wr[8] = {w0.x, w0.y, w0.z, w0.w, w1.x, w1.y, w1.z, w1.w};
      const std::uint32_t wr8[8] = {w8.x, w8.y, w8.z, w8.w, w9.x, w9.y, w9.z, w9.w};
      const std::uint32_t xr[8] = {in[0].x, in[0].y, in[0].z, in[0].w, in[1].x, in[1].y, in[1].z, in[1].w};
      for (int m = 0; m < 4; ++m) mma_m16n8k16_bf16(acc, wr[2 * m], wr8[2 * m], wr[2 * m + 1], wr8[2 * m + 1], xr[2 * m], xr[2 * m + 1]);
    }
    // acc: rows g and g + 8 of the tile, input rows 2t and 2t + 1.
    float(*part)[R][N] = partial[k & 1];
    for (int e = 0; e < 2; ++e)
      if (2 * t + e < N) {
        part[warp][g][2 * t + e] = acc[e];
        part[warp][g + 8][2 * t + e] = acc[2 + e];
      }
    __syncthreads();
    if constexpr (kPairs) {
      // Both factors of a row in the order a lone tile sums them, then the down GEMV's SwiGLU and rounding.
      // (gemv_bf16_pipelined's epilogue is the same code, kept inline in both: a shared helper moved
      // registers and instructions in 13 of the measured kernels' SASS.)
      if (tid < (R / 2) * N) {
        const GemvTile gt = gemv_tile<R, true>(targets, int(blockIdx.x) + k * int(gridDim.x));
        const int rows = targets.rows[0];
        const int r = tid / N, i = tid % N;
        float gate = 0.f, up_sum = 0.f;
        for (int w = 0; w < kWarps; ++w) gate += part[w][r][i];
        for (int w = 0; w < kWarps; ++w) up_sum += part[w][r + R / 2][i];
        if (gt.first_row + r < rows)
          targets.swiglu[std::int64_t(i) * rows + gt.first_row + r] = __float2bfloat16_rn(swiglu1(gate, up_sum));
      }
    } else if (tid < R * N) {
      const GemvTile gt = gemv_tile<R>(targets, int(blockIdx.x) + k * int(gridDim.x));
      const int rows = targets.rows[gt.target];
      const int r = tid / N, i = tid % N;
      float sum = 0.f;
      for (int w = 0; w < kWarps; ++w) sum += part[w][r][i];  // fixed order: deterministic
      if (gt.first_row + r < rows) targets.y[gt.target][std::int64_t(i) * rows + gt.first_row + r] = sum;
    }
  }
  cp_async_wait<0>();  // only empty groups remain; leave nothing in flight
}

constexpr std::size_t gemv_mma_ring_bytes() { return std::size_t(kMmaStages) * kMmaSlots * kGemvThreads * sizeof(uint4); }
// The cached input rows, bf16, each padded by kMmaInputPad chunks.
inline std::size_t gemv_mma_input_bytes(int n, int cols) { return std::size_t(n) * (cols / 8 + kMmaInputPad) * sizeof(uint4); }
// Its static shared memory: the partial sums, and the norm's warp sums.
constexpr std::size_t gemv_mma_static_smem(int n, bool norm) {
  return sizeof(float) * 2 * (kGemvThreads / 32) * kMmaTileRows * n + (norm ? kNormStaticSmem : 0);
}

// Whether gemv_bf16_mma can apply a NormInput at n input rows of `cols` (gemv_norm_fits' rule, with
// this kernel's shared memory).
inline bool gemv_mma_norm_fits(int n, int cols, std::size_t optin_smem) {
  return n >= 1 && n <= kGemvNormMaxRows && cols % 8 == 0 &&
         gemv_mma_ring_bytes() + gemv_mma_input_bytes(n, cols) + gemv_mma_static_smem(n, true) <= optin_smem;
}

// Whether gemv_bf16_mma keeps n input rows of `cols` in shared memory (its fast form).
inline bool gemv_mma_caches_input(int n, int cols, std::size_t optin_smem) {
  return gemv_mma_ring_bytes() + gemv_mma_input_bytes(n, cols) + gemv_mma_static_smem(n, false) <= optin_smem;
}

template <int N, bool kSwiGLU, bool kCacheInput, bool kNorm = false, bool kPairs = false>
cudaError_t launch_gemv_mma_kernel(const GemvTargets& targets, int cols, const float* x, const float* up, const NormInput& norm,
                                   std::size_t smem, cudaStream_t stream, bool pdl) {
  return launch_persistent_gemv<gemv_bf16_mma<N, kMmaStages, kSwiGLU, kCacheInput, kNorm, kPairs>, gemv_mma_static_smem(N, kNorm)>(
      targets, cols, x, up, norm, smem, stream, pdl);
}

template <int N>
cudaError_t launch_gemv_mma_n(GemvTargets targets, int cols, const float* x, const float* up, const NormInput& norm,
                              cudaStream_t stream, bool pdl) {
  constexpr int R = kMmaTileRows;
  const bool pairs = targets.swiglu != nullptr;
  if (pairs && (targets.count != 2 || targets.rows[0] != targets.rows[1] || up)) return cudaErrorInvalidValue;
  gemv_tile_ranges<R>(targets);  // tiles here, not blocks
  if (targets.first_block[targets.count] == 0) return cudaSuccess;
  int device = 0, optin = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err == cudaSuccess) err = cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device);
  if (err != cudaSuccess) return err;
  const std::size_t ring = gemv_mma_ring_bytes();
  const std::size_t cached = ring + gemv_mma_input_bytes(N, cols);
  if (norm.x) {  // the norm needs the input cache
    if (up || !gemv_mma_norm_fits(N, cols, std::size_t(optin))) return cudaErrorInvalidValue;
    if constexpr (N <= kGemvNormMaxRows) {
      if (pairs) return launch_gemv_mma_kernel<N, false, true, true, true>(targets, cols, x, up, norm, cached, stream, pdl);
      return launch_gemv_mma_kernel<N, false, true, true>(targets, cols, x, up, norm, cached, stream, pdl);
    }
    return cudaErrorInvalidValue;
  }
  if (pairs) {  // the pairs keep their input in shared memory (gemv_mma_caches_input)
    if (!gemv_mma_caches_input(N, cols, std::size_t(optin))) return cudaErrorInvalidValue;
    return launch_gemv_mma_kernel<N, false, true, false, true>(targets, cols, x, up, norm, cached, stream, pdl);
  }
  // Inputs that do not fit beside the ring (the down projection's 14336 columns from 6 rows on) are
  // re-read from L2 in every step, an L2 round trip each: correct but slow (gemv_mma_caches_input; the
  // backend takes cuBLAS there).
  if (gemv_mma_caches_input(N, cols, std::size_t(optin))) {
    if (up) return launch_gemv_mma_kernel<N, true, true>(targets, cols, x, up, norm, cached, stream, pdl);
    return launch_gemv_mma_kernel<N, false, true>(targets, cols, x, up, norm, cached, stream, pdl);
  }
  if (up) return launch_gemv_mma_kernel<N, true, false>(targets, cols, x, up, norm, ring, stream, pdl);
  return launch_gemv_mma_kernel<N, false, false>(targets, cols, x, up, norm, ring, stream, pdl);
}

// launch_gemv_bf16_pipelined's contract, with gemv_bf16_mma; the SwiGLU pairs (targets.swiglu) at any n
// whose input the kernel caches (gemv_mma_caches_input).
inline cudaError_t launch_gemv_bf16_mma(const GemvTargets& targets, int cols, const float* x, int n, cudaStream_t stream,
                                        const float* up = nullptr, bool pdl = false, const NormInput& norm = {}) {
  switch (n) {
    case 1: return launch_gemv_mma_n<1>(targets, cols, x, up, norm, stream, pdl);
    case 2: return launch_gemv_mma_n<2>(targets, cols, x, up, norm, stream, pdl);
    case 3: return launch_gemv_mma_n<3>(targets, cols, x, up, norm, stream, pdl);
    case 4: return launch_gemv_mma_n<4>(targets, cols, x, up, norm, stream, pdl);
    case 5: return launch_gemv_mma_n<5>(targets, cols, x, up, norm, stream, pdl);
    case 6: return launch_gemv_mma_n<6>(targets, cols, x, up, norm, stream, pdl);
    case 7: return launch_gemv_mma_n<7>(targets, cols, x, up, norm, stream, pdl);
    case 8: return launch_gemv_mma_n<8>(targets, cols, x, up, norm, stream, pdl);
    default: return cudaErrorInvalidValue;
  }
}

}  // namespace kernels
}  // namespace minimal_decoder
