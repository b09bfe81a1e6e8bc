// kvsift quickstart: describe an engine's KV cache with views, and run an op on whichever backend this
// machine has. Built as CUDA when the toolkit is there; with no GPU at run time it uses the host
// reference, so the same program runs everywhere.
//
// Part 1: a contiguous BSHD cache and a paged HND cache holding the same tokens, both read through the
// view contract by copy_kv_to_dense, with the results compared.
// Part 2 (compression_demo.hpp): a synthetic long prompt compressed by ClusterAttn, SnapKV,
// StreamingLLM and H2O-prefill, with kept fraction, needle recall, attention cosine and time.
// Part 3 (lycheedecode_demo.hpp): one LycheeDecode step through a synthetic multi-layer model against
// dense decode, with per-layer fidelity and time.

#if defined(__CUDACC__)
#include <kvsift/kvsift.cuh>
#else
#include <kvsift/kvsift.hpp>
#endif

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <numeric>
#include <random>
#include <vector>

#include "compression_demo.hpp"
#include "lycheedecode_demo.hpp"

namespace {

constexpr int kBatch = 2, kHeads = 8, kHeadDim = 128, kCapacity = 1024, kPageSize = 16;

// The same op through either backend: Exec decides where it runs (argument-dependent lookup picks
// kvsift::host::copy_kv_to_dense or kvsift::cuda::copy_kv_to_dense).
template <class Exec, class View>
kvsift::Status export_cache(Exec exec, const View& kv, kvsift::bfloat16_t* k_out, kvsift::bfloat16_t* v_out) {
  return copy_kv_to_dense(exec, kv, kCapacity, k_out, v_out);
}

#if defined(__CUDACC__)
template <class T>
T* to_device(const std::vector<T>& h) {
  T* d = nullptr;
  if (cudaMalloc(&d, h.size() * sizeof(T)) != cudaSuccess) return nullptr;
  cudaMemcpy(d, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice);
  return d;
}

bool have_gpu(cudaDeviceProp* prop) {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) return false;
  return cudaGetDeviceProperties(prop, 0) == cudaSuccess;
}
#endif

// Memory and timing of the host backend: 256-byte aligned host buffers, wall-clock time.
struct HostMemory {
  std::vector<std::unique_ptr<void, decltype(&std::free)>> blocks;
  template <class T>
  T* alloc(std::size_t n) {
    const std::size_t bytes = (std::max<std::size_t>(n * sizeof(T), 1) + 255) / 256 * 256;
    blocks.emplace_back(std::aligned_alloc(256, bytes), &std::free);
    return static_cast<T*>(blocks.back().get());
  }
  template <class T>
  T* upload(const std::vector<T>& v) {
    T* p = alloc<T>(v.size());
    std::copy(v.begin(), v.end(), p);
    return p;
  }
  template <class F>
  double time_ms(F&& f) {
    const auto t0 = std::chrono::steady_clock::now();
    const kvsift::Status st = f();
    const auto t1 = std::chrono::steady_clock::now();
    if (!st.ok()) std::printf("error: %s\n", st.to_string().c_str());
    return st.ok() ? std::chrono::duration<double, std::milli>(t1 - t0).count() : -1.0;
  }
};

#if defined(__CUDACC__)
// Memory and timing of the CUDA backend: device buffers, CUDA-event time of the second run (the first
// loads the kernels).
struct DeviceMemory {
  std::vector<void*> blocks;
  ~DeviceMemory() {
    for (void* p : blocks) cudaFree(p);
  }
  template <class T>
  T* alloc(std::size_t n) {
    void* p = nullptr;
    if (cudaMalloc(&p, std::max<std::size_t>(n * sizeof(T), 1)) != cudaSuccess) return nullptr;
    blocks.push_back(p);
    return static_cast<T*>(p);
  }
  template <class T>
  T* upload(const std::vector<T>& v) {
    T* p = alloc<T>(v.size());
    if (p) cudaMemcpy(p, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice);
    return p;
  }
  template <class F>
  double time_ms(F&& f) {
    kvsift::Status st = f();
    cudaEvent_t a, b;
    cudaEventCreate(&a);
    cudaEventCreate(&b);
    cudaEventRecord(a);
    if (st.ok()) st = f();
    cudaEventRecord(b);
    if (st.ok()) st = kvsift::from_cuda(cudaEventSynchronize(b), "cudaEventSynchronize");
    float ms = 0.f;
    cudaEventElapsedTime(&ms, a, b);
    cudaEventDestroy(a);
    cudaEventDestroy(b);
    if (!st.ok()) std::printf("error: %s\n", st.to_string().c_str());
    return st.ok() ? ms : -1.0;
  }
};
#endif

}  // namespace

int main() {
  std::printf("kvsift %d.%d.%d quickstart\n", kvsift::kVersionMajor, kvsift::kVersionMinor, kvsift::kVersionPatch);

  // An engine's caches, filled with random bf16 values: one BSHD tensor and one paged pool whose pages
  // are handed out in shuffled order, as an allocator would.
  std::mt19937 rng(2026);
  std::uniform_real_distribution<float> dist(-1.f, 1.f);
  const std::size_t elems = std::size_t(kBatch) * kCapacity * kHeads * kHeadDim;
  std::vector<kvsift::bfloat16_t> k(elems), v(elems);
  for (std::size_t i = 0; i < elems; ++i) {
    k[i] = kvsift::from_float<kvsift::bfloat16_t>(dist(rng));
    v[i] = kvsift::from_float<kvsift::bfloat16_t>(dist(rng));
  }
  const std::vector<std::int32_t> lengths = {1000, 777};

  const int pages_per_seq = kCapacity / kPageSize, num_pages = kBatch * pages_per_seq;
  std::vector<std::int32_t> table(num_pages);
  std::iota(table.begin(), table.end(), 0);
  std::shuffle(table.begin(), table.end(), rng);
  std::vector<kvsift::bfloat16_t> k_pages(elems), v_pages(elems);
  const auto contiguous_host = kvsift::make_bshd(k.data(), v.data(), kBatch, kHeads, kCapacity, kHeadDim, lengths.data());
  const auto paged_host = kvsift::make_paged(k_pages.data(), v_pages.data(), table.data(), kBatch, pages_per_seq,
                                             num_pages, kHeads, kPageSize, kHeadDim, kvsift::PageLayout::kHND,
                                             lengths.data());
  for (int b = 0; b < kBatch; ++b)  // scatter the tokens into the pages through the view itself
    for (int h = 0; h < kHeads; ++h)
      for (int t = 0; t < kCapacity; ++t) {
        std::memcpy(paged_host.k_row(b, h, t), contiguous_host.k_row(b, h, t), kHeadDim * sizeof(kvsift::bfloat16_t));
        std::memcpy(paged_host.v_row(b, h, t), contiguous_host.v_row(b, h, t), kHeadDim * sizeof(kvsift::bfloat16_t));
      }

  for (const kvsift::Status& st : {contiguous_host.validate(), paged_host.validate(), paged_host.validate_block_table_host()})
    if (!st.ok()) {
      std::printf("invalid view: %s\n", st.to_string().c_str());
      return 1;
    }
  std::printf("views: ContiguousKV<bf16> BSHD and PagedKV<bf16> HND (page %d, %d pages), batch %d, %d KV heads, "
              "head_dim %d, lengths {%d, %d}\n",
              kPageSize, num_pages, kBatch, kHeads, kHeadDim, lengths[0], lengths[1]);

  std::vector<kvsift::bfloat16_t> out_contig_k(elems), out_contig_v(elems), out_paged_k(elems), out_paged_v(elems);
  kvsift::Status st;
  const char* backend = "host (no GPU)";
#if defined(__CUDACC__)
  cudaDeviceProp prop{};
  if (have_gpu(&prop)) {
    static char name[300];
    std::snprintf(name, sizeof name, "CUDA on %s (sm_%d%d, %d SMs, %.0f GiB)", prop.name, prop.major, prop.minor,
                  prop.multiProcessorCount, prop.totalGlobalMem / 1073741824.0);
    backend = name;
    auto *dk = to_device(k), *dv = to_device(v), *dkp = to_device(k_pages), *dvp = to_device(v_pages);
    auto *dtable = to_device(table), *dlen = to_device(lengths);
    auto *o1 = to_device(out_contig_k), *o2 = to_device(out_contig_v), *o3 = to_device(out_paged_k), *o4 = to_device(out_paged_v);
    const auto exec = kvsift::cuda::Exec::for_current_device();
    auto contiguous = contiguous_host;
    contiguous.k = dk; contiguous.v = dv; contiguous.lengths = dlen;
    auto paged = paged_host;
    paged.k_pages = dkp; paged.v_pages = dvp; paged.block_table = dtable; paged.lengths = dlen;
    st = export_cache(exec, contiguous, o1, o2);
    if (st.ok()) st = export_cache(exec, paged, o3, o4);
    if (st.ok()) st = kvsift::from_cuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
    const std::size_t bytes = elems * sizeof(kvsift::bfloat16_t);
    cudaMemcpy(out_contig_k.data(), o1, bytes, cudaMemcpyDeviceToHost);
    cudaMemcpy(out_contig_v.data(), o2, bytes, cudaMemcpyDeviceToHost);
    cudaMemcpy(out_paged_k.data(), o3, bytes, cudaMemcpyDeviceToHost);
    cudaMemcpy(out_paged_v.data(), o4, bytes, cudaMemcpyDeviceToHost);
    for (void* p : {(void*)dk, (void*)dv, (void*)dkp, (void*)dvp, (void*)dtable, (void*)dlen, (void*)o1, (void*)o2, (void*)o3, (void*)o4})
      cudaFree(p);
  } else
#endif
  {
    const kvsift::host::Exec exec{};
    st = export_cache(exec, contiguous_host, out_contig_k.data(), out_contig_v.data());
    if (st.ok()) st = export_cache(exec, paged_host, out_paged_k.data(), out_paged_v.data());
  }
  std::printf("backend: %s\n", backend);
  if (!st.ok()) {
    std::printf("error: %s\n", st.to_string().c_str());
    return 1;
  }
  // Both views must yield the same live tokens.
  std::size_t mismatches = 0;
  for (int b = 0; b < kBatch; ++b)
    for (int h = 0; h < kHeads; ++h)
      for (int t = 0; t < lengths[b]; ++t)
        for (int i = 0; i < kHeadDim; ++i) {
          const std::size_t o = ((std::size_t(b) * kHeads + h) * kCapacity + t) * kHeadDim + i;
          mismatches += out_contig_k[o].bits != out_paged_k[o].bits || out_contig_v[o].bits != out_paged_v[o].bits;
        }
  std::printf("copy_kv_to_dense: contiguous and paged views agree on %d live tokens x %d heads: %s\n",
              lengths[0] + lengths[1], kHeads, mismatches == 0 ? "yes" : "NO");
  if (mismatches != 0) return 1;

#if defined(__CUDACC__)
  if (have_gpu(&prop)) {
    DeviceMemory mem;
    if (quickstart::run_compression_demo(kvsift::cuda::Exec::for_current_device(), mem, quickstart::SyntheticPrompt(32768), backend)) return 1;
    return quickstart::run_lycheedecode_demo(kvsift::cuda::Exec::for_current_device(), mem, 131072, backend);
  }
#endif
  HostMemory mem;
  if (quickstart::run_compression_demo(kvsift::host::Exec{}, mem, quickstart::SyntheticPrompt(2048), backend)) return 1;
  return quickstart::run_lycheedecode_demo(kvsift::host::Exec{}, mem, 8192, backend);
}
