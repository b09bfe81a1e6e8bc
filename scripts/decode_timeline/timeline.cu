// Block timeline of one decode_attention call over H dense heads (BHSD, one sequence, group 4, bf16,
// d 128), after an L2 flush by memset (the benchmarks' default) or by reading, built against a tree
// that instrument.py patched. Prints, for the median of REPS calls by event time: the event time, the
// split kernel's span (first block start to last block exit), and per-block percentiles of the start
// offset, the first stage's landing (from the block's start), the loop's end and the exit.
//   timeline HEADS SEQ FLUSH(memset|read) [REPS]
// A measurement tool, not part of the library. On the GPU machine (no git there: make the tree here):
//   git archive HEAD | (mkdir -p .ab/tl && tar -x -C .ab/tl) && scripts/decode_timeline/instrument.py .ab/tl
//   nvcc -O3 -DNDEBUG -std=c++17 -arch=sm_90a -I.ab/tl/include scripts/decode_timeline/timeline.cu -o /tmp/tl
//   /tmp/tl 1 131072 read
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "kvsift/kvsift.cuh"
#include "kvsift/ops/decode_attention.cuh"

#define CK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { std::printf("%s: %s\n", #x, cudaGetErrorString(e_)); std::exit(1); } } while (0)
using BF16 = __nv_bfloat16;

__global__ void fill(BF16* p, size_t n, unsigned seed) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    unsigned h = unsigned(i) * 2654435761u ^ seed;
    h ^= h >> 15; h *= 2246822519u; h ^= h >> 13;
    p[i] = __float2bfloat16(float(h & 0xffff) / 32768.f - 1.f);
  }
}
__global__ void read_all(const float4* p, size_t n, float* sink) {
  float acc = 0.f;
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) acc += p[i].x;
  if (acc == 1234.5f) *sink = acc;
}

int main(int argc, char** argv) {
  if (argc < 4) { std::printf("timeline HEADS SEQ memset|read [REPS]\n"); return 2; }
  const int heads = std::atoi(argv[1]), S = std::atoi(argv[2]), reps = argc > 4 ? std::atoi(argv[4]) : 9;
  const bool by_read = std::string(argv[3]) == "read";
  const int D = 128, hq = 4 * heads;
  const size_t n = size_t(heads) * S * D;
  BF16 *k, *v, *q, *out;
  int* len;
  CK(cudaMalloc(&k, n * 2)); CK(cudaMalloc(&v, n * 2)); CK(cudaMalloc(&q, hq * D * 2)); CK(cudaMalloc(&out, hq * D * 2));
  CK(cudaMalloc(&len, 4)); CK(cudaMemcpy(len, &S, 4, cudaMemcpyHostToDevice));
  fill<<<1024, 256>>>(k, n, 11); fill<<<1024, 256>>>(v, n, 12); fill<<<8, 256>>>(q, hq * D, 13);
  int l2 = 0; CK(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, 0));
  const size_t flush_bytes = size_t(l2) * 2;
  char* scratch; float* sink;
  CK(cudaMalloc(&scratch, flush_bytes)); CK(cudaMalloc(&sink, 4));
  cudaStream_t st; CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  const auto exec = kvsift::cuda::Exec::for_current_device(st);
  const auto kv = kvsift::make_bhsd(k, v, 1, heads, S, D, len);
  const auto p = kvsift::make_decode_attention_params<BF16>(q, out, 1, hq, D);
  size_t ws_bytes = 0;
  if (!kvsift::decode_attention_workspace_bytes(exec, kv, p, &ws_bytes).ok()) { std::printf("ws query failed\n"); return 1; }
  void* ws; CK(cudaMalloc(&ws, std::max<size_t>(ws_bytes, 256)));
  kvsift::detail::DecodePlan plan;
  if (!kvsift::detail::plan_decode_attention(exec.device, kv, p, &plan).ok()) return 1;
  const int blocks = plan.ctas_per_tile * plan.row_tiles;
  unsigned long long* tl; CK(cudaMalloc(&tl, size_t(blocks) * 5 * 8));
  CK(cudaMemcpyToSymbol(kvsift::detail::g_kvsift_tl, &tl, sizeof(tl)));
  cudaEvent_t e0, e1; CK(cudaEventCreate(&e0)); CK(cudaEventCreate(&e1));
  struct Rep { float ev; double span; std::vector<double> start, first, loop, end; };
  std::vector<Rep> runs;
  for (int r = 0; r < reps + 1; ++r) {
    CK(cudaMemsetAsync(tl, 0, size_t(blocks) * 5 * 8, st));
    if (by_read) read_all<<<exec.device.num_sms * 8, 512, 0, st>>>(reinterpret_cast<float4*>(scratch), flush_bytes / 16, sink);
    else CK(cudaMemsetAsync(scratch, r & 0xff, flush_bytes, st));
    CK(cudaEventRecord(e0, st));
    const auto s = kvsift::cuda::decode_attention(exec, kv, p, kvsift::Workspace{ws, ws_bytes});
    if (!s.ok()) { std::printf("decode_attention: %s\n", s.to_string().c_str()); return 1; }
    CK(cudaEventRecord(e1, st));
    CK(cudaStreamSynchronize(st));
    if (r == 0) continue;  // warm-up
    std::vector<unsigned long long> h(size_t(blocks) * 5);
    CK(cudaMemcpy(h.data(), tl, h.size() * 8, cudaMemcpyDeviceToHost));
    Rep rep; CK(cudaEventElapsedTime(&rep.ev, e0, e1));
    unsigned long long t0 = ~0ull, t3 = 0;
    for (int b = 0; b < blocks; ++b) if (h[5 * b]) { t0 = std::min(t0, h[5 * b]); t3 = std::max(t3, h[5 * b + 3]); }
    rep.span = (t3 - t0) * 1e-3;
    for (int b = 0; b < blocks; ++b) {
      const unsigned long long* x = &h[5 * b];
      if (!x[0]) continue;
      rep.start.push_back((x[0] - t0) * 1e-3);
      if (x[1]) rep.first.push_back((x[1] - x[0]) * 1e-3);
      rep.loop.push_back((x[2] - t0) * 1e-3);
      rep.end.push_back((x[3] - t0) * 1e-3);
    }
    runs.push_back(rep);
  }
  std::sort(runs.begin(), runs.end(), [](const Rep& a, const Rep& b) { return a.ev < b.ev; });
  Rep& m = runs[runs.size() / 2];
  auto pct = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    char buf[96];
    std::snprintf(buf, sizeof buf, "%6.1f %6.1f %6.1f %6.1f", v.front(), v[v.size() / 10], v[v.size() / 2], v.back());
    return std::string(buf);
  };
  std::printf("heads %d S %d flush %s: %d blocks (%d x %d tokens), event %.1f us (min %.1f), split span %.1f us; ceiling-time of the bytes at 3.06 / 4.41 TB/s: %.1f / %.1f us\n",
              heads, S, by_read ? "read" : "memset", blocks, plan.retrieval_splits, plan.chunk, m.ev * 1e3, runs.front().ev * 1e3, m.span,
              2.0 * n * 2 / 3.06e6, 2.0 * n * 2 / 4.41e6);
  std::printf("  per block (us; p0 p10 p50 p100): start %s | first stage landed after %s | loop end %s | exit %s\n",
              pct(m.start).c_str(), pct(m.first).c_str(), pct(m.loop).c_str(), pct(m.end).c_str());
  return 0;
}
