#pragma once
// The GPU backend of the decoder: the members of HostBackend (host_backend.hpp) on one CUDA stream.
//
//   weights      bf16 on the device (nn.Linear layout), norms float
//   activations  float, as on the host; rounded to bf16 only as GEMM inputs
//   projections  decode (n <= 8 rows): the streaming GEMV of cuda_gemv.cuh; prefill: cuBLAS GemmEx,
//                bf16 x bf16 -> float with CUBLAS_COMPUTE_32F. Both round the float input to bf16.
//   KV cache     bf16 (KvType); kvsift's tensor-core attention reads it
//   attention    kvsift::cuda::* through Exec{stream}: model.hpp's unqualified calls resolve by ADL
//
// Integration rules an engine keeps too: every launch, copy and GEMM is queued on the backend's
// stream; nothing in a step allocates (cuBLAS gets a fixed workspace, the GEMM-input buffer grows
// during prefill only) or synchronizes, except `download` (the logits) and `synchronize` (timing).

#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <kvsift/kvsift.cuh>

#include "cuda_gemv.cuh"
#include "cuda_kernels.cuh"
#include "errors.hpp"

namespace minimal_decoder {

inline void cuda_check(cudaError_t err, const char* what) {
  if (err != cudaSuccess)
    throw DecoderError(std::string(what) + ": " + cudaGetErrorName(err) + " (" + cudaGetErrorString(err) + ")");
}

inline void cublas_check(cublasStatus_t st, const char* what) {
  if (st != CUBLAS_STATUS_SUCCESS) throw DecoderError(std::string(what) + ": cuBLAS status " + std::to_string(int(st)));
}

// True when a usable CUDA device is present (--device auto picks the GPU then).
inline bool cuda_device_present() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();  // clear the sticky "no device" error
    return false;
  }
  return n > 0;
}

// An owning, zeroed array in device memory (cudaMalloc aligns to 256 bytes, as kvsift's workspaces need).
template <class T>
class DeviceBuffer {
  static_assert(std::is_trivially_copyable<T>::value, "DeviceBuffer holds plain data");
  struct Free {
    void operator()(T* p) const { cudaFree(p); }
  };

 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(std::size_t n) : size_(n) {
    if (n == 0) return;
    void* p = nullptr;
    cuda_check(cudaMalloc(&p, n * sizeof(T)), "cudaMalloc");
    data_.reset(static_cast<T*>(p));
    // cudaMemset runs on the legacy default stream, which the backend's non-blocking stream does
    // not wait for: finish it here, or it could land after the first write through the stream.
    cuda_check(cudaMemset(p, 0, n * sizeof(T)), "cudaMemset");
    cuda_check(cudaStreamSynchronize(cudaStreamLegacy), "cudaMemset (synchronize)");
  }
  T* data() { return data_.get(); }
  const T* data() const { return data_.get(); }
  std::size_t size() const { return size_; }

 private:
  std::unique_ptr<T, Free> data_;
  std::size_t size_ = 0;
};

class CudaBackend {
 public:
  using Exec = kvsift::cuda::Exec;
  using KvType = kvsift::bfloat16_t;
  template <class T>
  using Buffer = DeviceBuffer<T>;
  // A weight matrix [rows, cols] in bf16 (nn.Linear layout: rows = out_features).
  struct Matrix {
    DeviceBuffer<__nv_bfloat16> data;
    int rows = 0, cols = 0;
  };

  explicit CudaBackend(int device = 0) {
    cuda_check(cudaSetDevice(device), "cudaSetDevice");
    cudaDeviceProp prop{};
    cuda_check(cudaGetDeviceProperties(&prop, device), "cudaGetDeviceProperties");
    name_ = std::string("GPU ") + prop.name + " (cuBLAS bf16, kvsift CUDA)";
    num_sms_ = prop.multiProcessorCount;
    cudaStream_t s = nullptr;
    cuda_check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreate");
    stream_.reset(s);
    cublasHandle_t h = nullptr;
    cublas_check(cublasCreate(&h), "cublasCreate");
    cublas_.reset(h);
    cublas_check(cublasSetStream(h, s), "cublasSetStream");
    // A fixed cuBLAS workspace: without it cuBLAS may allocate on first use of a kernel, which a
    // captured graph cannot do.
    cublas_ws_ = DeviceBuffer<unsigned char>(kCublasWorkspaceBytes);
    cublas_check(cublasSetWorkspace(h, cublas_ws_.data(), cublas_ws_.size()), "cublasSetWorkspace");
  }

  const char* name() const { return name_.c_str(); }
  Exec exec() const { return Exec::for_current_device(stream_.get()); }
  cudaStream_t stream() const { return stream_.get(); }
  int num_sms() const { return num_sms_; }

  template <class T>
  Buffer<T> alloc(std::size_t n) const {
    return Buffer<T>(n);
  }
  // Host -> device, queued on the stream. From pageable memory the call returns once the source has
  // been staged, so the caller may reuse it at once.
  template <class T>
  void upload(T* dst, const T* src, std::size_t n) const {
    if (n == 0) return;
    cuda_check(cudaMemcpyAsync(dst, src, n * sizeof(T), cudaMemcpyHostToDevice, stream()), "upload");
  }
  // Device -> host after the stream's pending work: the step's one synchronization (logits, lengths).
  template <class T>
  void download(T* dst, const T* src, std::size_t n) const {
    if (n == 0) return;
    cuda_check(cudaMemcpyAsync(dst, src, n * sizeof(T), cudaMemcpyDeviceToHost, stream()), "download");
    cuda_check(cudaStreamSynchronize(stream()), "download (stream synchronize)");
  }
  Matrix make_matrix(const std::vector<float>& w, int rows, int cols) const {
    std::vector<__nv_bfloat16> b(w.size());
    for (std::size_t i = 0; i < w.size(); ++i) b[i] = __float2bfloat16_rn(w[i]);
    Matrix m{DeviceBuffer<__nv_bfloat16>(w.size()), rows, cols};
    cuda_check(cudaMemcpy(m.data.data(), b.data(), b.size() * sizeof(__nv_bfloat16), cudaMemcpyHostToDevice),
               "weight upload");
    return m;
  }
  // A [rows, cols] matrix of N(0, scale^2) bf16 values generated on the device from `seed`: random
  // weights of shapes (llama3-8b) whose host generation would take minutes and 32 GB.
  Matrix random_matrix(int rows, int cols, float scale, std::uint64_t seed) const {
    Matrix m{DeviceBuffer<__nv_bfloat16>(std::size_t(rows) * cols), rows, cols};
    fill_normal(m.data.data(), std::int64_t(rows) * cols, seed, scale);
    return m;
  }
  template <class T>
  void fill_normal(T* out, std::int64_t n, std::uint64_t seed, float scale) const {
    kernels::fill_normal<<<kernels::blocks_for(n), kernels::kThreads, 0, stream()>>>(out, n, seed, scale);
    launched("fill_normal");
  }
  void synchronize() const { cuda_check(cudaStreamSynchronize(stream()), "cudaStreamSynchronize"); }

  // A decode step recorded once into a CUDA graph and replayed from then on: one launch per step
  // instead of ~20 per layer, so the GPU never waits for the host between kernels.
  class StepGraph {
   public:
    StepGraph() = default;
    StepGraph(const StepGraph&) = delete;
    StepGraph& operator=(const StepGraph&) = delete;
    ~StepGraph() { reset(); }
    // Forget the recording (the batch or the buffers it captured changed).
    void reset() {
      if (exec_) cudaGraphExecDestroy(exec_);
      exec_ = nullptr;
    }

   private:
    friend class CudaBackend;
    cudaGraphExec_t exec_ = nullptr;
  };
  // The first call captures `record` (everything it queues on the stream) into `graph` and launches
  // it; later calls only launch. Returns true when `record` ran, i.e. when its host-side effects
  // happened. Capture is thread-local and strict: an allocation or synchronisation inside `record`
  // fails loudly instead of being recorded wrongly.
  template <class F>
  bool replay(StepGraph& graph, F&& record) const {
    const bool recording = graph.exec_ == nullptr;
    if (recording) {
      cuda_check(cudaStreamBeginCapture(stream(), cudaStreamCaptureModeThreadLocal), "cudaStreamBeginCapture");
      cudaGraph_t g = nullptr;
      try {
        record();
      } catch (...) {
        if (cudaStreamEndCapture(stream(), &g) == cudaSuccess && g) cudaGraphDestroy(g);
        (void)cudaGetLastError();  // the capture's error is the exception's, not the next call's
        throw;
      }
      cuda_check(cudaStreamEndCapture(stream(), &g), "cudaStreamEndCapture");
      const cudaError_t err = cudaGraphInstantiate(&graph.exec_, g, 0);
      cudaGraphDestroy(g);
      cuda_check(err, "cudaGraphInstantiate");
    }
    cuda_check(cudaGraphLaunch(graph.exec_, stream()), "cudaGraphLaunch");
    return recording;
  }
  double now_ms() const {
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now().time_since_epoch()).count();
  }

  void embed(const std::int32_t* tokens, int n, const Matrix& table, float* out) const {
    if (n == 0) return;
    kernels::embed<<<unsigned(n), kernels::kThreads, 0, stream()>>>(tokens, n, table.data.data(), table.cols, out);
    launched("embed");
  }

  void rms_norm(const float* x, std::int64_t rows, int dim, const float* w, float eps, float* y) const {
    if (rows == 0) return;
    // dim is 64..16K: 128 threads for a head's q/k norm, 256 for the hidden state
    const int threads = dim <= 128 ? 128 : kernels::kThreads;
    kernels::rms_norm<<<unsigned(rows), unsigned(threads), 0, stream()>>>(x, dim, w, eps, y);
    launched("rms_norm");
  }

  // y[n, rows] = x[n, cols] W^T. Row-major W [out, in] is column-major W^T with ld = in, so in cuBLAS'
  // column-major terms C[out, n] = op_T(W)[out, in] * X[in, n], all leading dimensions contiguous.
  void linear(const float* x, int n, const Matrix& w, float* y) const {
    if (n == 0) return;
    if (gemv_applies(x, n, w)) {
      kernels::launch_gemv_bf16(w.data.data(), w.rows, w.cols, x, n, y, stream());
      launched("gemv_bf16");
      return;
    }
    const std::int64_t elems = std::int64_t(n) * w.cols;
    if (std::size_t(elems) > gemm_input_.size()) gemm_input_ = DeviceBuffer<__nv_bfloat16>(std::size_t(elems));  // prefill only
    kernels::to_bf16<<<kernels::blocks_for(elems), kernels::kThreads, 0, stream()>>>(x, elems, gemm_input_.data());
    launched("to_bf16");
    const float alpha = 1.f, beta = 0.f;
    cublas_check(cublasGemmEx(cublas_.get(), CUBLAS_OP_T, CUBLAS_OP_N, w.rows, n, w.cols, &alpha, w.data.data(), CUDA_R_16BF,
                              w.cols, gemm_input_.data(), CUDA_R_16BF, w.cols, &beta, y, CUDA_R_32F, w.rows,
                              CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                 "cublasGemmEx");
  }

  // Several projections of the same input (q/k/v, gate/up): one GEMV launch when it applies.
  void linear_shared_input(const float* x, int n, std::initializer_list<std::pair<const Matrix*, float*>> outputs) const {
    if (n == 0) return;
    bool fused = outputs.size() <= std::size_t(kernels::kGemvMaxTargets);
    for (const auto& o : outputs) fused = fused && gemv_applies(x, n, *o.first) && o.first->cols == outputs.begin()->first->cols;
    if (!fused) {
      for (const auto& o : outputs) linear(x, n, *o.first, o.second);
      return;
    }
    kernels::GemvTargets targets{};
    for (const auto& o : outputs) {
      targets.w[targets.count] = o.first->data.data();
      targets.rows[targets.count] = o.first->rows;
      targets.y[targets.count] = o.second;
      ++targets.count;
    }
    kernels::launch_gemv_bf16(targets, outputs.begin()->first->cols, x, n, stream());
    launched("gemv_bf16 (shared input)");
  }

  void silu_mul(float* gate, const float* up, std::int64_t n) const {
    if (n == 0) return;
    kernels::silu_mul<<<kernels::blocks_for(n), kernels::kThreads, 0, stream()>>>(gate, up, n);
    launched("silu_mul");
  }

  void add(float* x, const float* y, std::int64_t n) const {
    if (n == 0) return;
    kernels::add<<<kernels::blocks_for(n), kernels::kThreads, 0, stream()>>>(x, y, n);
    launched("add");
  }

  void add_rms_norm(float* x, const float* y, std::int64_t rows, int dim, const float* w, float eps, float* out) const {
    if (rows == 0) return;
    kernels::add_rms_norm<<<unsigned(rows), kernels::kThreads, 0, stream()>>>(x, y, dim, w, eps, out);
    launched("add_rms_norm");
  }

  void silu_mul_linear(float* gate, const float* up, int n, const Matrix& w, float* y) const {
    if (n == 0) return;
    if (gemv_applies(gate, n, w) && reinterpret_cast<std::uintptr_t>(up) % 16 == 0) {
      kernels::launch_gemv_bf16(w.data.data(), w.rows, w.cols, gate, n, y, stream(), up);
      launched("gemv_bf16 (SwiGLU)");
      return;
    }
    silu_mul(gate, up, std::int64_t(n) * w.cols);
    linear(gate, n, w, y);
  }

  void rope(float* x, const std::int32_t* positions, int n, int heads, int head_dim, float theta) const {
    if (n == 0) return;
    kernels::rope<<<kernels::blocks_for(std::int64_t(n) * (head_dim / 2)), kernels::kThreads, 0, stream()>>>(
        x, positions, n, heads, head_dim, theta);
    launched("rope");
  }

  template <class View>  // kvsift::ContiguousKV or PagedKV of KvType
  void store_kv(const float* k, const float* v, int n, const std::int32_t* seq, const std::int32_t* slot,
                const View& cache) const {
    if (n == 0) return;
    const std::int64_t elems = std::int64_t(n) * cache.num_kv_heads * cache.head_dim;
    kernels::store_kv<<<kernels::blocks_for(elems), kernels::kThreads, 0, stream()>>>(k, v, n, seq, slot, cache);
    launched("store_kv");
  }

  void scatter_rows(const float* src, int n, std::int64_t row_elems, const std::int32_t* dst_row, float* dst) const {
    if (n == 0) return;
    kernels::scatter_rows<<<kernels::blocks_for(std::int64_t(n) * row_elems), kernels::kThreads, 0, stream()>>>(
        src, n, row_elems, dst_row, dst);
    launched("scatter_rows");
  }

 private:
  static constexpr std::size_t kCublasWorkspaceBytes = std::size_t(32) << 20;  // cuBLAS' own recommendation for Hopper

  struct DestroyStream {
    void operator()(cudaStream_t s) const { cudaStreamDestroy(s); }
  };
  struct DestroyCublas {
    void operator()(cublasHandle_t h) const { cublasDestroy(h); }
  };

  // The decode GEMV takes a few rows of 16-byte aligned float input and 8-element weight chunks.
  static bool gemv_applies(const float* x, int n, const Matrix& w) {
    return n <= kernels::kGemvMaxRows && w.cols % 8 == 0 && reinterpret_cast<std::uintptr_t>(x) % 16 == 0;
  }

  // A bad launch configuration shows up here without synchronizing.
  static void launched(const char* kernel) { cuda_check(cudaGetLastError(), kernel); }

  std::string name_;
  int num_sms_ = 0;
  // Destruction runs bottom-up: the cuBLAS handle goes before the stream it was bound to.
  std::unique_ptr<std::remove_pointer_t<cudaStream_t>, DestroyStream> stream_;
  DeviceBuffer<unsigned char> cublas_ws_;
  std::unique_ptr<std::remove_pointer_t<cublasHandle_t>, DestroyCublas> cublas_;
  mutable DeviceBuffer<__nv_bfloat16> gemm_input_;  // the bf16 copy of a GEMM's float input
};

}  // namespace minimal_decoder
