// CTA timeline of one cuda::topk call on the register select (fp32 scores uniform in [-1, 1), every
// row full length, k per call), after an L2 flush by memset (the benchmarks' default), by reading (a
// clean cold L2) or not at all (`none`), built against a tree that instrument.py patched. THREADS 0 is
// the plan's CTA size (detail::plan_topk_register), 256 or 512 forces one. Prints, for the median of
// REPS calls by event time: the event time, the kernel's span (first CTA entry to last CTA exit), the
// SM clock the CTAs ran at, and per-CTA percentiles of each phase between instrument.py's marks.
//   timeline ROWS COLS K FLUSH(memset|read|none) [REPS] [THREADS]
// A measurement tool, not part of the library. On the GPU machine (no git there: make the tree here):
//   git archive HEAD | (mkdir -p .ab/tl && tar -x -C .ab/tl) && scripts/topk_timeline/instrument.py .ab/tl
//   nvcc -O3 -DNDEBUG -std=c++17 -arch=sm_90a -I.ab/tl/include scripts/topk_timeline/timeline.cu -o /tmp/tk
//   /tmp/tk 8 131072 4096 memset
#include "kvsift/ops/topk.cuh"
#include "../timeline_support/timeline_host.cuh"

__global__ void fill(float* p, size_t n, unsigned seed) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    unsigned h = unsigned(i) * 2654435761u ^ seed;
    h ^= h >> 15; h *= 2246822519u; h ^= h >> 13;
    p[i] = float(h & 0xffffff) / 8388608.f - 1.f;
  }
}
int main(int argc, char** argv) {
  if (argc < 5) { std::printf("timeline ROWS COLS K memset|read|none [REPS] [THREADS]\n"); return 2; }
  const int rows = std::atoi(argv[1]), cols = std::atoi(argv[2]), k = std::atoi(argv[3]);
  const int reps = argc > 5 ? std::atoi(argv[5]) : 9, threads = argc > 6 ? std::atoi(argv[6]) : 0;
  constexpr int kSlots = kvsift::detail::kTlSlots;
  float* scores; int *idx, *counts, *lengths;
  CK(cudaMalloc(&scores, size_t(rows) * cols * 4)); CK(cudaMalloc(&idx, size_t(rows) * k * 4));
  CK(cudaMalloc(&counts, rows * 4)); CK(cudaMalloc(&lengths, rows * 4));
  fill<<<1024, 256>>>(scores, size_t(rows) * cols, 0x70c0u);
  { std::vector<int> h(rows, cols); CK(cudaMemcpy(lengths, h.data(), rows * 4, cudaMemcpyHostToDevice)); }
  cudaStream_t st; CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  const auto exec = kvsift::cuda::Exec::for_current_device(st);
  const TlFlush flush(argv[4], exec.device.num_sms);
  kvsift::TopKParams p;
  p.k = k;
  p.lengths = lengths;
  const auto view = kvsift::make_strided_view<const float>(scores, rows, cols);
  const auto out = kvsift::make_index_set(idx, counts, rows, k);
  const auto plan = kvsift::detail::plan_topk_register<std::uint32_t>(rows, cols, 0, exec.device, threads);
  if (plan.kernel != kvsift::detail::TopkKernel::kRegisterSelect) { std::printf("not a register-select shape\n"); return 1; }
  const int ctas = rows * plan.ctas_per_row;
  unsigned long long* tl; CK(cudaMalloc(&tl, size_t(ctas) * kSlots * 8));
  CK(cudaMemcpyToSymbol(kvsift::detail::g_kvsift_tl, &tl, sizeof(tl)));
  cudaEvent_t e0, e1; CK(cudaEventCreate(&e0)); CK(cudaEventCreate(&e1));
  enum { kEntry, kKeys, kBracket, kList, kGroup, kCopy, kKth, kLower, kOut, kExit, kCols };
  static const char* names[kCols] = {"entry (from the first CTA's)", "keys in registers", "bracket (sample rounds)",
                                     "count and own list", "group barrier", "copy of the lists (or exact search)",
                                     "radix finish over the copy", "lower ranks' counts", "ordered output, exit wait",
                                     "exit (from the first entry)"};
  struct Rep { float ev; double span, mhz; std::vector<double> col[kCols]; };
  std::vector<Rep> runs;
  for (int r = 0; r < reps + 1; ++r) {
    CK(cudaMemsetAsync(tl, 0, size_t(ctas) * kSlots * 8, st));
    flush.run(st, r);
    CK(cudaEventRecord(e0, st));
    const auto s = kvsift::detail::launch_topk(exec, kvsift::detail::TopkLaunch<float, kvsift::ScoreKey<float>>{
                                                         view, p, out, nullptr, kvsift::ScoreKey<float>{}, plan});
    if (!s.ok()) { std::printf("topk: %s\n", s.to_string().c_str()); return 1; }
    CK(cudaEventRecord(e1, st));
    CK(cudaStreamSynchronize(st));
    if (r == 0) continue;  // warm-up
    const std::vector<unsigned long long> h = tl_read_marks(tl, ctas, kSlots);
    Rep rep; CK(cudaEventElapsedTime(&rep.ev, e0, e1));
    unsigned long long t0 = ~0ull, t8 = 0;
    for (int b = 0; b < ctas; ++b) if (h[kSlots * b + 8]) { t0 = std::min(t0, h[kSlots * b]); t8 = std::max(t8, h[kSlots * b + 8]); }
    rep.span = (t8 - t0) * 1e-3;
    double cyc = 0, ns = 0;
    for (int b = 0; b < ctas; ++b) {
      const unsigned long long* x = &h[size_t(kSlots) * b];
      if (!x[8]) continue;
      const auto us = tl_us;
      const bool copied = x[6] != 0;  // the ordinary path (a copy and a radix finish) or the exact search
      rep.col[kEntry].push_back(us(x[0], t0));
      rep.col[kKeys].push_back(us(x[1], x[0]));
      rep.col[kBracket].push_back(us(x[2], x[1]));
      rep.col[kList].push_back(us(x[3], x[2]));
      rep.col[kGroup].push_back(us(x[4], x[3]));
      rep.col[kCopy].push_back(us(x[5], x[4]));
      if (copied) rep.col[kKth].push_back(us(x[6], x[5]));
      if (copied) rep.col[kLower].push_back(us(x[7], x[6]));
      rep.col[kOut].push_back(us(x[8], copied ? x[7] : x[5]));
      rep.col[kExit].push_back(us(x[8], t0));
      cyc += double(x[11] - x[10]), ns += double(x[8] - x[0]);
    }
    rep.mhz = ns > 0 ? 1e3 * cyc / ns : 0;
    runs.push_back(rep);
  }
  std::sort(runs.begin(), runs.end(), [](const Rep& a, const Rep& b) { return a.ev < b.ev; });
  Rep& m = runs[runs.size() / 2];
  std::printf("%d x %d, k %d, flush %s: %d CTAs (groups of %d, %d threads, %d keys a thread), event %.1f us (min %.1f), "
              "kernel span %.1f us, SM clock %.0f MHz\n",
              rows, cols, k, flush.kind.c_str(), ctas, plan.ctas_per_row, plan.threads, plan.slice / plan.threads, m.ev * 1e3,
              runs.front().ev * 1e3, m.span, m.mhz);
  tl_print_percentiles(names, m.col, kCols, 38);
  return 0;
}
