// Block timeline of one decode_attention call over H KV heads (BHSD, group 4, bf16, d 128), dense or,
// with GATHER > 0, every head gathering GATHER random sorted tokens, after an L2 flush by memset (the
// benchmarks' default), by reading (a clean cold L2), by reading then a 16-token call of the same
// kernel (`warm`: its code back in L2, the data cold) or not at all (`none`), built against a tree
// that instrument.py patched. Prints, for the median of REPS calls by event time: the event time, the
// split kernel's span (first block entry to last block exit), the SM clock the blocks ran at, and
// per-block percentiles (from the first entry, or between a block's own marks) of each mark
// instrument.py names. KVSIFT_TL_SPIN=1 spins every SM ~200 us before each call (clocks held up).
//   timeline HEADS SEQ FLUSH(memset|read|warm|none) [REPS] [GATHER] [BATCH]
// A measurement tool, not part of the library. On the GPU machine (no git there: make the tree here):
//   git archive HEAD | (mkdir -p .ab/tl && tar -x -C .ab/tl) && scripts/decode_timeline/instrument.py .ab/tl
//   nvcc -O3 -DNDEBUG -std=c++17 -arch=sm_90a -I.ab/tl/include scripts/decode_timeline/timeline.cu -o /tmp/tl
//   /tmp/tl 1 131072 read
#include "kvsift/kvsift.cuh"
#include "kvsift/ops/decode_attention.cuh"
#include "../timeline_support/timeline_host.cuh"
using BF16 = __nv_bfloat16;

__global__ void fill(BF16* p, size_t n, unsigned seed) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    unsigned h = unsigned(i) * 2654435761u ^ seed;
    h ^= h >> 15; h *= 2246822519u; h ^= h >> 13;
    p[i] = __float2bfloat16(float(h & 0xffff) / 32768.f - 1.f);
  }
}
// KVSIFT_TL_SPIN=1: every SM spins ~200 us before each call's flush, so the clocks are up.
__global__ void spin(long long cycles) {
  const long long t0 = clock64();
  while (clock64() - t0 < cycles) {}
}

int main(int argc, char** argv) {
  if (argc < 4) { std::printf("timeline HEADS SEQ memset|read [REPS] [GATHER] [BATCH]\n"); return 2; }
  const int heads = std::atoi(argv[1]), S = std::atoi(argv[2]), reps = argc > 4 ? std::atoi(argv[4]) : 9;
  const int gather = argc > 5 ? std::atoi(argv[5]) : 0, B = argc > 6 ? std::atoi(argv[6]) : 1;
  // memset: the benchmarks' flush (L2 left dirty); read: a clean cold L2; warm: the read flush, then a
  // 16-token call of the same kernel (its code back in L2, the data still cold); none: no flush.
  const int D = 128, hq = 4 * heads;
  constexpr int kSlots = kvsift::detail::kTlSlots;
  const size_t n = size_t(B) * heads * S * D;
  BF16 *k, *v, *q, *out;
  int* len;
  CK(cudaMalloc(&k, n * 2)); CK(cudaMalloc(&v, n * 2)); CK(cudaMalloc(&q, size_t(B) * hq * D * 2)); CK(cudaMalloc(&out, size_t(B) * hq * D * 2));
  CK(cudaMalloc(&len, 4 * B));
  { std::vector<int> hl(B, S); CK(cudaMemcpy(len, hl.data(), 4 * B, cudaMemcpyHostToDevice)); }
  fill<<<1024, 256>>>(k, n, 11); fill<<<1024, 256>>>(v, n, 12); fill<<<8, 256>>>(q, size_t(B) * hq * D, 13);
  cudaStream_t st; CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  const auto exec = kvsift::cuda::Exec::for_current_device(st);
  const TlFlush flush(argv[3], exec.device.num_sms);  // "warm" reads, as "read" does, then warms below
  const auto kv = kvsift::make_bhsd(k, v, B, heads, S, D, len);
  auto p = kvsift::make_decode_attention_params<BF16>(q, out, B, hq, D);
  int* idx = nullptr; int* counts = nullptr;
  if (gather > 0) {  // every head sparse: GATHER distinct sorted tokens of [0, S) a row
    const int rows = B * heads;
    std::vector<int> h(size_t(rows) * gather), c(rows, gather);
    unsigned x = 7;
    for (int r = 0; r < rows; ++r) {
      std::vector<char> taken(S, 0);
      for (int got = 0; got < gather;) { x = x * 1664525u + 1013904223u; const int t = int((x >> 8) % unsigned(S)); if (!taken[t]) { taken[t] = 1; ++got; } }
      for (int t = 0, o = 0; t < S; ++t) if (taken[t]) h[size_t(r) * gather + o++] = t;
    }
    CK(cudaMalloc(&idx, h.size() * 4)); CK(cudaMalloc(&counts, rows * 4));
    CK(cudaMemcpy(idx, h.data(), h.size() * 4, cudaMemcpyHostToDevice)); CK(cudaMemcpy(counts, c.data(), rows * 4, cudaMemcpyHostToDevice));
    p.index_set = kvsift::as_const(kvsift::make_index_set(idx, counts, rows, gather));
    p.roles = kvsift::HeadRoleMask::all_sparse(heads);
  }
  size_t ws_bytes = 0;
  if (!kvsift::decode_attention_workspace_bytes(exec, kv, p, &ws_bytes).ok()) { std::printf("ws query failed\n"); return 1; }
  void* ws; CK(cudaMalloc(&ws, std::max<size_t>(ws_bytes, 256)));
  int* len16; CK(cudaMalloc(&len16, 4));
  { const int sixteen = 16; CK(cudaMemcpy(len16, &sixteen, 4, cudaMemcpyHostToDevice)); }
  const auto kv_warm = kvsift::make_bhsd(k, v, 1, 1, 16, D, len16);
  auto p_warm = kvsift::make_decode_attention_params<BF16>(q, out, 1, 4, D);
  if (gather > 0) p_warm.roles = kvsift::HeadRoleMask::all_sparse(1), p_warm.index_set = p.index_set;
  kvsift::detail::DecodePlan plan;
  if (!kvsift::detail::plan_decode_attention(exec.device, kv, p, &plan).ok()) return 1;
  const int blocks = plan.ctas_per_tile * plan.row_tiles * B;
  unsigned long long* tl; CK(cudaMalloc(&tl, size_t(blocks) * kSlots * 8));
  CK(cudaMemcpyToSymbol(kvsift::detail::g_kvsift_tl, &tl, sizeof(tl)));
  cudaEvent_t e0, e1; CK(cudaEventCreate(&e0)); CK(cudaEventCreate(&e1));
  // Per block: entry, located, first stage landed, loop end (from the first entry); the epilogue's own
  // part, the wait for the cluster's ranks, the rest to exit (between the block's own marks); exit.
  enum { kEntry, kLocate, kFirst, kLoop, kOwn, kOwn1, kOwn2, kSync, kRest, kExit, kCols };
  static const char* names[kCols] = {"entry", "length read (entry->located)", "first stage landed", "loop end",
                                     "own epilogue (loop end->stored)", "  of it: to finish_split's 1st barrier",
                                     "  of it: weights, to its 2nd barrier", "cluster wait (stored->ranks visible)",
                                     "rest (->exit)", "exit"};
  struct Rep { float ev; double span, mhz; std::vector<double> col[kCols]; };
  std::vector<Rep> runs;
  for (int r = 0; r < reps + 1; ++r) {
    CK(cudaMemsetAsync(tl, 0, size_t(blocks) * kSlots * 8, st));
    if (const char* e = std::getenv("KVSIFT_TL_SPIN"); e && *e == '1') spin<<<exec.device.num_sms * 4, 32, 0, st>>>(400000);
    flush.run(st, r);
    if (flush.kind == "warm" && !kvsift::cuda::decode_attention(exec, kv_warm, p_warm, kvsift::Workspace{ws, ws_bytes}).ok()) return 1;
    if (flush.kind == "warm") CK(cudaMemsetAsync(tl, 0, size_t(blocks) * kSlots * 8, st));
    CK(cudaEventRecord(e0, st));
    const auto s = kvsift::cuda::decode_attention(exec, kv, p, kvsift::Workspace{ws, ws_bytes});
    if (!s.ok()) { std::printf("decode_attention: %s\n", s.to_string().c_str()); return 1; }
    CK(cudaEventRecord(e1, st));
    CK(cudaStreamSynchronize(st));
    if (r == 0) continue;  // warm-up
    const std::vector<unsigned long long> h = tl_read_marks(tl, blocks, kSlots);
    Rep rep; CK(cudaEventElapsedTime(&rep.ev, e0, e1));
    unsigned long long t0 = ~0ull, t3 = 0;
    for (int b = 0; b < blocks; ++b) if (h[kSlots * b + 3]) { t0 = std::min(t0, h[kSlots * b + 5]); t3 = std::max(t3, h[kSlots * b + 3]); }
    rep.span = (t3 - t0) * 1e-3;
    double cyc = 0, ns = 0;
    for (int b = 0; b < blocks; ++b) {
      const unsigned long long* x = &h[size_t(kSlots) * b];
      if (!x[3]) continue;
      const auto us = tl_us;
      rep.col[kEntry].push_back(us(x[5], t0));
      rep.col[kLocate].push_back(us(x[0], x[5]));
      if (x[1]) rep.col[kFirst].push_back(us(x[1], t0));
      rep.col[kLoop].push_back(us(x[2], t0));
      rep.col[kOwn].push_back(us(x[6], x[2]));
      rep.col[kOwn1].push_back(us(x[10], x[2]));
      rep.col[kOwn2].push_back(us(x[11], x[10]));
      if (x[7]) rep.col[kSync].push_back(us(x[7], x[6]));
      rep.col[kRest].push_back(us(x[3], x[7] ? x[7] : x[6]));
      rep.col[kExit].push_back(us(x[3], t0));
      cyc += double(x[9] - x[8]), ns += double(x[3] - x[5]);
    }
    rep.mhz = ns > 0 ? 1e3 * cyc / ns : 0;
    runs.push_back(rep);
  }
  std::sort(runs.begin(), runs.end(), [](const Rep& a, const Rep& b) { return a.ev < b.ev; });
  Rep& m = runs[runs.size() / 2];
  const double bytes = gather > 0 ? 2.0 * B * heads * gather * D * 2 : 2.0 * n * 2;
  std::printf("heads %d S %d B %d gather %d flush %s: %d blocks (%d x %d positions, cluster %d), event %.1f us (min %.1f), split span %.1f us, SM clock %.0f MHz; "
              "K/V bytes at 3.06 / 4.41 TB/s: %.1f / %.1f us\n",
              heads, S, B, gather, flush.kind.c_str(), blocks, gather > 0 ? plan.sparse_splits : plan.retrieval_splits,
              gather > 0 ? plan.sparse_chunk : plan.chunk, plan.cluster, m.ev * 1e3, runs.front().ev * 1e3, m.span, m.mhz, bytes / 3.06e6, bytes / 4.41e6);
  tl_print_percentiles(names, m.col, kCols, 40);
  return 0;
}
