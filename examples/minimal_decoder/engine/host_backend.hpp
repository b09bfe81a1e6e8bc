#pragma once
// The CPU backend of the decoder: host memory, float weights and activations, float KV cache, and
// kvsift's host reference (kvsift::host::Exec) for attention and compression.
//
// The model (decoder.hpp) is written once against this small interface; the CUDA backend implements
// the same members (cuBLAS bf16 GEMMs with fp32 accumulation, a few elementwise kernels, cuda::Exec).
// Everything model-specific that is not attention is one of these operations; the arithmetic is in
// host_backend.cpp, the templates (buffers, copies, the KV store through a kvsift view) stay here.

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <memory>
#include <new>
#include <random>
#include <type_traits>
#include <utility>
#include <vector>

#include <kvsift/core/dtype.hpp>
#include <kvsift/core/exec.hpp>

namespace minimal_decoder {

// An owning, zeroed array in the backend's memory: host memory here, 256-byte aligned because
// kvsift's workspaces require it on every backend.
template <class T>
class HostBuffer {
  static_assert(std::is_trivially_copyable<T>::value, "HostBuffer holds plain data");
  struct Free {
    void operator()(T* p) const { std::free(p); }
  };

 public:
  HostBuffer() = default;
  explicit HostBuffer(std::size_t n) : size_(n) {
    if (n == 0) return;
    const std::size_t bytes = (n * sizeof(T) + 255) / 256 * 256;
    data_.reset(static_cast<T*>(std::aligned_alloc(256, bytes)));
    if (!data_) throw std::bad_alloc();
    std::memset(static_cast<void*>(data_.get()), 0, bytes);
  }
  T* data() { return data_.get(); }
  const T* data() const { return data_.get(); }
  std::size_t size() const { return size_; }

 private:
  std::unique_ptr<T, Free> data_;
  std::size_t size_ = 0;
};

struct HostBackend {
  using Exec = kvsift::host::Exec;
  using KvType = float;  // the host reference accumulates in double; float keys keep it exact enough
  template <class T>
  using Buffer = HostBuffer<T>;
  // A weight matrix [rows, cols] (nn.Linear layout: rows = out_features).
  struct Matrix {
    HostBuffer<float> data;
    int rows = 0, cols = 0;
  };

  const char* name() const { return "CPU (kvsift::host reference)"; }
  // No HBM ceiling to divide by: the decoder prints a roofline on the CPU only for --roofline-tbps.
  double streaming_read_tbps() const { return 0; }
  // Makes this backend's device the calling thread's (a tensor-parallel rank's thread calls it before
  // its work); nothing to do on the CPU.
  void make_current() const {}
  Exec exec() const { return Exec{}; }
  // Work that may run beside the step's own (LycheeDecode's top-k handoff, decoder.hpp): the CUDA
  // backend queues it on a second stream between fork_side() and join_side(); here everything runs
  // in call order, so the side is the same Exec and the fork and join are nothing.
  Exec side_exec() const { return Exec{}; }
  void fork_side() const {}
  void join_side() const {}

  template <class T>
  Buffer<T> alloc(std::size_t n) const {
    return Buffer<T>(n);
  }
  template <class T>
  void upload(T* dst, const T* src, std::size_t n) const {
    std::copy(src, src + n, dst);
  }
  template <class T>
  void download(T* dst, const T* src, std::size_t n) const {
    std::copy(src, src + n, dst);
  }
  Matrix make_matrix(const std::vector<float>& w, int rows, int cols) const;
  void synchronize() const {}
  // Bytes of device memory in use (--soak compares it across a run); -1: the CPU has no such count.
  std::int64_t device_memory_in_use() const { return -1; }
  // The CUDA backend records a decode step into a graph once and replays it; here it simply runs.
  static constexpr bool kRecordsGraphs = false;
  struct StepGraph {
    void reset() {}
  };
  template <class F>
  bool replay(StepGraph&, F&& record) const {
    record();
    return true;
  }
  double now_ms() const;
  // Wall time of `work` in ms: --profile's clock on this backend (engine/step_profile.hpp).
  template <class F>
  double elapsed_ms(F&& work) const {
    const double t0 = now_ms();
    work();
    return now_ms() - t0;
  }
  static constexpr const char* kClock = "std::chrono";

  // out[i] = table[tokens[i]]
  void embed(const std::int32_t* tokens, int n, const Matrix& table, float* out) const;
  // y = x / rms(x) * w, per row of `dim` elements; y may alias x.
  void rms_norm(const float* x, std::int64_t rows, int dim, const float* w, float eps, float* y) const;
  // y[n, rows] = x[n, cols] W^T
  void linear(const float* x, int n, const Matrix& w, float* y) const;
  // The CUDA backend's room for linear's inputs, made before a step is captured; nothing on the host.
  void reserve_linear_input(std::int64_t /*elements*/) const {}
  // Several projections of the same input (q/k/v, gate/up): y_i = x W_i^T (one launch on the GPU).
  void linear_shared_input(const float* x, int n, std::initializer_list<std::pair<const Matrix*, float*>> outputs) const;
  // x_out = x + delta (x itself when delta is null), then y_i = rms_norm(x_out) W_i^T: the norm before
  // q/k/v and before gate/up with its projections (one GEMV launch on the GPU where it applies, which
  // derives the normalized rows itself). x_out must not alias x or delta; `normed` receives the
  // normalized rows where the backend materializes them, and may alias delta.
  void norm_linear_shared_input(const float* x, const float* delta, float* x_out, int n, int dim, const float* w, float eps,
                                float* normed, std::initializer_list<std::pair<const Matrix*, float*>> outputs) const;
  // gate = silu(gate) * up (SwiGLU)
  void silu_mul(float* gate, const float* up, std::int64_t n) const;
  // x += y
  void add(float* x, const float* y, std::int64_t n) const;
  // x += y, then out = rms_norm(x) (one fused kernel on the GPU); out may alias y.
  void add_rms_norm(float* x, const float* y, std::int64_t rows, int dim, const float* w, float eps, float* out) const;
  // y = (silu(gate) * up) W^T, the SwiGLU down projection (one fused kernel on the GPU); gate is overwritten.
  void silu_mul_linear(float* gate, const float* up, int n, const Matrix& w, float* y) const;
  // The MLP after its norm: norm_linear_shared_input's x_out and gate = rms_norm(x_out) W_gate^T,
  // up = ... W_up^T, then silu_mul_linear(gate, up, n, W_down, y). gate and up are scratch
  // [n, W_gate.rows] (overwritten, or on the GPU's SwiGLU pairs partly unused); y may alias delta and
  // normed.
  void norm_swiglu_mlp(const float* x, const float* delta, float* x_out, int n, int dim, const float* w, float eps, float* normed,
                       const Matrix& w_gate, const Matrix& w_up, const Matrix& w_down, float* gate, float* up, float* y) const;
  // RoPE in place on x [n, heads, head_dim], "rotate half": pair i is (x[i], x[i + head_dim/2]).
  // RoPE on q [n, q_heads, head_dim] and k [n, k_heads, head_dim] in place (one launch on the GPU).
  void rope(float* q, int q_heads, float* k, int k_heads, const std::int32_t* positions, int n, int head_dim, float theta) const;
  // dst row dst_row[i] = src row i, for rows with dst_row[i] >= 0.
  void scatter_rows(const float* src, int n, std::int64_t row_elems, const std::int32_t* dst_row, float* dst) const;

  // kvsift's host attention reads every KV dtype, fp8 included.
  template <class KT>
  static constexpr bool attends_kv() { return true; }
  // Whether the decoder hands RoPE to kvsift::store_kv (one call for the rotation and the append) or
  // runs rope() before it (the same arithmetic and bits on the CPU; decoder.hpp, layer_forward).
  void set_rope_in_store(bool on) { rope_in_store_ = on; }
  bool rope_in_store() const { return rope_in_store_; }
  static constexpr const char* kFp8AttentionMissing = "";
  // y = bf16(x) and back: the query and output rows of attention over an fp8 cache.
  void narrow_to_bf16(const float* x, std::int64_t n, kvsift::bfloat16_t* y) const {
    for (std::int64_t i = 0; i < n; ++i) y[i] = kvsift::from_float<kvsift::bfloat16_t>(x[i]);
  }
  void widen_from_bf16(const kvsift::bfloat16_t* x, std::int64_t n, float* y) const {
    for (std::int64_t i = 0; i < n; ++i) y[i] = kvsift::to_float(x[i]);
  }

  // Writes token i's K and V rows ([n, kv_heads * head_dim]) to cache slot slot[i] of sequence seq[i].
  template <class View>  // kvsift::ContiguousKV or PagedKV of KvType
  void store_kv(const float* k, const float* v, int n, const std::int32_t* seq, const std::int32_t* slot,
                const View& cache) const {
    const int D = cache.head_dim;
    for (int i = 0; i < n; ++i)
      for (int h = 0; h < cache.num_kv_heads; ++h) {
        const std::int64_t src = (std::int64_t(i) * cache.num_kv_heads + h) * D;
        std::copy_n(k + src, D, cache.k_row(seq[i], h, slot[i]));
        std::copy_n(v + src, D, cache.v_row(seq[i], h, slot[i]));
      }
  }

  // out[i] = N(0, scale^2) draws from `seed`, rounded to T (--synthetic-prefill's random K/V, fp8
  // codes included, and window queries).
  template <class T>
  void fill_normal(T* out, std::int64_t n, std::uint64_t seed, float scale) const {
    std::mt19937_64 rng(seed);
    std::normal_distribution<float> dist(0.f, scale);
    for (std::int64_t i = 0; i < n; ++i) out[i] = kvsift::from_float<T>(dist(rng));
  }
  // out[i] = value (--synthetic-prefill's fp8 scales).
  void fill_value(float* out, std::int64_t n, float value) const { std::fill_n(out, n, value); }

  bool rope_in_store_ = true;
};

}  // namespace minimal_decoder
