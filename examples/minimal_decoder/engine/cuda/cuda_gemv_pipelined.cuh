#pragma once
// The decode GEMV with a deep weight pipeline: the same product as gemv_bf16 (cuda_gemv.cuh), bit
// for bit, organised so that HBM never waits for the arithmetic, the block barriers or the block
// launches. The backend's default; gemv_bf16 stays for comparison (bench_decoder_gemv, and
// CudaBackend::GemvKernel::kBlocked).
//
// What limited gemv_bf16 (bench_decoder_gemv on the H200: q 51% of the read ceiling, 133 us per
// layer against a 98 us floor, slower at 4-8 input rows):
//   - a block lives for one 4-row tile: it issues its loads, waits one HBM latency with nothing
//     else in flight, reduces across warps and exits; every block pays a ramp and a tail;
//   - the loads in flight are registers (current + next chunk of 4 rows = 32 registers), which
//     at 4-8 input rows pushes the kernel to ~100 registers and 2 blocks per SM;
//   - every block rounds (and for the down projection, SwiGLUs) the whole input again.
//
// Here:
//   - persistent blocks: the grid is what fits on the GPU at once, each block walks tiles
//     blockIdx.x, blockIdx.x + gridDim.x, ... in a single pipeline, so the loads of the next tile
//     are in flight while the current one is reduced;
//   - the pipeline is cp.async into shared memory, kStages steps of 16 bytes of each of R rows
//     per thread, kStages * R * 16 B = 256 B per thread in flight, 64 KB per block (the loads
//     occupy no registers, so the register count does not grow with the depth);
//   - each thread copies and consumes only its own slots, so the pipeline needs no barrier:
//     cp.async.wait_group orders a thread's copies with its own reads;
//   - the input rows, rounded to bf16, are kept in shared memory after the block's first tile
//     (again each thread keeps the chunks it uses, so no barrier), when they fit: the rounding and
//     the SwiGLU are paid once per block instead of once per tile;
//   - with PDL (cuda_pdl.cuh) the first kStages - 1 steps are issued before the dependency wait:
//     the weights do not depend on the previous kernel, so the stream starts while it drains;
//   - the RMSNorm before q/k/v and gate/up (with its residual add) can run in the prologue
//     (NormInput): every block derives the normalized input itself with the norm kernel's
//     arithmetic, so the norm's own launch and its round trip leave the step;
//   - the gate/up GEMV can compute the SwiGLU in its epilogue (GemvTargets::swiglu: a tile holds the
//     same rows of gate and up) and write the down projection's input in bf16, which down then reads
//     as it is (GemvIo::kBf16): every down block used to read the two float vectors (4x the bytes: 114 KB
//     a block at 14336 columns, ~30 MB of L2 reads a launch at one row) and compute its own SwiGLU of
//     all of them before its first tile's products.
//
// The arithmetic is gemv_bf16's: thread tid owns chunks tid, tid + kGemvThreads, ... of every
// row, accumulates them in that order with the same fmaf sequence, then the same warp shuffles and
// the same fixed-order sum over warps. The result does not depend on the grid size or on which
// block takes which tile, so graph replay, direct launches and the old kernel all agree bit for bit.

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "cuda_block_rms.cuh"
#include "cuda_block_row.cuh"
#include "cuda_gemv.cuh"
#include "cuda_pdl.cuh"

namespace minimal_decoder {
namespace kernels {

constexpr int kPipelinedRows = 4;    // weight rows per tile (R): each input chunk serves 4 rows
constexpr int kPipelinedStages = 4;  // steps in flight per thread; a power of two

// An L2 policy that lets the weights (read once per step) go first, so they do not evict the
// activations and the KV cache's hot rows.
__device__ inline std::uint64_t l2_evict_first_policy() {
  std::uint64_t policy;
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(policy));
  return policy;
}

// 16 bytes global -> shared without passing through registers (sm_80+), L2 only.
__device__ inline void cp_async16(uint4* smem_dst, const uint4* src, std::uint64_t policy) {
  const unsigned dst = static_cast<unsigned>(__cvta_generic_to_shared(smem_dst));
  asm volatile("cp.async.cg.shared.global.L2::cache_hint [%0], [%1], 16, %2;" ::"r"(dst), "l"(src), "l"(policy) : "memory");
}
__device__ inline void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
// Waits until at most `Pending` of this thread's committed groups are still in flight.
template <int Pending>
__device__ inline void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;" ::"n"(Pending) : "memory");
}

// Input chunk i (8 values) as loaded: x's, and for the SwiGLU down projection the gate's (x) and up's.
// The loads are L2-coherent (ld.global.cg), not read-only-cache loads: under PDL the previous kernel
// writes x during this kernel's lifetime (before the wait), which ld.global.nc forbids. A prologue that
// fills a whole input loads a round of chunks before it rounds any (gemv_bf16_mma): rounded one by one,
// each chunk's conversion waited for its loads before the next chunk's were issued (the SASS ran LDG,
// F2FP, LDG, ...: one L2 round trip per chunk in series).
template <bool kSwiGLU>
struct InputChunk {
  float4 a, b;    // x
  float4 ua, ub;  // up (kSwiGLU)
};
template <bool kSwiGLU>
__device__ inline InputChunk<kSwiGLU> load_input_chunk(const float* x, const float* up, std::int64_t i) {
  InputChunk<kSwiGLU> c;
  const float4* xr = reinterpret_cast<const float4*>(x) + 2 * i;
  c.a = __ldcg(xr), c.b = __ldcg(xr + 1);
  if constexpr (kSwiGLU) {
    const float4* ur = reinterpret_cast<const float4*>(up) + 2 * i;
    c.ua = __ldcg(ur), c.ub = __ldcg(ur + 1);
  }
  return c;
}

// The chunk rounded to bf16 and packed (after the SwiGLU): gemv_bf16's load_input, same arithmetic.
template <bool kSwiGLU>
__device__ inline uint4 round_input_chunk(const InputChunk<kSwiGLU>& c) {
  float4 a = c.a, b = c.b;
  if constexpr (kSwiGLU) {
    a = swiglu4(a, c.ua);
    b = swiglu4(b, c.ub);
  }
  uint4 packed;
  __nv_bfloat162 p[4] = {__floats2bfloat162_rn(a.x, a.y), __floats2bfloat162_rn(a.z, a.w), __floats2bfloat162_rn(b.x, b.y),
                         __floats2bfloat162_rn(b.z, b.w)};
  static_assert(sizeof(p) == sizeof(packed), "8 bf16 in 16 bytes");
  memcpy(&packed, p, sizeof(packed));
  return packed;
}

// Input chunk i rounded to bf16 and packed, one chunk at a time: the arithmetic of load_input_chunk
// then round_input_chunk, with the up loads after the gate's (the order the pipelined GEMV's SwiGLU
// kernels were measured with; routed through the two helpers they compile differently).
template <bool kSwiGLU>
__device__ inline uint4 load_input_bf16(const float* x, const float* up, std::int64_t i) {
  const float4* xr = reinterpret_cast<const float4*>(x) + 2 * i;
  float4 a = __ldcg(xr), b = __ldcg(xr + 1);
  if (kSwiGLU) {
    const float4* ur = reinterpret_cast<const float4*>(up) + 2 * i;
    a = swiglu4(a, __ldcg(ur));
    b = swiglu4(b, __ldcg(ur + 1));
  }
  InputChunk<false> rounded;
  rounded.a = a, rounded.b = b;
  return round_input_chunk<false>(rounded);
}

// The norm a GEMV can apply to its input in its prologue: v = x (+ delta), x_out = v (when set; not
// x or delta), input = rms_norm(v) * w, i.e. kernels::add_rms_norm (or rms_norm without delta)
// followed by the GEMV, bit for bit. x, delta, x_out: [n, cols]; w: [cols].
struct NormInput {
  const float* x = nullptr;  // null: no norm, the GEMV reads its input as given
  const float* delta = nullptr;
  float* x_out = nullptr;
  const float* w = nullptr;
  float eps = 0.f;
};
// The input rows up to which the norm is fused: at one row it saves the norm's launch (dense 128K step
// 8.95 -> 8.69 ms on the H200), at four its serial block reductions before the first tile cost more
// than the launch (21.96 -> 22.51 ms; docs/performance.md, eleventh session). Only these row counts
// instantiate the norm.
constexpr int kGemvNormMaxRows = 1;
// The static shared memory the norm adds (block_inverse_rms' warp sums).
constexpr std::size_t kNormStaticSmem = sizeof(float) * (kThreads / 32);

// The prologue's norm: inv[i] = block_inverse_rms of input row i, each thread's partial sum over its
// elements t, t + kGemvThreads, ... in add_rms_norm's order, so inv is the norm kernel's bit for bit.
// Its loads carry no store between them (cuda_block_row.cuh: block 0 also wrote the residual sum inside
// this loop, which put every block's loads in series behind those stores: 16 L2 round trips for 4096
// columns, while the weight stream idled behind its first stages). The residual sum x_out is written
// after, a slice by each block.
// stage (optional, rows of one segment only): the rows' values x (+ delta) as float, [N][cols], published
// by block_inverse_rms' barrier.
template <int N>
__device__ inline void fused_norm_inverse_rms(const NormInput& norm, int cols, float (&inv)[N], float* stage = nullptr) {
  for (int i = 0; i < N; ++i) {
    const float* xr = norm.x + std::int64_t(i) * cols;
    const float* dr = norm.delta ? norm.delta + std::int64_t(i) * cols : nullptr;
    float ss = 0.f;
    for (int base = 0; base < cols; base += row_segment_size()) {
      float v[kRowSlots];
      if (dr) load_row_segment([&](int e) { return __ldcg(xr + e) + __ldcg(dr + e); }, cols, base, v);
      else load_row_segment([&](int e) { return __ldcg(xr + e); }, cols, base, v);
#pragma unroll
      for (int k = 0; k < kRowSlots; ++k) ss += v[k] * v[k];  // 0 past cols: adds nothing
      if (stage) store_row_segment([&](int e, float value) { stage[std::int64_t(i) * cols + e] = value; }, cols, base, v);
    }
    inv[i] = block_inverse_rms(ss, cols, norm.eps);
    __syncthreads();  // block_inverse_rms' shared sums are reused by the next row
  }
  if (norm.x_out) {
    const std::int64_t total = std::int64_t(N) * cols, stride = std::int64_t(gridDim.x) * blockDim.x;
    for (std::int64_t e = std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x; e < total; e += stride)
      norm.x_out[e] = norm.delta ? __ldcg(norm.x + e) + __ldcg(norm.delta + e) : __ldcg(norm.x + e);
  }
}

// Input chunk i (8 values, row-major over [n, cols]; `col` its first column) of the norm's input as
// loaded: x's, delta's and the norm weight's (InputChunk's reason for loading apart from rounding).
struct NormedChunk {
  float4 a, b;    // x
  float4 c, d;    // delta (when set)
  float4 w0, w1;  // the norm's weight
};
__device__ inline NormedChunk load_normed_chunk(const NormInput& norm, std::int64_t i, int col) {
  NormedChunk n;
  const float4* xr = reinterpret_cast<const float4*>(norm.x) + 2 * i;
  n.a = __ldcg(xr), n.b = __ldcg(xr + 1);
  if (norm.delta) {
    const float4* dr = reinterpret_cast<const float4*>(norm.delta) + 2 * i;
    n.c = __ldcg(dr), n.d = __ldcg(dr + 1);
  }
  const float4* wr = reinterpret_cast<const float4*>(norm.w + col);
  n.w0 = __ldg(wr), n.w1 = __ldg(wr + 1);
  return n;
}

// The normalized values v (x + delta) of a chunk rounded to bf16: add_rms_norm's expression
// (v * inv) * w, then round_input_chunk's rounding.
__device__ inline uint4 round_normed(const float (&v)[8], const float (&w)[8], float inv) {
  uint4 packed;
  __nv_bfloat162 p[4];
  for (int q = 0; q < 4; ++q) p[q] = __floats2bfloat162_rn(v[2 * q] * inv * w[2 * q], v[2 * q + 1] * inv * w[2 * q + 1]);
  static_assert(sizeof(p) == sizeof(packed), "8 bf16 in 16 bytes");
  memcpy(&packed, p, sizeof(packed));
  return packed;
}

// A loaded chunk normalized and rounded.
__device__ inline uint4 round_normed_chunk(const NormInput& norm, const NormedChunk& n, float inv) {
  float v[8] = {n.a.x, n.a.y, n.a.z, n.a.w, n.b.x, n.b.y, n.b.z, n.b.w};
  if (norm.delta) {
    v[0] += n.c.x, v[1] += n.c.y, v[2] += n.c.z, v[3] += n.c.w, v[4] += n.d.x, v[5] += n.d.y, v[6] += n.d.z, v[7] += n.d.w;
  }
  const float w[8] = {n.w0.x, n.w0.y, n.w0.z, n.w0.w, n.w1.x, n.w1.y, n.w1.z, n.w1.w};
  return round_normed(v, w, inv);
}

// The normalized input's chunk i rounded to bf16, one chunk at a time: the arithmetic of
// load_normed_chunk then round_normed_chunk, with the loads in the order the pipelined GEMV's fused
// norm was measured with (routed through those two its kernels compile differently).
__device__ inline uint4 load_normed_bf16(const NormInput& norm, float inv, std::int64_t i, int col) {
  float v[8];
  const float4* xr = reinterpret_cast<const float4*>(norm.x) + 2 * i;
  const float4 a = __ldcg(xr), b = __ldcg(xr + 1);
  v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
  if (norm.delta) {
    const float4* dr = reinterpret_cast<const float4*>(norm.delta) + 2 * i;
    const float4 c = __ldcg(dr), d = __ldcg(dr + 1);
    v[0] += c.x, v[1] += c.y, v[2] += c.z, v[3] += c.w, v[4] += d.x, v[5] += d.y, v[6] += d.z, v[7] += d.w;
  }
  const float4* wr = reinterpret_cast<const float4*>(norm.w + col);
  const float4 w0 = __ldg(wr), w1 = __ldg(wr + 1);
  const float w[8] = {w0.x, w0.y, w0.z, w0.w, w1.x, w1.y, w1.z, w1.w};
  return round_normed(v, w, inv);
}

// What a pipelined GEMV reads and writes: its input, and y or the SwiGLU pairs' bf16 output.
enum class GemvIo {
  kFloat,       // x -> y
  kSwiGLU,      // silu(x) * up -> y (the down projection from gate and up as the GEMVs wrote them)
  kNorm,        // rms_norm(x (+ delta)) (NormInput) -> y
  kBf16,        // x holding bf16 values (the SwiGLU pairs' output) -> y
  kFloatPairs,  // x -> GemvTargets::swiglu (gate and up of one MLP, paired)
  kNormPairs,   // rms_norm(x (+ delta)) -> GemvTargets::swiglu
};
__host__ __device__ constexpr bool gemv_io_norm(GemvIo io) { return io == GemvIo::kNorm || io == GemvIo::kNormPairs; }
__host__ __device__ constexpr bool gemv_io_pairs(GemvIo io) { return io == GemvIo::kFloatPairs || io == GemvIo::kNormPairs; }

// The staged norm (the pipelined GEMV, kNorm): rows of at most kNormStageFloats values (llama3-8b's
// 4096) are kept, as the norm's pass loads them, in the ring slot the prologue leaves free (the loop's
// first copy is the first to fill it), and the input cache is filled from there: the first tile then
// reads its inputs from shared memory like every later one. It read x, delta and the norm weight again
// from L2 (48 KB a block at 4096 columns, on top of the pass's 32 KB; ~19 MB a launch over 396 blocks,
// twice a layer), one step at a time, while the weight stream waited on each. Same values, same
// expression, same rounding: the same bits.
constexpr int kNormStageFloats = kPipelinedRows * kGemvThreads * int(sizeof(uint4) / sizeof(float));
static_assert(kNormStageFloats <= kRowSlots * kThreads, "a staged row is one segment of the norm's pass");
constexpr int kNormStageChunks = kNormStageFloats / 8 / kGemvThreads;  // input chunks of a thread, at most

// The input cache's chunks of this thread (c = tid + j * kGemvThreads, j < per_tile) from the staged rows
// and the norm weight. The weight's chunks are loaded here, after the pass: loaded before the dependency
// wait (a model weight) they were live across the pass, and ptxas spilled one right behind its load,
// which put their round trip in series before the pass's loads of x and delta.
template <int N>
__device__ inline void fill_normed_input(const float* stage, const float* norm_w, const float (&inv)[N], int cols, int per_tile,
                                         uint4* input) {
  const int chunks = cols / 8;
  float4 w[kNormStageChunks][2];
#pragma unroll
  for (int j = 0; j < kNormStageChunks; ++j)
    if (j < per_tile) {
      const float4* wr = reinterpret_cast<const float4*>(norm_w + 8 * (int(threadIdx.x) + j * kGemvThreads));
      w[j][0] = __ldg(wr), w[j][1] = __ldg(wr + 1);
    }
  for (int i = 0; i < N; ++i)
#pragma unroll
    for (int j = 0; j < kNormStageChunks; ++j)
      if (j < per_tile) {  // a guard, not a break: the loop unrolls and w stays in registers
        const int c = int(threadIdx.x) + j * kGemvThreads;
        const float4* v8 = reinterpret_cast<const float4*>(stage + std::int64_t(i) * cols + 8 * c);
        const float4 a = v8[0], b = v8[1];
        const float v[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
        const float wv[8] = {w[j][0].x, w[j][0].y, w[j][0].z, w[j][0].w, w[j][1].x, w[j][1].y, w[j][1].z, w[j][1].w};
        input[i * chunks + c] = round_normed(v, wv, inv[i]);
      }
}

// The target, first row and rows of a tile of R rows (GemvTargets' ranges count tiles here). With
// SwiGLU pairs (kPairs) a tile is rows first_row .. first_row + R/2 - 1 of both targets: rows r < R/2 of
// the tile are the gate's, the others the up's same rows, so one tile's sums give both factors.
struct GemvTile {
  int target, first_row;
};
template <int R, bool kPairs = false>
__device__ inline GemvTile gemv_tile(const GemvTargets& targets, int tile) {
  if constexpr (kPairs) return {0, tile * (R / 2)};
  int t = 0;
  while (t + 1 < targets.count && tile >= targets.first_block[t + 1]) ++t;
  return {t, (tile - targets.first_block[t]) * R};
}

// The launchers' tile ranges (gemv_tile's first_block, in tiles of R rows): one range per target, or
// with the SwiGLU pairs one range of tiles of R/2 rows of both targets.
template <int R>
inline void gemv_tile_ranges(GemvTargets& targets) {
  targets.first_block[0] = 0;
  if (targets.swiglu) {
    targets.first_block[1] = targets.first_block[2] = (targets.rows[0] + R / 2 - 1) / (R / 2);
    return;
  }
  for (int t = 0; t < targets.count; ++t) targets.first_block[t + 1] = targets.first_block[t] + (targets.rows[t] + R - 1) / R;
}

// The dynamic tile schedule (GemvTargets::schedule). A persistent block used to take tiles blockIdx.x,
// blockIdx.x + gridDim.x, ...: a fixed share, so a block that starts late ends late, and the whole
// GEMV with it. That is what a kernel beside the GEMV does to it: LycheeDecode's top-k handoff runs on a
// side stream at the highest priority and takes SMs at a GEMV boundary; the GEMV's blocks there start
// ~20 us late, and the step waits for their fixed share (the --profile step hid 129 of the handoff's
// 458 us on the H100). Here a block's first tile is still blockIdx.x; every later one is claimed from a
// counter (tiles gridDim.x, gridDim.x + 1, ... in claim order), so blocks that start late take fewer.
// A tile's arithmetic does not depend on the block that computes it, so the bits do not change.
//
// The weight pipeline issues S - 1 steps ahead, across tile boundaries, and turns to the next tile
// when it issues the last step of one (the step S before that tile's first is consumed), so a block
// claims tiles before it needs them: thread 0 claims tile q of its sequence at the start of tile q - L
// (the atomic's latency hides behind that tile) and writes it to a ring in shared memory that the
// barrier ending the tile publishes; L = 1 + ceil(S / P) tiles for P steps a tile. The first claims
// (tiles 1 .. L - 1) are published by one barrier after the steps of tile 0 that do not yet turn to
// tile 1 are issued. The second counter counts the blocks that have made their last claim; the last of
// them puts both back to 0, so the next launch on them (and a graph replay) starts from 0 again.
constexpr int kGemvClaimRing = 8;  // claimed tiles of a block not yet consumed: more than L
__device__ inline int gemv_claim_lead(int steps_per_tile, int stages) {
  const int p = steps_per_tile > 0 ? steps_per_tile : 1;
  return 1 + (stages + p - 1) / p;
}

// Requires cols % 8 == 0 and 16-byte aligned w, x, up; the grid no larger than the tile count.
// Dynamic shared memory: gemv_pipelined_smem_bytes. kClaims: the dynamic schedule (targets.schedule
// set), else fixed shares (targets.schedule ignored). Two instantiations, not one with a run-time
// switch: the switch, never taken by the fixed shares, still changed their code (the batch-1
// o-projection 672 -> 936 instructions), and the commit that added it made every batch-1 decode step
// ~0.5 ms slower on the H200 (128K: dense 8.79 -> 9.31 ms, ClusterAttn 4.78 -> 5.29; docs/performance.md,
// thirty-first session). The fixed-share instantiation is the kernel as it was before the claims.
// kIo: GemvIo (x holds bf16 values for kBf16: the launcher passes the bf16 rows through the float
// pointer, so every instantiation has one signature).
template <int N, int R, int S, GemvIo kIo, bool kCacheInput, bool kClaims>
__global__ void __launch_bounds__(kGemvThreads) gemv_bf16_pipelined(const __grid_constant__ GemvTargets targets, int cols,
                                                                    const float* __restrict__ x, const float* __restrict__ up,
                                                                    const __grid_constant__ NormInput norm) {
  constexpr bool kSwiGLU = kIo == GemvIo::kSwiGLU, kNorm = gemv_io_norm(kIo), kPairs = gemv_io_pairs(kIo);
  static_assert((S & (S - 1)) == 0 && S >= 2, "stages: a power of two, at least 2");
  static_assert(S + 1 < kGemvClaimRing, "the claim ring holds a block's lead of tiles (at most S + 1)");
  static_assert(!kNorm || kCacheInput, "the norm is computed once, into the input cache");
  static_assert(!kPairs || R % 2 == 0, "a pair tile holds the same rows of the gate and the up");
  static_assert(kGemvThreads == kThreads, "the norm's partial sums follow the norm kernel's thread layout");
  static_assert(kGemvThreads > 32 && R * N <= 32, "warp 0 writes a tile's sums, warp 1 counts the block done");
  constexpr int kWarps = kGemvThreads / 32;
  extern __shared__ uint4 gemv_smem[];
  uint4* const ring = gemv_smem;                          // [S][R][kGemvThreads]: a warp's 32 slots are contiguous
  uint4* const input = gemv_smem + S * R * kGemvThreads;  // [N][chunks] bf16 inputs (kCacheInput)
  // Two buffers: a tile's partial sums are read after one barrier while the next tile's are
  // written; the tile after that writes this buffer only after the next tile's barrier.
  __shared__ float partial[2][kWarps][R][N];
  __shared__ int claimed[kClaims ? kGemvClaimRing : 1];  // the dynamic schedule's tiles, by position in this block's sequence

  const int tid = int(threadIdx.x);
  const int chunks = cols / 8;
  const int tiles = targets.first_block[targets.count];
  const int per_tile = tid < chunks ? (chunks - 1 - tid) / kGemvThreads + 1 : 0;  // this thread's chunks of a row
  // Fixed shares: this block's tiles are blockIdx.x + q * gridDim.x, q < my_tiles, its (tile, chunk)
  // steps `steps` in consumption order.
  const int my_tiles = kClaims ? 0 : int(blockIdx.x) < tiles ? (tiles - 1 - int(blockIdx.x)) / int(gridDim.x) + 1 : 0;
  const int steps = per_tile * my_tiles;
  const std::uint64_t policy = l2_evict_first_policy();

  // Claims: the q-th tile of this block, for q < the claims made so far (a tile past the last is none).
  int* const schedule = targets.schedule;
  const int lead = kClaims ? gemv_claim_lead(chunks / kGemvThreads, S) : 0;
  const auto tile_of = [&](int q) { return claimed[q % kGemvClaimRing]; };
  // The issue cursor runs S - 1 steps ahead of consumption, across tile boundaries.
  int issue_j = 0, issue_q = 0, issue_tile = int(blockIdx.x);  // tile 0 is blockIdx.x in both schedules
  const uint4* issue_rows[R];
  const auto aim = [&](int tile) {
    const GemvTile g = gemv_tile<R, kPairs>(targets, tile);
    const int rows = targets.rows[g.target];
    for (int r = 0; r < R; ++r) {  // rows past the end re-read the last row and are not written
      const int t = kPairs ? r / (R / 2) : g.target, row = kPairs ? g.first_row + r % (R / 2) : g.first_row + r;
      issue_rows[r] = reinterpret_cast<const uint4*>(targets.w[t] + std::int64_t(min(row, rows - 1)) * cols);
    }
  };
  int issued = 0;
  const auto issue = [&] {
    if (kClaims ? per_tile > 0 && issue_tile < tiles : issued < steps) {
      uint4* slot = ring + (issued & (S - 1)) * R * kGemvThreads + tid;
      const int c = tid + issue_j * kGemvThreads;
      for (int r = 0; r < R; ++r) cp_async16(slot + r * kGemvThreads, issue_rows[r] + c, policy);
      ++issued;
      if (++issue_j == per_tile) {
        issue_j = 0;
        if constexpr (kClaims) {
          issue_tile = tile_of(++issue_q);
          if (issue_tile < tiles) aim(issue_tile);
        } else {
          issue_tile += int(gridDim.x);
          if (issued < steps) aim(issue_tile);
        }
      }
    }
    cp_async_commit();  // one group per call, empty or not: group g is step g
  };

  // Weights only, before the dependency wait.
  if constexpr (kClaims) {
    if (issue_tile < tiles) aim(issue_tile);
    int pre = 0;
    for (; pre < S - 1 && pre < per_tile - 1; ++pre) issue();  // tile 0's steps that do not turn to tile 1
    if (tid == 0) {
      int got[kGemvClaimRing];
      for (int q = 1; q < lead; ++q) got[q] = atomicAdd(schedule, 1);  // in flight together
      claimed[0] = int(blockIdx.x);
      for (int q = 1; q < lead; ++q) claimed[q] = int(gridDim.x) + got[q];
    }
    __syncthreads();
    for (; pre < S - 1; ++pre) issue();
  } else {
    if (steps > 0) aim(issue_tile);
    for (int p = 0; p < S - 1; ++p) issue();
  }
  wait_for_previous_kernel();
  allow_next_kernel_launch();

  // The norm of each input row (add_rms_norm's arithmetic; the residual sum written too), staged rows
  // filling the input cache before the first tile (kNormStageFloats).
  const bool staged = kNorm && N * cols <= kNormStageFloats;
  float inv[N];
  if constexpr (kNorm) {
    if (staged) {
      float* const stage = reinterpret_cast<float*>(ring + (S - 1) * R * kGemvThreads);  // the free ring slot
      fused_norm_inverse_rms<N>(norm, cols, inv, stage);
      fill_normed_input<N>(stage, norm.w, inv, cols, per_tile, input);
      __syncthreads();  // the stage is read by every thread before the loop's first copy refills the slot
    } else {
      fused_norm_inverse_rms<N>(norm, cols, inv);
    }
  }

  const int warp = tid / 32, lane = tid % 32;
  int s = 0;
  for (int k = 0; kClaims || k < my_tiles; ++k) {
    int tile = 0;  // claims: known here; fixed shares: formed where the sums are written, as it always was
    if constexpr (kClaims) {
      tile = tile_of(k);
      if (tile >= tiles) break;
    }
    float acc[R][N] = {};
    // The claim of tile k + lead, awaited only where it is stored, before the barrier below.
    const int next_claim = kClaims && tid == 0 ? atomicAdd(schedule, 1) : 0;
    for (int j = 0; j < per_tile; ++j, ++s) {
      // Refills the slot consumed in the previous iteration: its shared-memory reads were issued
      // before this copy (in-order issue; the asm's memory clobber keeps the compiler from moving
      // them), and the copy's write lands a global round trip later.
      issue();
      cp_async_wait<S - 1>();  // step s landed (groups s + 1 .. s + S - 1 may be in flight)
      const uint4* slot = ring + (s & (S - 1)) * R * kGemvThreads + tid;
      float wf[R][8];
      for (int r = 0; r < R; ++r) unpack8(slot[r * kGemvThreads], wf[r]);
      const int c = tid + j * kGemvThreads;
      for (int i = 0; i < N; ++i) {
        uint4 packed;
        if (kCacheInput && (k > 0 || staged)) {
          packed = input[i * chunks + c];
        } else {
          if constexpr (kNorm) packed = load_normed_bf16(norm, inv[i], std::int64_t(i) * chunks + c, 8 * c);
          else if constexpr (kIo == GemvIo::kBf16) packed = __ldcg(reinterpret_cast<const uint4*>(x) + std::int64_t(i) * chunks + c);
          else packed = load_input_bf16<kSwiGLU>(x, up, std::int64_t(i) * chunks + c);
          if (kCacheInput) input[i * chunks + c] = packed;  // read back by this thread only
        }
        float2 xi[4];
        const __nv_bfloat162* xp = reinterpret_cast<const __nv_bfloat162*>(&packed);
        for (int q = 0; q < 4; ++q) xi[q] = __bfloat1622float2(xp[q]);
        for (int r = 0; r < R; ++r)
          for (int q = 0; q < 4; ++q) {
            acc[r][i] = fmaf(wf[r][2 * q], xi[q].x, acc[r][i]);
            acc[r][i] = fmaf(wf[r][2 * q + 1], xi[q].y, acc[r][i]);
          }
      }
    }
    float(*part)[R][N] = partial[k & 1];
    for (int r = 0; r < R; ++r)
      for (int i = 0; i < N; ++i) {
        float v = acc[r][i];
        for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
        if (lane == 0) part[warp][r][i] = v;
      }
    // The barrier below publishes the claim of tile k + lead. Its slot last held tile k + lead - 8,
    // which the loop and the issue cursor have both read by now (lead <= S + 1 < 8).
    if (kClaims && tid == 0) claimed[(k + lead) % kGemvClaimRing] = int(gridDim.x) + next_claim;
    __syncthreads();
    if (kClaims && tid == 32 && tile_of(k + 1) >= tiles) {
      // This block has made its last claim (the loop stops before the next one): it counts itself
      // done, and the last block done puts the counters back to 0. Warp 1 does it while warp 0 writes
      // the tile's sums, so the round trips stay off the block's exit.
      __threadfence();
      if (atomicAdd(schedule + 1, 1) == int(gridDim.x) - 1) {
        schedule[0] = 0;
        schedule[1] = 0;
      }
    }
    if constexpr (kPairs) {
      // Both factors of a row in the order a lone tile sums them, then the down GEMV's SwiGLU and rounding.
      if (tid < (R / 2) * N) {
        const GemvTile g = gemv_tile<R, true>(targets, kClaims ? tile : int(blockIdx.x) + k * int(gridDim.x));
        const int rows = targets.rows[0];
        const int r = tid / N, i = tid % N;
        float gate = 0.f, up_sum = 0.f;
        for (int w = 0; w < kWarps; ++w) gate += part[w][r][i];
        for (int w = 0; w < kWarps; ++w) up_sum += part[w][r + R / 2][i];
        if (g.first_row + r < rows)
          targets.swiglu[std::int64_t(i) * rows + g.first_row + r] = __float2bfloat16_rn(swiglu1(gate, up_sum));
      }
    } else if (tid < R * N) {
      const GemvTile g = gemv_tile<R>(targets, kClaims ? tile : int(blockIdx.x) + k * int(gridDim.x));
      const int rows = targets.rows[g.target];
      const int r = tid / N, i = tid % N;
      float sum = 0.f;
      for (int w = 0; w < kWarps; ++w) sum += part[w][r][i];  // fixed order: deterministic
      if (g.first_row + r < rows) targets.y[g.target][std::int64_t(i) * rows + g.first_row + r] = sum;
    }
  }
  cp_async_wait<0>();  // only empty groups remain; leave nothing in flight
}

// Dynamic shared memory of an instantiation: the ring, plus the inputs when cached.
constexpr std::size_t gemv_pipelined_ring_bytes(int R, int S) { return std::size_t(S) * R * kGemvThreads * sizeof(uint4); }
inline std::size_t gemv_pipelined_input_bytes(int n, int cols) { return std::size_t(n) * cols * sizeof(__nv_bfloat16); }
// Its static shared memory: the partial sums, the claim ring (at most), and the norm's warp sums.
constexpr std::size_t gemv_pipelined_static_smem(int n, bool norm) {
  return sizeof(float) * 2 * (kGemvThreads / 32) * kPipelinedRows * n + sizeof(int) * kGemvClaimRing + (norm ? kNormStaticSmem : 0);
}

// Whether the pipelined GEMV can apply a NormInput at n input rows of `cols` (their bf16 copy fits in
// shared memory beside the ring) on a device with `optin_smem` bytes of shared memory per block.
inline bool gemv_norm_fits(int n, int cols, std::size_t optin_smem) {
  return n >= 1 && n <= kGemvNormMaxRows && cols % 8 == 0 &&
         gemv_pipelined_ring_bytes(kPipelinedRows, kPipelinedStages) + gemv_pipelined_input_bytes(n, cols) +
                 gemv_pipelined_static_smem(n, true) <= optin_smem;
}

// The launch of a persistent GEMV kernel (this one, or gemv_bf16_mma of cuda_gemv_mma.cuh): raises its
// shared-memory limit once (the rings are 64 KB, above the default 48 KB), and sizes the grid to the
// blocks that fit at once. kStaticSmem: the kernel's static shared memory.
template <auto Kernel, std::size_t kStaticSmem>
cudaError_t launch_persistent_gemv(const GemvTargets& targets, int cols, const float* x, const float* up, const NormInput& norm,
                                   std::size_t smem, cudaStream_t stream, bool pdl) {
  // Once per kernel (and process: the decoder drives one device). The largest size the launcher
  // ever asks for, so the attribute never changes while another thread launches.
  static const cudaError_t raised = [&] {
    int device = 0, optin = 0;
    cudaError_t err = cudaGetDevice(&device);
    if (err == cudaSuccess) err = cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device);
    if (err == cudaSuccess) err = cudaFuncSetAttribute(Kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, optin - int(kStaticSmem));
    // The ring is the SM's main use of on-chip memory; x goes through shared memory or L2.
    if (err == cudaSuccess)
      err = cudaFuncSetAttribute(Kernel, cudaFuncAttributePreferredSharedMemoryCarveout, int(cudaSharedmemCarveoutMaxShared));
    return err;
  }();
  if (raised != cudaSuccess) return raised;
  // The grid: blocks per SM for this shared-memory size, remembered for the last size asked
  // (a decoder asks for two or three: cols = hidden and intermediate).
  struct Fit {
    std::size_t smem = ~std::size_t(0);
    int blocks = 0;
  };
  static thread_local Fit last;
  if (last.smem != smem) {
    int per_sm = 0;
    const cudaError_t err = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, Kernel, kGemvThreads, smem);
    if (err != cudaSuccess) return err;
    last = {smem, per_sm};
  }
  int device = 0, sms = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err == cudaSuccess) err = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
  if (err != cudaSuccess) return err;
  // Every block that fits at once, or (targets.balanced) the fewest that take the same rounds of tiles:
  // with fixed shares the last round of a grid of G blocks is tiles % G of them, so gate/up's 7168 tiles
  // on 396 blocks end with 40 blocks streaming for one tile's time (~4 us at batch 1) while the rest of
  // the GPU idles; 378 blocks take 19 tiles each instead (the rate of 4.5% fewer blocks against that tail).
  const int tiles = targets.first_block[targets.count];
  const int most = std::max(1, last.blocks) * sms;
  int grid = std::max(1, std::min(tiles, most));
  if (targets.balanced) {
    const int rounds = (tiles + most - 1) / most;
    grid = std::max(1, (tiles + rounds - 1) / rounds);
  }
  return launch_kernel(Kernel, unsigned(grid), kGemvThreads, smem, stream, pdl, targets, cols, x, up, norm);
}

// The pipelined GEMV's SwiGLU pairs (GemvTargets::swiglu) are instantiated up to this many input rows:
// the row counts at which the decoder runs gate/up on it by shape (CudaBackend::uses_gemv sends them to
// cuBLAS from 3 rows, the tensor-core GEMV, which has pairs at every row count, from 4). Its bf16 input
// (the down projection from the pairs' output) up to kGemvBf16InputMaxRows: down stays on the pipelined
// GEMV by shape up to 7 rows (cuBLAS from 8).
constexpr int kGemvSwiGLUPairsMaxRows = 2;
constexpr int kGemvBf16InputMaxRows = 7;

template <int N, GemvIo kIo, bool kCacheInput>
cudaError_t launch_gemv_pipelined_kernel(const GemvTargets& targets, int cols, const float* x, const float* up,
                                         const NormInput& norm, std::size_t smem, cudaStream_t stream, bool pdl) {
  constexpr std::size_t kStatic = gemv_pipelined_static_smem(N, gemv_io_norm(kIo));
  if (targets.schedule)
    return launch_persistent_gemv<gemv_bf16_pipelined<N, kPipelinedRows, kPipelinedStages, kIo, kCacheInput, true>, kStatic>(
        targets, cols, x, up, norm, smem, stream, pdl);
  return launch_persistent_gemv<gemv_bf16_pipelined<N, kPipelinedRows, kPipelinedStages, kIo, kCacheInput, false>, kStatic>(
      targets, cols, x, up, norm, smem, stream, pdl);
}

// x_bf16: the input is bf16 rows (the SwiGLU pairs' output) instead of x, up or norm.
template <int N>
cudaError_t launch_gemv_pipelined_n(GemvTargets targets, int cols, const float* x, const float* up, const NormInput& norm,
                                    const __nv_bfloat16* x_bf16, cudaStream_t stream, bool pdl) {
  constexpr int R = kPipelinedRows;
  const bool pairs = targets.swiglu != nullptr;
  if (pairs && (targets.count != 2 || targets.rows[0] != targets.rows[1] || up || N > kGemvSwiGLUPairsMaxRows))
    return cudaErrorInvalidValue;
  if (x_bf16 && (up || norm.x || pairs || N > kGemvBf16InputMaxRows)) return cudaErrorInvalidValue;
  gemv_tile_ranges<R>(targets);  // tiles here, not blocks
  if (targets.first_block[targets.count] == 0) return cudaSuccess;
  int device = 0, optin = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err == cudaSuccess) err = cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device);
  if (err != cudaSuccess) return err;
  const std::size_t ring = gemv_pipelined_ring_bytes(R, kPipelinedStages);
  const std::size_t cached = ring + gemv_pipelined_input_bytes(N, cols);
  const std::size_t limit = std::size_t(optin) - gemv_pipelined_static_smem(N, false);
  if (norm.x) {  // the norm needs the input cache (gemv_norm_fits)
    if (up || !gemv_norm_fits(N, cols, std::size_t(optin))) return cudaErrorInvalidValue;
    if constexpr (N <= kGemvNormMaxRows && N <= kGemvSwiGLUPairsMaxRows) {
      if (pairs) return launch_gemv_pipelined_kernel<N, GemvIo::kNormPairs, true>(targets, cols, x, up, norm, cached, stream, pdl);
    }
    if constexpr (N <= kGemvNormMaxRows) {
      return launch_gemv_pipelined_kernel<N, GemvIo::kNorm, true>(targets, cols, x, up, norm, cached, stream, pdl);
    }
    return cudaErrorInvalidValue;
  }
  // Inputs that do not fit (the down projection's 14336 columns at 6-8 rows) are re-read from L2
  // for every tile, as gemv_bf16 does.
  const bool cache = cached <= limit;
  const std::size_t smem = cache ? cached : ring;
  if constexpr (N <= kGemvSwiGLUPairsMaxRows) {
    if (pairs)
      return cache ? launch_gemv_pipelined_kernel<N, GemvIo::kFloatPairs, true>(targets, cols, x, up, norm, smem, stream, pdl)
                   : launch_gemv_pipelined_kernel<N, GemvIo::kFloatPairs, false>(targets, cols, x, up, norm, smem, stream, pdl);
  }
  if constexpr (N <= kGemvBf16InputMaxRows) {
    // The bf16 rows travel through the float pointer (gemv_bf16_pipelined's one signature).
    const float* xb = reinterpret_cast<const float*>(x_bf16);
    if (x_bf16)
      return cache ? launch_gemv_pipelined_kernel<N, GemvIo::kBf16, true>(targets, cols, xb, up, norm, smem, stream, pdl)
                   : launch_gemv_pipelined_kernel<N, GemvIo::kBf16, false>(targets, cols, xb, up, norm, smem, stream, pdl);
  }
  if (cache) {
    if (up) return launch_gemv_pipelined_kernel<N, GemvIo::kSwiGLU, true>(targets, cols, x, up, norm, smem, stream, pdl);
    return launch_gemv_pipelined_kernel<N, GemvIo::kFloat, true>(targets, cols, x, up, norm, smem, stream, pdl);
  }
  if (up) return launch_gemv_pipelined_kernel<N, GemvIo::kSwiGLU, false>(targets, cols, x, up, norm, smem, stream, pdl);
  return launch_gemv_pipelined_kernel<N, GemvIo::kFloat, false>(targets, cols, x, up, norm, smem, stream, pdl);
}

inline cudaError_t launch_gemv_pipelined_rows(const GemvTargets& targets, int cols, const float* x, int n, const float* up,
                                       const NormInput& norm, const __nv_bfloat16* x_bf16, cudaStream_t stream, bool pdl) {
  switch (n) {
    case 1: return launch_gemv_pipelined_n<1>(targets, cols, x, up, norm, x_bf16, stream, pdl);
    case 2: return launch_gemv_pipelined_n<2>(targets, cols, x, up, norm, x_bf16, stream, pdl);
    case 3: return launch_gemv_pipelined_n<3>(targets, cols, x, up, norm, x_bf16, stream, pdl);
    case 4: return launch_gemv_pipelined_n<4>(targets, cols, x, up, norm, x_bf16, stream, pdl);
    case 5: return launch_gemv_pipelined_n<5>(targets, cols, x, up, norm, x_bf16, stream, pdl);
    case 6: return launch_gemv_pipelined_n<6>(targets, cols, x, up, norm, x_bf16, stream, pdl);
    case 7: return launch_gemv_pipelined_n<7>(targets, cols, x, up, norm, x_bf16, stream, pdl);
    case 8: return launch_gemv_pipelined_n<8>(targets, cols, x, up, norm, x_bf16, stream, pdl);
    default: return cudaErrorInvalidValue;
  }
}

// launch_gemv_bf16's contract (y_t = x W_t^T, or silu(x) * up W_t^T with `up`; n in
// 1..kGemvMaxRows), with gemv_bf16_pipelined. pdl: launch with programmatic stream serialization.
// norm: the input is the RMSNorm of norm.x (+ norm.delta) instead of x (NormInput; no `up`).
// targets.swiglu set (n <= kGemvSwiGLUPairsMaxRows, two targets of the same rows, no `up`): the SwiGLU
// pairs, bf16(silu(x W_0^T) * x W_1^T) into targets.swiglu instead of y.
inline cudaError_t launch_gemv_bf16_pipelined(const GemvTargets& targets, int cols, const float* x, int n, cudaStream_t stream,
                                              const float* up = nullptr, bool pdl = false, const NormInput& norm = {}) {
  return launch_gemv_pipelined_rows(targets, cols, x, n, up, norm, nullptr, stream, pdl);
}

// y_t = x W_t^T for bf16 input rows x [n, cols] (the SwiGLU pairs' output), n <= kGemvBf16InputMaxRows:
// the SwiGLU-fused GEMV's products bit for bit, from a quarter of its input bytes.
inline cudaError_t launch_gemv_bf16_pipelined_bf16_input(const GemvTargets& targets, int cols, const __nv_bfloat16* x, int n,
                                                         cudaStream_t stream, bool pdl = false) {
  return launch_gemv_pipelined_rows(targets, cols, nullptr, n, nullptr, NormInput{}, x, stream, pdl);
}

}  // namespace kernels
}  // namespace minimal_decoder
