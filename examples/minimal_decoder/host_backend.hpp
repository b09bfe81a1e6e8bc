#pragma once
// The CPU backend of the decoder: host memory, float weights and activations, float KV cache, and
// kvsift's host reference (kvsift::host::Exec) for attention and compression.
//
// The model (model.hpp) is written once against this small interface; a CUDA backend implements the
// same members (cuBLAS bf16 GEMMs with fp32 accumulation, a few elementwise kernels, cuda::Exec).
// Everything model-specific that is not attention is one of these eight operations.

#include <algorithm>
#include <chrono>
#include <cmath>
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

#include <kvsift/kvsift.hpp>

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

// Rotation angle of RoPE pair i at `position`, computed as Hugging Face does (float32 inverse
// frequency and product), so a checkpoint sees the positions it was trained with.
inline float rope_angle(int position, int pair, int head_dim, float theta) {
  const float inv_freq = 1.f / std::pow(theta, float(2 * pair) / float(head_dim));
  return float(position) * inv_freq;
}

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
  Exec exec() const { return Exec{}; }
  int num_sms() const { return 0; }  // sizes kvsift's GPU split plan; unused by the host reference

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
  Matrix make_matrix(const std::vector<float>& w, int rows, int cols) const {
    Matrix m{Buffer<float>(w.size()), rows, cols};
    std::copy(w.begin(), w.end(), m.data.data());
    return m;
  }
  void synchronize() const {}
  // The CUDA backend records a decode step into a graph once and replays it; here it simply runs.
  struct StepGraph {
    void reset() {}
  };
  template <class F>
  bool replay(StepGraph&, F&& record) const {
    record();
    return true;
  }
  double now_ms() const {
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now().time_since_epoch()).count();
  }

  // out[i] = table[tokens[i]]
  void embed(const std::int32_t* tokens, int n, const Matrix& table, float* out) const {
    for (int i = 0; i < n; ++i)
      std::copy_n(table.data.data() + std::int64_t(tokens[i]) * table.cols, table.cols, out + std::int64_t(i) * table.cols);
  }

  // y = x / rms(x) * w, per row of `dim` elements; y may alias x.
  void rms_norm(const float* x, std::int64_t rows, int dim, const float* w, float eps, float* y) const {
    for (std::int64_t r = 0; r < rows; ++r) {
      const float* xr = x + r * dim;
      double ss = 0;
      for (int i = 0; i < dim; ++i) ss += double(xr[i]) * xr[i];
      const float inv = 1.f / std::sqrt(float(ss / dim) + eps);
      float* yr = y + r * dim;
      for (int i = 0; i < dim; ++i) yr[i] = xr[i] * inv * w[i];
    }
  }

  // y[n, rows] = x[n, cols] W^T. Four tokens share each row of W while it is in cache; eight
  // independent partial sums let the compiler vectorise the dot product without -ffast-math.
  void linear(const float* x, int n, const Matrix& w, float* y) const {
    const int in = w.cols, out = w.rows;
    for (int t0 = 0; t0 < n; t0 += 4) {
      const int nt = std::min(4, n - t0);
      for (int o = 0; o < out; ++o) {
        const float* wr = w.data.data() + std::int64_t(o) * in;
        for (int t = 0; t < nt; ++t) {
          const float* xr = x + std::int64_t(t0 + t) * in;
          float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
          int i = 0;
          for (; i + 8 <= in; i += 8)
            for (int j = 0; j < 8; ++j) acc[j] += xr[i + j] * wr[i + j];
          float s = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
          for (; i < in; ++i) s += xr[i] * wr[i];
          y[std::int64_t(t0 + t) * out + o] = s;
        }
      }
    }
  }

  // Several projections of the same input (q/k/v, gate/up): y_i = x W_i^T (one launch on the GPU).
  void linear_shared_input(const float* x, int n, std::initializer_list<std::pair<const Matrix*, float*>> outputs) const {
    for (const auto& o : outputs) linear(x, n, *o.first, o.second);
  }

  // gate = silu(gate) * up (SwiGLU)
  void silu_mul(float* gate, const float* up, std::int64_t n) const {
    for (std::int64_t i = 0; i < n; ++i) gate[i] = gate[i] / (1.f + std::exp(-gate[i])) * up[i];
  }

  // x += y
  void add(float* x, const float* y, std::int64_t n) const {
    for (std::int64_t i = 0; i < n; ++i) x[i] += y[i];
  }

  // x += y, then out = rms_norm(x) (one fused kernel on the GPU); out may alias y.
  void add_rms_norm(float* x, const float* y, std::int64_t rows, int dim, const float* w, float eps, float* out) const {
    add(x, y, rows * dim);
    rms_norm(x, rows, dim, w, eps, out);
  }

  // y = (silu(gate) * up) W^T, the SwiGLU down projection (one fused kernel on the GPU); gate is overwritten.
  void silu_mul_linear(float* gate, const float* up, int n, const Matrix& w, float* y) const {
    silu_mul(gate, up, std::int64_t(n) * w.cols);
    linear(gate, n, w, y);
  }

  // RoPE in place on x [n, heads, head_dim], "rotate half": pair i is (x[i], x[i + head_dim/2]).
  void rope(float* x, const std::int32_t* positions, int n, int heads, int head_dim, float theta) const {
    const int half = head_dim / 2;
    for (int t = 0; t < n; ++t)
      for (int i = 0; i < half; ++i) {
        const double a = rope_angle(positions[t], i, head_dim, theta);
        const float c = float(std::cos(a)), s = float(std::sin(a));
        for (int h = 0; h < heads; ++h) {
          float* r = x + (std::int64_t(t) * heads + h) * head_dim;
          const float x1 = r[i], x2 = r[i + half];
          r[i] = x1 * c - x2 * s;
          r[i + half] = x2 * c + x1 * s;
        }
      }
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

  // out[i] = N(0, scale^2) draws from `seed` (--synthetic-prefill's random K/V and window queries).
  template <class T>
  void fill_normal(T* out, std::int64_t n, std::uint64_t seed, float scale) const {
    std::mt19937_64 rng(seed);
    std::normal_distribution<float> dist(0.f, scale);
    for (std::int64_t i = 0; i < n; ++i) out[i] = T(dist(rng));
  }

  // dst row dst_row[i] = src row i, for rows with dst_row[i] >= 0.
  void scatter_rows(const float* src, int n, std::int64_t row_elems, const std::int32_t* dst_row, float* dst) const {
    for (int i = 0; i < n; ++i)
      if (dst_row[i] >= 0) std::copy_n(src + i * row_elems, row_elems, dst + dst_row[i] * row_elems);
  }
};

}  // namespace minimal_decoder
